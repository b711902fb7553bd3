// Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), i8 scales[16], f16 d.
// In half h, element 128h + e has nibble e / 64 of ql[64h + e % 64] and bits 2(e / 32).. of
// qh[32h + e % 32]; weight = (d * scale[e / 16 + 8h]) * (q - 32).
// Part p (16 per block): h = p / 8, elements e = 16r .. 16r + 16 with r = p % 8, which share
// one nibble, one qh bit pair and one scale.
const BLOCK_LEN: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;
const PARTS: u32 = 16u;

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    let h = part / 8u;
    let r = part % 8u;
    let d = load_f16(blk + 208u);
    let scale = extractBits(i32(load_u8(blk + 192u + 8u * h + r)), 0u, 8u);
    let dl = d * f32(scale);
    let ql_at = blk + 64u * h + 16u * (r % 4u);
    let qh_at = blk + 128u + 32u * h + 16u * (r % 2u);
    let ql_shift = 4u * (r / 4u);
    let qh_shift = 2u * (r / 2u);
    let e0 = 128u * h + 16u * r;
    var acc = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let ql = load_u32(ql_at + 4u * k);
        let qh = load_u32(qh_at + 4u * k);
        for (var j = 0u; j < 4u; j++) {
            let low = (ql >> (8u * j + ql_shift)) & 0xFu;
            let high = (qh >> (8u * j + qh_shift)) & 3u;
            let q = i32(low | (high << 4u)) - 32;
            acc += (dl * f32(q)) * x[xi + e0 + 4u * k + j];
        }
    }
    return acc;
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    let h = e / 128u;
    let i = e % 128u;
    let low = (load_u8(blk + 64u * h + i % 64u) >> (4u * (i / 64u))) & 0xFu;
    let high = (load_u8(blk + 128u + 32u * h + i % 32u) >> (2u * (i / 32u))) & 3u;
    let scale = extractBits(i32(load_u8(blk + 192u + e / 16u)), 0u, 8u);
    return (load_f16(blk + 208u) * f32(scale)) * f32(i32(low | (high << 4u)) - 32);
}
