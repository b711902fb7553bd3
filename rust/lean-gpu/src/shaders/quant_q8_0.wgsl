// Q8_0, repacked at upload (weights.rs) in row quads: each q + 128 as an unsigned byte, in two
// planes of one word per slice: elements 0..4 of every slice, then from word p.part.region1
// elements 4..8, the words of a slice of rows 4k .. 4k + 4 side by side (quad_at); then from
// word region2 the f16 scales d of the units (blocks), interleaved the same way. weight = d * q.

// 2^23 + 128: magic_bytes(q + 128) minus this is q, exactly.
const Q8_0_BIAS: vec4<f32> = vec4<f32>(8388736.0);

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Slice s of part row `row`: its quants q and d.
fn slice_quants(row: u32, s: u32) -> Slice {
    let i = quad_at(row, s, row_slices());
    return Slice(f16_at(p.part.region2, quad_at(row, s / 4u, p.part.units)), array<vec4<f32>, 2>(
        magic_bytes(w[i]) - Q8_0_BIAS, magic_bytes(w[p.part.region1 + i]) - Q8_0_BIAS));
}

// The matvec's decode keeps bytes 0 and 1 of a word in place: byte k (bits 8k .. 8k + 8) OR-ed
// into the bits of 2^(23 - 8k), whose mantissa's last bit is worth 256^-k, reads
// 2^(23 - 8k) + q + 128, and minus 2^(23 - 8k) + 128 it is exactly q; bytes 2 and 3 the same
// after one shift of the word. (Byte 2 in place would overlap the exponent.)
const IN_PLACE_MASKS: vec4<u32> = vec4<u32>(0xFFu, 0xFF00u, 0xFFu, 0xFF00u);
const IN_PLACE_EXPONENTS: vec4<u32> = vec4<u32>(0x4B000000u, 0x47000000u, 0x4B000000u, 0x47000000u);
const IN_PLACE_BIAS: vec4<f32> = vec4<f32>(8388736.0, 32896.0, 8388736.0, 32896.0);

// The word's 4 quants q, exactly.
fn bytes_in_place(v: u32) -> vec4<f32> {
    let words = vec4<u32>(v, v, v >> 16u, v >> 16u);
    return bitcast<vec4<f32>>((words & IN_PLACE_MASKS) | IN_PLACE_EXPONENTS) - IN_PLACE_BIAS;
}

// Dots of slice s of part rows row0 .. row0 + 4 (row0 a multiple of 4; rows past the part's
// end are zero padding) with its activations xs: each plane's 4 words in one 16-byte load, the
// 4 scales in one 8-byte load (the matvec).
fn quad_dot(row0: u32, s: u32, xs: array<vec4<f32>, 2>) -> vec4<f32> {
    let i = quad_at(row0, s, row_slices()) / 4u;
    let lo = w4[i];
    let hi = w4[p.part.region1 / 4u + i];
    let d = quad_f16(p.part.region2, row0, s / 4u, p.part.units);
    return d * vec4<f32>(
        dot_acc(dot_acc(0.0, bytes_in_place(lo.x), xs[0]), bytes_in_place(hi.x), xs[1]),
        dot_acc(dot_acc(0.0, bytes_in_place(lo.y), xs[0]), bytes_in_place(hi.y), xs[1]),
        dot_acc(dot_acc(0.0, bytes_in_place(lo.z), xs[0]), bytes_in_place(hi.z), xs[1]),
        dot_acc(dot_acc(0.0, bytes_in_place(lo.w), xs[0]), bytes_in_place(hi.w), xs[1]));
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this).
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    return scaled_weights(slice_quants(row, s));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let j = e % 8u;
    let word = w[select(0u, p.part.region1, j >= 4u) + quad_at(row, e / 8u, row_slices())];
    let q = (word >> (8u * (j % 4u))) & 0xFFu;
    return f32(i32(q) - 128) * f16_at(p.part.region2, quad_at(row, e / 32u, p.part.units));
}
