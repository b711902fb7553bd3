// Q4_0, repacked at upload (weights.rs) in row quads: one word of quants per slice (byte j:
// element j in the low nibble, element 4 + j in the high one), the words of a slice of rows
// 4k .. 4k + 4 side by side (quad_at); then from word p.part.region1 the f16 scales d of the
// units (blocks), interleaved the same way. weight = d * (q - 8).

// 2^23 + 8: magic_bytes(q) minus this is q - 8, exactly.
const Q4_0_BIAS: vec4<f32> = vec4<f32>(8388616.0);

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Slice s of part row `row`: its quants q - 8 and d.
fn slice_quants(row: u32, s: u32) -> Slice {
    let q = w[quad_at(row, s, row_slices())];
    return Slice(f16_at(p.part.region1, quad_at(row, s / 4u, p.part.units)),
                 array<vec4<f32>, 2>(magic_bytes(q & NIBBLES) - Q4_0_BIAS,
                                     magic_bytes((q >> 4u) & NIBBLES) - Q4_0_BIAS));
}

// The matvec's decode keeps each nibble in place: nibble k of a word (bits 4k .. 4k + 4) OR-ed
// into the bits of 2^(23 - 4k), whose mantissa's last bit is worth 16^-k, reads
// 2^(23 - 4k) + q, and minus 2^(23 - 4k) + 8 it is exactly q - 8: one mask-and-or and one
// subtraction per element.
const IN_PLACE_MASKS: vec4<u32> = vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u);
const IN_PLACE_EXPONENTS: vec4<u32> = vec4<u32>(0x4B000000u, 0x49000000u, 0x47000000u, 0x45000000u);
const IN_PLACE_BIAS: vec4<f32> = vec4<f32>(8388616.0, 524296.0, 32776.0, 2056.0);

// The dot of one slice word's quants q - 8 with the slice's activations, d not applied. The
// nibbles 0, 1, 2, 3 of q are elements 0, 4, 1, 5, those of q >> 16 elements 2, 6, 3, 7.
fn nibbles_dot(q: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let a = bitcast<vec4<f32>>((vec4<u32>(q) & IN_PLACE_MASKS) | IN_PLACE_EXPONENTS);
    let b = bitcast<vec4<f32>>((vec4<u32>(q >> 16u) & IN_PLACE_MASKS) | IN_PLACE_EXPONENTS);
    let by_position = fma(a - IN_PLACE_BIAS, xa, (b - IN_PLACE_BIAS) * xb);
    return (by_position.x + by_position.y) + (by_position.z + by_position.w);
}

// Dots of slice s of part rows row0 .. row0 + 4 (row0 a multiple of 4; rows past the part's
// end are zero padding) with its activations xs: the quad's 4 words in one 16-byte load, its 4
// scales in one 8-byte load (the matvec).
fn quad_dot(row0: u32, s: u32, xs: array<vec4<f32>, 2>) -> vec4<f32> {
    let q = w4[quad_at(row0, s, row_slices()) / 4u];
    let d = quad_f16(p.part.region1, row0, s / 4u, p.part.units);
    let xa = vec4<f32>(xs[0].x, xs[1].x, xs[0].y, xs[1].y);
    let xb = vec4<f32>(xs[0].z, xs[1].z, xs[0].w, xs[1].w);
    return d * vec4<f32>(nibbles_dot(q.x, xa, xb), nibbles_dot(q.y, xa, xb),
                         nibbles_dot(q.z, xa, xb), nibbles_dot(q.w, xa, xb));
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this).
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    return scaled_weights(slice_quants(row, s));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let j = e % 8u;
    let q = (w[quad_at(row, e / 8u, row_slices())] >> (8u * (j % 4u) + 4u * (j / 4u))) & 0xFu;
    return f16_at(p.part.region1, quad_at(row, e / 32u, p.part.units)) * f32(i32(q) - 8);
}
