// Q4_0, repacked at upload (weights.rs): one word of quants per slice (byte j: element j in the
// low nibble, element 4 + j in the high one), then the f16 scales d of the units (blocks) from
// word p.part.region1. weight = d * (q - 8).

// 2^23 + 8: magic_bytes(q) minus this is q - 8, exactly.
const Q4_0_BIAS: vec4<f32> = vec4<f32>(8388616.0);

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Slice s of part row `row`: its quants q - 8 and d.
fn slice_quants(row: u32, s: u32) -> Slice {
    let i = row * row_slices() + s;
    let q = w[i];
    return Slice(f16_at(p.part.region1, i / 4u), array<vec4<f32>, 2>(
        magic_bytes(q & NIBBLES) - Q4_0_BIAS, magic_bytes((q >> 4u) & NIBBLES) - Q4_0_BIAS));
}

// Dot of slice s of part row `row` with its activations xs (d factored out of the slice's sum).
fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    return scaled_dot(slice_quants(row, s), xs);
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this).
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    return scaled_weights(slice_quants(row, s));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let i = row * row_slices() + e / 8u;
    let j = e % 8u;
    let q = (w[i] >> (8u * (j % 4u) + 4u * (j / 4u))) & 0xFu;
    return f16_at(p.part.region1, i / 4u) * f32(i32(q) - 8);
}
