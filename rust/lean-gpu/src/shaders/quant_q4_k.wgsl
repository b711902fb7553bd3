// Q4_K (144 bytes, kept as in the file): f16 d, f16 dmin, scales[12] (eight 6-bit scale/min
// pairs), qs[128]. A unit is sub-block s (32 elements): nibble s % 2 of qs[32(s/2) ..+ 32]
// (element l in byte l); weight = (d * scale) * q - (dmin * min). Blocks start at multiples
// of 4 bytes, so qs are whole words.

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

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

// acc + the dot of the 4 nibbles of `quads` (bytes) with xv; weights dl * q - ml rounded once,
// as the reference dequantizes them (dl * q is exact)
fn q4_k_word(acc: f32, quads: u32, dl: f32, ml: f32, xv: vec4<f32>) -> f32 {
    let q = magic_bytes(quads & NIBBLES) - vec4<f32>(8388608.0);
    return dot_acc(acc, fma(vec4<f32>(dl), q, vec4<f32>(-ml)), xv);
}

// Slice c of sub-block sub: bytes qs[32(sub / 2) + 8c ..+ 8].
fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    let blk = row * p.part.row_bytes + (s / 32u) * 144u;
    let sub = (s / 4u) % 8u;
    let sm = scale_min_k4(blk, sub);
    let dl = load_f16(blk) * f32(sm.x);
    let ml = load_f16(blk + 2u) * f32(sm.y);
    let q = (blk + 16u + 32u * (sub / 2u) + 8u * (s % 4u)) / 4u;
    let shift = 4u * (sub % 2u);
    let t = q4_k_word(0.0, w[q] >> shift, dl, ml, xs[0]);
    return q4_k_word(t, w[q + 1u] >> shift, dl, ml, xs[1]);
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this):
// slice s % 4 of sub-block (s / 4) % 8, read as slice_dot reads it.
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    let blk = row * p.part.row_bytes + (s / 32u) * 144u;
    let sub = (s / 4u) % 8u;
    let sm = scale_min_k4(blk, sub);
    let dl = vec4<f32>(load_f16(blk) * f32(sm.x));
    let ml = vec4<f32>(load_f16(blk + 2u) * f32(sm.y));
    let q = (blk + 16u + 32u * (sub / 2u) + 8u * (s % 4u)) / 4u;
    let shift = 4u * (sub % 2u);
    let lo = magic_bytes((w[q] >> shift) & NIBBLES) - vec4<f32>(8388608.0);
    let hi = magic_bytes((w[q + 1u] >> shift) & NIBBLES) - vec4<f32>(8388608.0);
    return array<vec4<f32>, 2>(fma(dl, lo, -ml), fma(dl, hi, -ml));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let blk = row * p.part.row_bytes + (e / 256u) * 144u;
    let s = (e % 256u) / 32u;
    let sm = scale_min_k4(blk, s);
    let q = (load_u8(blk + 16u + 32u * (s / 2u) + e % 32u) >> (4u * (s % 2u))) & 0xFu;
    return (load_f16(blk) * f32(sm.x)) * f32(q) - load_f16(blk + 2u) * f32(sm.y);
}
