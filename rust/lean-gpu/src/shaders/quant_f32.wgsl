// F32, rows padded at upload with zeros to whole units (weights.rs): row r's elements start at
// word 32 * r * p.part.units.

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    // F32 rows may end inside a slice: the tail reads as zeros (times the zero padding).
    let e = 8u * s;
    return array<vec4<f32>, 2>(
        vec4<f32>(x_or_zero(e), x_or_zero(e + 1u), x_or_zero(e + 2u), x_or_zero(e + 3u)),
        vec4<f32>(x_or_zero(e + 4u), x_or_zero(e + 5u), x_or_zero(e + 6u), x_or_zero(e + 7u)));
}

fn x_or_zero(e: u32) -> f32 {
    return select(0.0, x[x_first + min(e, p.cols - 1u)], e < p.cols);
}

fn weights4(i: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
}

fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    let ws = slice_weights(row, s);
    return dot_acc(dot_acc(0.0, ws[0], xs[0]), ws[1], xs[1]);
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this).
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    let i = 8u * (row * row_slices() + s);
    return array<vec4<f32>, 2>(weights4(i), weights4(i + 4u));
}

// Element e of part row `row` (embed reads it with this).
fn weight_at(row: u32, e: u32) -> f32 {
    return bitcast<f32>(w[32u * row * p.part.units + e]);
}
