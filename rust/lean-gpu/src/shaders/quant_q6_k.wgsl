// Q6_K, repacked at upload (weights.rs, pack_q6_k) into planes interleaved by row quads (the
// items of rows 4k .. 4k + 4 side by side, quad_at): one word of low nibbles per slice (byte j:
// element j in the low nibble, 4 + j in the high one); from word p.part.region1 one word of
// high bit pairs per two slices (byte j, bits 2f: field f = 0, 1 for elements j, 4 + j of the
// even slice, 2, 3 for those of the odd one); from word region2 the scales + 128 as bytes, one
// per two slices; from word region3 one f16 d per block (32 slices).
// weight = (d * scale) * (q - 32) with q = nibble | pair << 4.

const PAIRS: u32 = 0x30303030u; // a pair moved to bits 4 and 5 of each byte
// 2^23 + 32 and 2^23 + 128: magic_bytes minus these are q - 32 and a scale, exactly.
const Q6_K_BIAS: vec4<f32> = vec4<f32>(8388640.0);
const SCALE_BIAS: vec4<f32> = vec4<f32>(8388736.0);

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// The 6-bit quants of a slice: elements 0..4 and 4..8 in the bytes of two words, from its
// nibble word and its pair word (shifted for the slice's fields).
fn six_bits(nibbles: u32, pairs: u32) -> vec2<u32> {
    return vec2<u32>((nibbles & NIBBLES) | ((pairs << 4u) & PAIRS),
                     ((nibbles >> 4u) & NIBBLES) | ((pairs << 2u) & PAIRS));
}

// Slice s of part row `row`: its quants q - 32 and d * scale (exact in f32: 11 by 8
// significant bits).
fn slice_quants(row: u32, s: u32) -> Slice {
    let rs = row_slices();
    let pairs = w[p.part.region1 + quad_at(row, s / 2u, rs / 2u)] >> (4u * (s & 1u));
    let q = six_bits(w[quad_at(row, s, rs)], pairs);
    let scales = w[p.part.region2 + quad_at(row, s / 8u, rs / 8u)];
    let scale = f32(extractBits(scales, 8u * ((s / 2u) % 4u), 8u)) - 128.0;
    let d = f16_at(p.part.region3, quad_at(row, s / 32u, rs / 32u));
    return Slice(d * scale,
                 array<vec4<f32>, 2>(magic_bytes(q.x) - Q6_K_BIAS, magic_bytes(q.y) - Q6_K_BIAS));
}

// The matvec's decode keeps bytes 0 and 1 of a word in place (as quant_q8_0.wgsl's): byte k
// OR-ed into the bits of 2^(23 - 8k) reads 2^(23 - 8k) + q, minus 2^(23 - 8k) + 32 exactly
// q - 32; bytes 2 and 3 the same after one shift of the word.
const IN_PLACE_MASKS: vec4<u32> = vec4<u32>(0x3Fu, 0x3F00u, 0x3Fu, 0x3F00u);
const IN_PLACE_EXPONENTS: vec4<u32> = vec4<u32>(0x4B000000u, 0x47000000u, 0x4B000000u, 0x47000000u);
const IN_PLACE_BIAS: vec4<f32> = vec4<f32>(8388640.0, 32800.0, 8388640.0, 32800.0);

fn six_bits_in_place(v: u32) -> vec4<f32> {
    let words = vec4<u32>(v, v, v >> 16u, v >> 16u);
    return bitcast<vec4<f32>>((words & IN_PLACE_MASKS) | IN_PLACE_EXPONENTS) - IN_PLACE_BIAS;
}

// The dot of one row's slice (its nibble word and shifted pair word) with xs, unscaled.
fn six_bits_dot(nibbles: u32, pairs: u32, xs: array<vec4<f32>, 2>) -> f32 {
    let q = six_bits(nibbles, pairs);
    return dot_acc(dot_acc(0.0, six_bits_in_place(q.x), xs[0]), six_bits_in_place(q.y), xs[1]);
}

// Dots of slice s of part rows row0 .. row0 + 4 (row0 a multiple of 4; rows past the part's
// end are zero padding) with its activations xs: one 16-byte load per plane (the matvec).
fn quad_dot(row0: u32, s: u32, xs: array<vec4<f32>, 2>) -> vec4<f32> {
    let rs = row_slices();
    let nibbles = w4[quad_at(row0, s, rs) / 4u];
    let pairs = w4[(p.part.region1 + quad_at(row0, s / 2u, rs / 2u)) / 4u] >> vec4<u32>(4u * (s & 1u));
    let scale_words = w4[(p.part.region2 + quad_at(row0, s / 8u, rs / 8u)) / 4u];
    let scale_bytes = (scale_words >> vec4<u32>(8u * ((s / 2u) % 4u))) & vec4<u32>(0xFFu);
    let scales = bitcast<vec4<f32>>(scale_bytes | vec4<u32>(0x4B000000u)) - SCALE_BIAS;
    let d = quad_f16(p.part.region3, row0, s / 32u, rs / 32u);
    return (d * scales) * vec4<f32>(six_bits_dot(nibbles.x, pairs.x, xs),
                                    six_bits_dot(nibbles.y, pairs.y, xs),
                                    six_bits_dot(nibbles.z, pairs.z, xs),
                                    six_bits_dot(nibbles.w, pairs.w, xs));
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this),
// grouped (d * scale) * (q - 32) as the reference (weight_at) does.
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    return scaled_weights(slice_quants(row, s));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let sl = slice_quants(row, e / 8u);
    var q = sl.q;
    let j = e % 8u;
    return sl.scale * q[j / 4u][j % 4u];
}
