// Q5_0 (22 bytes): f16 d, u32 qh (bit i = fifth bit of element i), qs[16] (low nibbles as
// Q4_0); weight = d * (q - 16).
const BLOCK_LEN: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;
const PARTS: u32 = 4u;

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    let d = load_f16(blk);
    let qh = load_u32(blk + 2u);
    let qs = load_u32(blk + 6u + 4u * part);
    var acc = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let byte = (qs >> (8u * j)) & 0xFFu;
        let e = 4u * part + j;
        let lo = (byte & 0xFu) | (((qh >> e) & 1u) << 4u);
        let hi = (byte >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
        acc += (d * f32(i32(lo) - 16)) * x[xi + e];
        acc += (d * f32(i32(hi) - 16)) * x[xi + 16u + e];
    }
    return acc;
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    let byte = load_u8(blk + 6u + e % 16u);
    let nibble = select(byte & 0xFu, byte >> 4u, e >= 16u);
    let q = nibble | (((load_u32(blk + 2u) >> e) & 1u) << 4u);
    return load_f16(blk) * f32(i32(q) - 16);
}
