// Q4_1 (20 bytes): f16 d, f16 m, qs[16] (nibbles as Q4_0); weight = d * q + m.
const BLOCK_LEN: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;
const PARTS: u32 = 4u;

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    let d = load_f16(blk);
    let m = load_f16(blk + 2u);
    let qs = load_u32(blk + 4u + 4u * part);
    var acc = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let byte = (qs >> (8u * j)) & 0xFFu;
        let e = 4u * part + j;
        acc += (d * f32(byte & 0xFu) + m) * x[xi + e];
        acc += (d * f32(byte >> 4u) + m) * x[xi + 16u + e];
    }
    return acc;
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    let byte = load_u8(blk + 4u + e % 16u);
    let q = select(byte & 0xFu, byte >> 4u, e >= 16u);
    return load_f16(blk) * f32(q) + load_f16(blk + 2u);
}
