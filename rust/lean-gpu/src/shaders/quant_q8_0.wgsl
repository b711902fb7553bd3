// Q8_0 (34 bytes): f16 d, i8 qs[32]; weight = q * d. Part p: elements 8p..8p+8.
const BLOCK_LEN: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;
const PARTS: u32 = 4u;

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    let d = load_f16(blk);
    var acc = 0.0;
    for (var k = 0u; k < 2u; k++) {
        let qs = i32(load_u32(blk + 2u + 8u * part + 4u * k));
        let e = 8u * part + 4u * k;
        for (var j = 0u; j < 4u; j++) {
            // extractBits on i32 sign-extends: the byte as an i8
            acc += (f32(extractBits(qs, 8u * j, 8u)) * d) * x[xi + e + j];
        }
    }
    return acc;
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    return f32(extractBits(i32(load_u8(blk + 2u + e)), 0u, 8u)) * load_f16(blk);
}
