// Q8_0, repacked at upload (weights.rs): each q + 128 as an unsigned byte, in two planes of one
// word per slice: elements 0..4 of every slice, then from word p.part.region1 elements 4..8;
// then the f16 scales d of the units (blocks) from word region2. weight = d * q.

// 2^23 + 128: magic_bytes(q + 128) minus this is q, exactly.
const Q8_0_BIAS: vec4<f32> = vec4<f32>(8388736.0);

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Slice s of part row `row`: its quants q and d.
fn slice_quants(row: u32, s: u32) -> Slice {
    let i = row * row_slices() + s;
    return Slice(f16_at(p.part.region2, i / 4u), array<vec4<f32>, 2>(
        magic_bytes(w[i]) - Q8_0_BIAS, magic_bytes(w[p.part.region1 + i]) - Q8_0_BIAS));
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
    let word = w[select(0u, p.part.region1, j >= 4u) + i];
    let q = (word >> (8u * (j % 4u))) & 0xFFu;
    return f32(i32(q) - 128) * f16_at(p.part.region2, i / 4u);
}
