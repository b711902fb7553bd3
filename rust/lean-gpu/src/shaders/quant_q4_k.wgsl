// Q4_K (144 bytes): f16 d, f16 dmin, scales[12] (eight 6-bit scale/min pairs), qs[128].
// Sub-block s (32 elements) is nibble s % 2 of qs[32(s/2) .. 32(s/2) + 32];
// weight = (d * scale) * q - (dmin * min).
// Part p (16 per block): bytes qs[32c + 8r .. +8] with c = p / 4, r = p % 4: their low nibbles
// are elements 64c + 8r + j of sub-block 2c, their high nibbles the same of sub-block 2c + 1.
const BLOCK_LEN: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;
const PARTS: u32 = 16u;

// ggml's get_scale_min_k4 for sub-block j: (scale, min).
fn scale_min_k4(blk: u32, j: u32) -> vec2<u32> {
    let s = blk + 4u;
    if (j < 4u) {
        return vec2<u32>(load_u8(s + j) & 63u, load_u8(s + j + 4u) & 63u);
    }
    let sc = (load_u8(s + j + 4u) & 0xFu) | ((load_u8(s + j - 4u) >> 6u) << 4u);
    let mn = (load_u8(s + j + 4u) >> 4u) | ((load_u8(s + j) >> 6u) << 4u);
    return vec2<u32>(sc, mn);
}

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    let d = load_f16(blk);
    let dmin = load_f16(blk + 2u);
    let c = part / 4u;
    let r = part % 4u;
    let sm_lo = scale_min_k4(blk, 2u * c);
    let sm_hi = scale_min_k4(blk, 2u * c + 1u);
    let dl_lo = d * f32(sm_lo.x);
    let ml_lo = dmin * f32(sm_lo.y);
    let dl_hi = d * f32(sm_hi.x);
    let ml_hi = dmin * f32(sm_hi.y);
    var acc = 0.0;
    for (var k = 0u; k < 2u; k++) {
        let qs = load_u32(blk + 16u + 32u * c + 8u * r + 4u * k);
        let e = 64u * c + 8u * r + 4u * k;
        for (var j = 0u; j < 4u; j++) {
            let byte = (qs >> (8u * j)) & 0xFFu;
            acc += (dl_lo * f32(byte & 0xFu) - ml_lo) * x[xi + e + j];
            acc += (dl_hi * f32(byte >> 4u) - ml_hi) * x[xi + e + 32u + j];
        }
    }
    return acc;
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    let s = e / 32u;
    let sm = scale_min_k4(blk, s);
    let q = (load_u8(blk + 16u + 32u * (s / 2u) + e % 32u) >> (4u * (s % 2u))) & 0xFu;
    return (load_f16(blk) * f32(sm.x)) * f32(q) - load_f16(blk + 2u) * f32(sm.y);
}
