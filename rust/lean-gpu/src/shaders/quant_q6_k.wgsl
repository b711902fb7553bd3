// Q6_K, repacked at upload (weights.rs, pack_q6_k): one word of low nibbles per slice (byte j:
// element j in the low nibble, 4 + j in the high one); from word p.part.region1 one word of
// high bit pairs per two slices (byte j, bits 2f: field f = 0, 1 for elements j, 4 + j of the
// even slice, 2, 3 for those of the odd one); from word region2 the i8 scales, one per two
// slices; from word region3 one f16 d per block (32 slices).
// weight = (d * scale) * (q - 32) with q = nibble | pair << 4.

// 2^23 + 32: magic_bytes(q) minus this is q - 32, exactly.
const Q6_K_BIAS: vec4<f32> = vec4<f32>(8388640.0);
const PAIRS: u32 = 0x30303030u; // a pair moved to bits 4 and 5 of each byte

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Slice s of part row `row`: its quants q - 32 and d * scale (exact in f32: 11 by 8
// significant bits).
fn slice_quants(row: u32, s: u32) -> Slice {
    let i = row * row_slices() + s;
    let q = w[i];
    let pairs = w[p.part.region1 + i / 2u] >> (4u * (i & 1u));
    let lo = (q & NIBBLES) | ((pairs << 4u) & PAIRS);
    let hi = ((q >> 4u) & NIBBLES) | ((pairs << 2u) & PAIRS);
    let scale = extractBits(i32(w[p.part.region2 + i / 8u]), 8u * ((i / 2u) % 4u), 8u);
    return Slice(f16_at(p.part.region3, i / 32u) * f32(scale),
                 array<vec4<f32>, 2>(magic_bytes(lo) - Q6_K_BIAS, magic_bytes(hi) - Q6_K_BIAS));
}

// Dot of slice s of part row `row` with its activations xs (d * scale factored out).
fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    return scaled_dot(slice_quants(row, s), xs);
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this),
// grouped (d * scale) * (q - 32) as the reference (weight_at) does.
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    return scaled_weights(slice_quants(row, s));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let i = row * row_slices() + e / 8u;
    let j = e % 8u;
    let nibble = (w[i] >> (8u * (j % 4u) + 4u * (j / 4u))) & 0xFu;
    let field = 4u * (i & 1u) + 2u * (j / 4u);
    let pair = (w[p.part.region1 + i / 2u] >> (8u * (j % 4u) + field)) & 3u;
    let scale = extractBits(i32(w[p.part.region2 + i / 8u]), 8u * ((i / 2u) % 4u), 8u);
    let d = f16_at(p.part.region3, i / 32u);
    return (d * f32(scale)) * f32(i32(nibble | (pair << 4u)) - 32);
}
