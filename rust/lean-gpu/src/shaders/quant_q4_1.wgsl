// Q4_1 (20 bytes, kept as in the file): f16 d, f16 m, qs[16] (element i < 16 in the low
// nibble of qs[i], 16 + i in the high one); a unit is one block; weight = d * q + m. Blocks
// start at multiples of 4 bytes, so qs are whole words.

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Dot of slice s of part row `row` with its activations xs: of its weights, as slice_weights
// rounds them.
fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    let ws = slice_weights(row, s);
    return dot_acc(dot_acc(0.0, ws[0], xs[0]), ws[1], xs[1]);
}

// The 8 weights of slice s of part row `row` (also the prefill matmul's tiles): slice c of a
// block is the low (c < 2) or high nibbles of qs[8(c % 2) ..+ 8]; d * q + m rounded once, as
// the reference dequantizes them (d * q is exact).
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    let blk = row * p.part.row_bytes + (s / 4u) * 20u;
    let c = s % 4u;
    let d = vec4<f32>(load_f16(blk));
    let m = vec4<f32>(load_f16(blk + 2u));
    let q = blk / 4u + 1u + 2u * (c % 2u);
    let shift = 4u * (c / 2u);
    let lo = magic_bytes((w[q] >> shift) & NIBBLES) - vec4<f32>(8388608.0);
    let hi = magic_bytes((w[q + 1u] >> shift) & NIBBLES) - vec4<f32>(8388608.0);
    return array<vec4<f32>, 2>(fma(d, lo, m), fma(d, hi, m));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let blk = row * p.part.row_bytes + (e / 32u) * 20u;
    let byte = load_u8(blk + 4u + e % 16u);
    let q = select(byte & 0xFu, byte >> 4u, e % 32u >= 16u);
    return load_f16(blk) * f32(q) + load_f16(blk + 2u);
}
