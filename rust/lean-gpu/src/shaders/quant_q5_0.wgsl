// Q5_0 (22 bytes, kept as in the file): f16 d, u32 qh (bit i = fifth bit of element i), qs[16]
// (low nibbles as Q4_1); a unit is one block; weight = d * (q - 16).

// 2^23 + 16: magic_bytes(q) minus this is q - 16, exactly.
const Q5_0_BIAS: vec4<f32> = vec4<f32>(8388624.0);

fn slice_x(s: u32) -> array<vec4<f32>, 2> {
    return x_slice_vec4(s);
}

// Bits 0..4 of h at bit 4 of bytes 0..4.
fn fifth_bits(h: u32) -> u32 {
    return ((h & 1u) << 4u) | ((h & 2u) << 11u) | ((h & 4u) << 18u) | ((h & 8u) << 25u);
}

// Slice s of part row `row`: its quants q - 16 and d. Slice c of a block: elements 8c ..+ 8,
// the low (c < 2) or high nibbles of qs[8(c % 2) ..+ 8].
fn slice_quants(row: u32, s: u32) -> Slice {
    let blk = row * p.part.row_bytes + (s / 4u) * 22u;
    let c = s % 4u;
    let qh = load_u32(blk + 2u) >> (8u * c);
    let qs = blk + 6u + 8u * (c % 2u);
    let shift = 4u * (c / 2u);
    let lo = ((load_u32(qs) >> shift) & NIBBLES) | fifth_bits(qh);
    let hi = ((load_u32(qs + 4u) >> shift) & NIBBLES) | fifth_bits(qh >> 4u);
    return Slice(load_f16(blk),
                 array<vec4<f32>, 2>(magic_bytes(lo) - Q5_0_BIAS, magic_bytes(hi) - Q5_0_BIAS));
}

fn slice_dot(row: u32, s: u32, xs: array<vec4<f32>, 2>) -> f32 {
    return scaled_dot(slice_quants(row, s), xs);
}

// The 8 weights of slice s of part row `row` (the prefill matmul decodes its tiles with this).
fn slice_weights(row: u32, s: u32) -> array<vec4<f32>, 2> {
    return scaled_weights(slice_quants(row, s));
}

// Element e of part row `row` (embed dequantizes with this).
fn weight_at(row: u32, e: u32) -> f32 {
    let blk = row * p.part.row_bytes + (e / 32u) * 22u;
    let k = e % 32u;
    let byte = load_u8(blk + 6u + k % 16u);
    let nibble = select(byte & 0xFu, byte >> 4u, k >= 16u);
    let q = nibble | (((load_u32(blk + 2u) >> k) & 1u) << 4u);
    return load_f16(blk) * f32(i32(q) - 16);
}
