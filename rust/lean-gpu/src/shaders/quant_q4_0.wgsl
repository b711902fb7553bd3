// Q4_0 (18 bytes): f16 d, qs[16]. Element i < 16 is the low nibble of qs[i], 16 + i the high
// one; weight = d * (q - 8). Part p: qs[4p..4p+4] -> elements 4p..4p+4 and 20p..
const BLOCK_LEN: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;
const PARTS: u32 = 4u;

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    let d = load_f16(blk);
    let qs = load_u32(blk + 2u + 4u * part);
    var acc = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let byte = (qs >> (8u * j)) & 0xFFu;
        let e = 4u * part + j;
        acc += (d * f32(i32(byte & 0xFu) - 8)) * x[xi + e];
        acc += (d * f32(i32(byte >> 4u) - 8)) * x[xi + 16u + e];
    }
    return acc;
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    let byte = load_u8(blk + 2u + e % 16u);
    let q = select(byte & 0xFu, byte >> 4u, e >= 16u);
    return load_f16(blk) * f32(i32(q) - 8);
}
