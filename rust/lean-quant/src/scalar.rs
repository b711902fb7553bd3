//! Scalar reference dequantizers: plain code that follows ggml's C reference layouts and is
//! bit-exact with gguf-py's `gguf.quants.dequantize` (checked by tests/reference_vectors.rs).
//! The SIMD kernels are tested against this module.
//!
//! Why bit-exactness is robust here: f16 scales widen to f32 exactly, and every product of a
//! block (f16 d: 11 significant bits, sub-block scale: at most 8, quant: at most 6) is either
//! exact in f32 or, for Q6_K, one rounding of the exact product however it is grouped. So the
//! only rounding that depends on the order of operations is the final `+ m` / `- dmin * min`,
//! and because the product before it is exact, an FMA gives the same result as mul-then-add.
//! Signed zeros do matter: `d * 0` with a negative `d` must stay -0.

use crate::TensorType;
use half::{bf16, f16};

const QK: usize = 32;
const QK_K: usize = 256;

/// Dequantizes whole blocks: `src.len() == n_blocks * ty.block_bytes()` and
/// `dst.len() == n_blocks * ty.block_len()`.
///
/// # Panics
/// If the lengths break that contract (a caller bug; tensor sizes are validated when a file is
/// parsed).
pub fn dequantize(ty: TensorType, src: &[u8], dst: &mut [f32]) {
    let n_blocks = dst.len() / ty.block_len();
    assert!(
        dst.len().is_multiple_of(ty.block_len()) && src.len() == n_blocks * ty.block_bytes(),
        "{ty}: {} bytes cannot dequantize into {} elements",
        src.len(),
        dst.len()
    );
    match ty {
        TensorType::F32 => dequantize_f32(src, dst),
        TensorType::F16 => dequantize_f16(src, dst),
        TensorType::BF16 => dequantize_bf16(src, dst),
        TensorType::Q4_0 => for_each_block(ty, src, dst, dequantize_q4_0),
        TensorType::Q4_1 => for_each_block(ty, src, dst, dequantize_q4_1),
        TensorType::Q5_0 => for_each_block(ty, src, dst, dequantize_q5_0),
        TensorType::Q5_1 => for_each_block(ty, src, dst, dequantize_q5_1),
        TensorType::Q8_0 => for_each_block(ty, src, dst, dequantize_q8_0),
        TensorType::Q2_K => for_each_block(ty, src, dst, dequantize_q2_k),
        TensorType::Q3_K => for_each_block(ty, src, dst, dequantize_q3_k),
        TensorType::Q4_K => for_each_block(ty, src, dst, dequantize_q4_k),
        TensorType::Q5_K => for_each_block(ty, src, dst, dequantize_q5_k),
        TensorType::Q6_K => for_each_block(ty, src, dst, dequantize_q6_k),
    }
}

/// Dot product of a stored row with `x`: dequantizes block by block and accumulates in f32 in
/// element order. This is the reference the SIMD kernels are tested against.
///
/// # Panics
/// If `x.len()` is not a whole number of blocks or `row.len()` is not the byte size of that many.
pub fn dot(ty: TensorType, row: &[u8], x: &[f32]) -> f32 {
    let block_len = ty.block_len();
    let n_blocks = x.len() / block_len;
    assert!(
        x.len().is_multiple_of(block_len) && row.len() == n_blocks * ty.block_bytes(),
        "{ty}: a row of {} bytes does not match {} elements",
        row.len(),
        x.len()
    );
    // Whole blocks at a time, 256 elements (one K-quant block) per step so that the
    // one-element float "blocks" are not dequantized one call each.
    let chunk_bytes = QK_K / block_len * ty.block_bytes();
    let mut buf = [0f32; QK_K];
    let mut sum = 0f32;
    for (bytes, xs) in row.chunks(chunk_bytes).zip(x.chunks(QK_K)) {
        let weights = &mut buf[..xs.len()];
        dequantize(ty, bytes, weights);
        for (w, v) in weights.iter().zip(xs) {
            sum += w * v;
        }
    }
    sum
}

fn for_each_block(ty: TensorType, src: &[u8], dst: &mut [f32], f: fn(&[u8], &mut [f32])) {
    for (block, out) in src
        .chunks_exact(ty.block_bytes())
        .zip(dst.chunks_exact_mut(ty.block_len()))
    {
        f(block, out);
    }
}

/// Little-endian f32 elements, copied bit for bit.
pub fn dequantize_f32(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), out.len() * 4, "F32: byte/element count mismatch");
    for (bytes, o) in src.chunks_exact(4).zip(out) {
        *o = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
}

/// Little-endian IEEE half-precision elements.
pub fn dequantize_f16(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), out.len() * 2, "F16: byte/element count mismatch");
    for (bytes, o) in src.chunks_exact(2).zip(out) {
        *o = f16_at(bytes, 0);
    }
}

/// Little-endian bfloat16 elements (the top half of an f32).
pub fn dequantize_bf16(src: &[u8], out: &mut [f32]) {
    assert_eq!(
        src.len(),
        out.len() * 2,
        "BF16: byte/element count mismatch"
    );
    for (bytes, o) in src.chunks_exact(2).zip(out) {
        *o = bf16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])).to_f32();
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

fn check_block(ty: TensorType, block: &[u8], out: &[f32]) {
    assert!(
        block.len() == ty.block_bytes() && out.len() == ty.block_len(),
        "{ty}: a block is {} bytes -> {} elements, got {} -> {}",
        ty.block_bytes(),
        ty.block_len(),
        block.len(),
        out.len()
    );
}

/// block_q4_0 (18 bytes): f16 d, qs[16]. Element i < 16 is the low nibble of qs[i], element
/// 16 + i its high nibble; x = d * (q - 8).
pub fn dequantize_q4_0(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q4_0, block, out);
    let d = f16_at(block, 0);
    let qs = &block[2..18];
    for i in 0..QK / 2 {
        out[i] = d * ((qs[i] & 0x0F) as i32 - 8) as f32;
        out[i + QK / 2] = d * ((qs[i] >> 4) as i32 - 8) as f32;
    }
}

/// block_q4_1 (20 bytes): f16 d, f16 m, qs[16] (nibbles as Q4_0); x = d * q + m.
pub fn dequantize_q4_1(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q4_1, block, out);
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let qs = &block[4..20];
    for i in 0..QK / 2 {
        out[i] = d * (qs[i] & 0x0F) as f32 + m;
        out[i + QK / 2] = d * (qs[i] >> 4) as f32 + m;
    }
}

/// The fifth bit of element `i` of a Q5_0/Q5_1 block: bit i of the little-endian u32 `qh`.
fn q5_high_bit(qh: u32, i: usize) -> u8 {
    ((qh >> i) & 1) as u8
}

/// block_q5_0 (22 bytes): f16 d, u32 qh (bit i = fifth bit of element i), qs[16] (low
/// nibbles as Q4_0); x = d * (q - 16).
pub fn dequantize_q5_0(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q5_0, block, out);
    let d = f16_at(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let qs = &block[6..22];
    for i in 0..QK / 2 {
        let lo = (qs[i] & 0x0F) | (q5_high_bit(qh, i) << 4);
        let hi = (qs[i] >> 4) | (q5_high_bit(qh, i + QK / 2) << 4);
        out[i] = d * (lo as i32 - 16) as f32;
        out[i + QK / 2] = d * (hi as i32 - 16) as f32;
    }
}

/// block_q5_1 (24 bytes): f16 d, f16 m, u32 qh, qs[16] (bits as Q5_0); x = d * q + m.
pub fn dequantize_q5_1(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q5_1, block, out);
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let qs = &block[8..24];
    for i in 0..QK / 2 {
        let lo = (qs[i] & 0x0F) | (q5_high_bit(qh, i) << 4);
        let hi = (qs[i] >> 4) | (q5_high_bit(qh, i + QK / 2) << 4);
        out[i] = d * lo as f32 + m;
        out[i + QK / 2] = d * hi as f32 + m;
    }
}

/// block_q8_0 (34 bytes): f16 d, i8 qs[32]; x = q * d.
pub fn dequantize_q8_0(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q8_0, block, out);
    let d = f16_at(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..34]) {
        *o = q as i8 as f32 * d;
    }
}

/// block_q2_K (84 bytes): scales[16] (low nibble: scale, high nibble: min of each 16-element
/// sub-block), qs[64] (2-bit quants), f16 d, f16 dmin.
/// Element 128*h + 32*j + l (h < 2, j < 4, l < 32) is bits 2j..2j+2 of qs[32*h + l];
/// x = (d * scale) * q - (dmin * min).
pub fn dequantize_q2_k(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q2_K, block, out);
    let scales = &block[0..16];
    let qs = &block[16..80];
    let d = f16_at(block, 80);
    let dmin = f16_at(block, 82);
    for h in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let i = 128 * h + 32 * j + l;
                let sc = scales[i / 16];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let q = (qs[32 * h + l] >> (2 * j)) & 3;
                out[i] = dl * q as f32 - ml;
            }
        }
    }
}

/// block_q3_K (110 bytes): hmask[32], qs[64] (low 2 bits), scales[12] (sixteen 6-bit scales),
/// f16 d.
/// Element 128*h + 32*j + l has low bits 2j..2j+2 of qs[32*h + l] and its third bit is bit
/// 4h + j of hmask[l]; a *clear* hmask bit subtracts 4, so q is in -4..=3.
/// Scale s: low nibble from scales[s % 8] (low nibble for s < 8, high for s >= 8), top two bits
/// from bits 2*(s/4).. of scales[8 + s % 4]; stored with a +32 offset.
/// x = (d * (scale - 32)) * q.
pub fn dequantize_q3_k(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q3_K, block, out);
    let hmask = &block[0..32];
    let qs = &block[32..96];
    let packed = &block[96..108];
    let d = f16_at(block, 108);
    let mut scales = [0i32; 16];
    for (s, scale) in scales.iter_mut().enumerate() {
        let low = (packed[s % 8] >> (4 * (s / 8))) & 0x0F;
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 0x03;
        *scale = (low | (high << 4)) as i32 - 32;
    }
    for h in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let i = 128 * h + 32 * j + l;
                let dl = d * scales[i / 16] as f32;
                let low = ((qs[32 * h + l] >> (2 * j)) & 3) as i32;
                let high_set = (hmask[l] >> (4 * h + j)) & 1 == 1;
                let q = if high_set { low } else { low - 4 };
                out[i] = dl * q as f32;
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: the eight 6-bit (scale, min) pairs packed into 12 bytes.
/// j < 4: scale = low 6 bits of bytes[j], min = low 6 bits of bytes[j + 4];
/// j >= 4: the low 4 bits come from the nibbles of bytes[j + 4] (scale: low, min: high) and
/// the top 2 bits from the top bits of bytes[j - 4] (scale) and bytes[j] (min).
fn scale_min_k4(j: usize, packed: &[u8]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        let scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
        let min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
        (scale, min)
    }
}

/// block_q4_K (144 bytes): f16 d, f16 dmin, scales[12] (see `scale_min_k4`), qs[128].
/// Sub-block s (32 elements) = 2c + n: nibble n (0 low, 1 high) of qs[32c .. 32c + 32];
/// x = (d * scale) * q - (dmin * min).
pub fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q4_K, block, out);
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let packed = &block[4..16];
    let qs = &block[16..144];
    for s in 0..8 {
        let (scale, min) = scale_min_k4(s, packed);
        let dl = d * scale as f32;
        let ml = dmin * min as f32;
        let bytes = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        for (o, &b) in out[32 * s..32 * s + 32].iter_mut().zip(bytes) {
            let q = (b >> (4 * (s % 2))) & 0x0F;
            *o = dl * q as f32 - ml;
        }
    }
}

/// block_q5_K (176 bytes): f16 d, f16 dmin, scales[12] (as Q4_K), qh[32], qs[128] (low nibbles
/// as Q4_K). The fifth bit of element 32s + l is bit s of qh[l];
/// x = (d * scale) * q - (dmin * min).
pub fn dequantize_q5_k(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q5_K, block, out);
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let packed = &block[4..16];
    let qh = &block[16..48];
    let qs = &block[48..176];
    for s in 0..8 {
        let (scale, min) = scale_min_k4(s, packed);
        let dl = d * scale as f32;
        let ml = dmin * min as f32;
        for l in 0..32 {
            let low = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
            let high = (qh[l] >> s) & 1;
            let q = low | (high << 4);
            out[32 * s + l] = dl * q as f32 - ml;
        }
    }
}

/// block_q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), i8 scales[16] (one per
/// 16 elements), f16 d.
/// In half h (128 elements), element 128h + 64n + i (n < 2, i < 64) has nibble n of
/// ql[64h + i]; element 128h + 32j + l (j < 4, l < 32) has bits 2j..2j+2 of qh[32h + l] as its
/// top two bits. x = (d * scale) * (q - 32).
pub fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    check_block(TensorType::Q6_K, block, out);
    let ql = &block[0..128];
    let qh = &block[128..192];
    let scales = &block[192..208];
    let d = f16_at(block, 208);
    for h in 0..2 {
        for e in 0..128 {
            let i = 128 * h + e;
            let low = (ql[64 * h + e % 64] >> (4 * (e / 64))) & 0x0F;
            let high = (qh[32 * h + e % 32] >> (2 * (e / 32))) & 0x03;
            let q = (low | (high << 4)) as i32 - 32;
            let dl = d * (scales[i / 16] as i8) as f32;
            out[i] = dl * q as f32;
        }
    }
}
