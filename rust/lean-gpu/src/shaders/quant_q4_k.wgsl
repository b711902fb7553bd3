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

// Dot of slice s of part row `row` with its activations xs: of its weights, as slice_weights
// rounds them.
fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    let ws = slice_weights(row, s);
    return dot_acc(dot_acc(0.0, ws[0], xs[0]), ws[1], xs[1]);
}

// The 8 weights of slice s of part row `row` (also the prefill matmul's tiles): slice s % 4 of
// sub-block (s / 4) % 8, bytes qs[32(sub / 2) + 8(s % 4) ..+ 8]; dl * q - ml rounded once, as
// the reference dequantizes them (dl * q is exact).
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
