//! AVX2 kernels (with FMA and F16C): 8 f32 lanes, fused decoders for every type.
//!
//! Quants are unpacked to one byte per weight (offsets such as -8 applied in bytes, where they
//! are exact), widened to i32, converted, then scaled with the scalar dequantizer's f32 ops.

use super::formats::*;
use super::{k4_scales_mins, pack_columns, q3_k_scales, Gemm, Kernels, Strided, COLUMN_BLOCK};
use crate::TensorType;
use std::arch::x86_64::*;

pub(super) fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(super) static KERNELS: Kernels = Kernels {
    dot,
    rows,
    columns: None,
    dequant,
    vecmat,
    gemm: Gemm {
        panel_rows: 16,
        depth_block: 256,
        tiles: &[
            tile::<1>, tile::<2>, tile::<3>, tile::<4>, tile::<5>, tile::<6>,
        ],
        pack,
    },
};

/// See `RowsFn`: one fused dot per row.
unsafe fn rows(ty: TensorType, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]) {
    super::rows_by_dot(dot, ty, w, row_bytes, x, y)
}

unsafe fn dot(ty: TensorType, row: &[u8], x: &[f32]) -> f32 {
    match ty {
        TensorType::F32 => dot_floats::<F32>(ty, row, x),
        TensorType::F16 => dot_floats::<F16>(ty, row, x),
        TensorType::BF16 => dot_floats::<BF16>(ty, row, x),
        TensorType::Q4_0 => dot_blocks::<Q4_0>(row, x),
        TensorType::Q4_1 => dot_blocks::<Q4_1>(row, x),
        TensorType::Q5_0 => dot_blocks::<Q5_0>(row, x),
        TensorType::Q5_1 => dot_blocks::<Q5_1>(row, x),
        TensorType::Q8_0 => dot_blocks::<Q8_0>(row, x),
        TensorType::Q2_K => dot_blocks::<Q2_K>(row, x),
        TensorType::Q3_K => dot_blocks::<Q3_K>(row, x),
        TensorType::Q4_K => dot_blocks::<Q4_K>(row, x),
        TensorType::Q5_K => dot_blocks::<Q5_K>(row, x),
        TensorType::Q6_K => dot_blocks::<Q6_K>(row, x),
    }
}

unsafe fn dequant(ty: TensorType, src: &[u8], dst: &mut [f32]) {
    match ty {
        TensorType::F32 => dequant_floats::<F32>(ty, src, dst),
        TensorType::F16 => dequant_floats::<F16>(ty, src, dst),
        TensorType::BF16 => dequant_floats::<BF16>(ty, src, dst),
        TensorType::Q4_0 => dequant_blocks::<Q4_0>(src, dst),
        TensorType::Q4_1 => dequant_blocks::<Q4_1>(src, dst),
        TensorType::Q5_0 => dequant_blocks::<Q5_0>(src, dst),
        TensorType::Q5_1 => dequant_blocks::<Q5_1>(src, dst),
        TensorType::Q8_0 => dequant_blocks::<Q8_0>(src, dst),
        TensorType::Q2_K => dequant_blocks::<Q2_K>(src, dst),
        TensorType::Q3_K => dequant_blocks::<Q3_K>(src, dst),
        TensorType::Q4_K => dequant_blocks::<Q4_K>(src, dst),
        TensorType::Q5_K => dequant_blocks::<Q5_K>(src, dst),
        TensorType::Q6_K => dequant_blocks::<Q6_K>(src, dst),
    }
}

/// A tensor type's decoder. A unit is a block (for float types: 32 elements), made of
/// `GROUPS` groups of 32 weights.
trait Decode {
    const UNIT_BYTES: usize;
    const GROUPS: usize;
    /// What a unit's groups share (its scales as vectors), decoded once per unit.
    type Scales: Copy;
    /// Safety: the CPU has this module's features; `unit` points at a whole unit.
    unsafe fn scales(unit: *const u8) -> Self::Scales;
    /// The 32 weights of group `G` of the unit at `unit`, each bit-identical to
    /// `scalar::dequantize`'s (a compile-time group index lets shifts and offsets fold).
    /// Safety: as `scales`, with `G < GROUPS` and `scales` from that unit.
    unsafe fn group<const G: usize>(unit: *const u8, scales: Self::Scales) -> [__m256; 4];
}

/// Fused dot over whole units: `x.len()` must be a multiple of `32 * D::GROUPS` and `row` hold
/// the matching units.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_blocks<D: Decode>(row: &[u8], x: &[f32]) -> f32 {
    let units = x.len() / (32 * D::GROUPS);
    let (w, x) = (row.as_ptr(), x.as_ptr());
    // Four independent sums, one per vector of a group (16 registers leave no room for more
    // next to the decoding).
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut fma = |wv: [__m256; 4], xs: *const f32| {
        for i in 0..4 {
            acc[i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(xs.add(8 * i)), acc[i]);
        }
    };
    for u in 0..units {
        let unit = w.add(u * D::UNIT_BYTES);
        let scales = D::scales(unit);
        let xs = x.add(u * 32 * D::GROUPS);
        macro_rules! groups {
            ($($g:literal),*) => { $( if $g < D::GROUPS { fma(D::group::<$g>(unit, scales), xs.add(32 * $g)); } )* };
        }
        groups!(0, 1, 2, 3, 4, 5, 6, 7);
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
    let pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_blocks<D: Decode>(src: &[u8], dst: &mut [f32]) {
    let units = dst.len() / (32 * D::GROUPS);
    let (w, out) = (src.as_ptr(), dst.as_mut_ptr());
    for u in 0..units {
        let unit = w.add(u * D::UNIT_BYTES);
        let scales = D::scales(unit);
        let o = out.add(u * 32 * D::GROUPS);
        macro_rules! groups {
            ($($g:literal),*) => { $( if $g < D::GROUPS {
                let wv = D::group::<$g>(unit, scales);
                for (i, v) in wv.iter().enumerate() {
                    _mm256_storeu_ps(o.add(32 * $g + 8 * i), *v);
                }
            } )* };
        }
        groups!(0, 1, 2, 3, 4, 5, 6, 7);
    }
}

/// Float rows: whole 32-element units fused, the rest through the scalar code.
unsafe fn dot_floats<D: Decode>(ty: TensorType, row: &[u8], x: &[f32]) -> f32 {
    let body = x.len() / 32 * 32;
    let body_bytes = body * ty.block_bytes();
    dot_blocks::<D>(&row[..body_bytes], &x[..body])
        + crate::scalar::dot(ty, &row[body_bytes..], &x[body..])
}

unsafe fn dequant_floats<D: Decode>(ty: TensorType, src: &[u8], dst: &mut [f32]) {
    let body = dst.len() / 32 * 32;
    let body_bytes = body * ty.block_bytes();
    let (head, tail) = dst.split_at_mut(body);
    dequant_blocks::<D>(&src[..body_bytes], head);
    crate::scalar::dequantize(ty, &src[body_bytes..], tail);
}

/// The f16 at `p` in every lane (see avx512.rs on why a broadcast is converted).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_splat(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
}

/// Lane `i % 8` of `v[i / 8]` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane<const N: usize>(v: [__m256; N], i: usize) -> __m256 {
    _mm256_permutevar8x32_ps(v[i / 8], _mm256_set1_epi32((i % 8) as i32))
}

/// Eight bytes (of a u64) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes8_to_f32(bytes: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes as i64)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 16 signed bytes as two vectors of f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen16(v: __m128i) -> [__m256; 2] {
    let cvt = |q: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    [cvt(v), cvt(_mm_unpackhi_epi64(v, v))]
}

/// 32 signed bytes as four vectors of f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen32(v: __m256i) -> [__m256; 4] {
    let [a, b] = widen16(_mm256_castsi256_si128(v));
    let [c, d] = widen16(_mm256_extracti128_si256::<1>(v));
    [a, b, c, d]
}

/// The low and high nibbles of 16 bytes: elements 0..16 and 16..32 of a legacy block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(qs: __m128i) -> __m256i {
    let mask = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(qs), mask),
        _mm_and_si128(qs, mask),
    )
}

/// Byte i = 0x10 where bit i of `qh` is set, else 0: the fifth bits of a Q5_0/Q5_1 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    // Spread byte i / 8 of qh to byte i, then test bit i % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// `a * w + b` per vector, as separate (unfused) mul and add.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_add<const N: usize>(mut w: [__m256; N], a: __m256, b: __m256) -> [__m256; N] {
    for v in &mut w {
        *v = _mm256_add_ps(_mm256_mul_ps(a, *v), b);
    }
    w
}

/// `a * w - b` per vector, unfused.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sub<const N: usize>(mut w: [__m256; N], a: __m256, b: __m256) -> [__m256; N] {
    for v in &mut w {
        *v = _mm256_sub_ps(_mm256_mul_ps(a, *v), b);
    }
    w
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul<const N: usize>(mut w: [__m256; N], a: __m256) -> [__m256; N] {
    for v in &mut w {
        *v = _mm256_mul_ps(a, *v);
    }
    w
}

impl Decode for F32 {
    const UNIT_BYTES: usize = 128;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(unit: *const u8, _: ()) -> [__m256; 4] {
        let p = unit as *const f32;
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    }
}

impl Decode for F16 {
    const UNIT_BYTES: usize = 64;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(unit: *const u8, _: ()) -> [__m256; 4] {
        let half = |i: usize| _mm256_cvtph_ps(load16(unit.add(16 * i)));
        [half(0), half(1), half(2), half(3)]
    }
}

impl Decode for BF16 {
    const UNIT_BYTES: usize = 64;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(unit: *const u8, _: ()) -> [__m256; 4] {
        let widen = |i: usize| {
            let bits = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load16(unit.add(16 * i))));
            // Like `half::bf16::to_f32`, NaNs come out quiet.
            let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
            let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F80_0000));
            _mm256_castsi256_ps(_mm256_or_si256(
                bits,
                _mm256_and_si256(nan, _mm256_set1_epi32(0x0040_0000)),
            ))
        };
        [widen(0), widen(1), widen(2), widen(3)]
    }
}

impl Decode for Q4_0 {
    const UNIT_BYTES: usize = 18;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: ()) -> [__m256; 4] {
        // d * (q - 8)
        let q = _mm256_sub_epi8(nibbles(load16(block.add(2))), _mm256_set1_epi8(8));
        mul(widen32(q), f16_splat(block))
    }
}

impl Decode for Q4_1 {
    const UNIT_BYTES: usize = 20;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: ()) -> [__m256; 4] {
        // d * q + m
        let q = nibbles(load16(block.add(4)));
        mul_add(widen32(q), f16_splat(block), f16_splat(block.add(2)))
    }
}

impl Decode for Q5_0 {
    const UNIT_BYTES: usize = 22;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: ()) -> [__m256; 4] {
        // d * (q - 16), q = nibble | fifth bit << 4
        let qh = (block.add(2) as *const u32).read_unaligned();
        let q = _mm256_or_si256(nibbles(load16(block.add(6))), fifth_bits(qh));
        mul(
            widen32(_mm256_sub_epi8(q, _mm256_set1_epi8(16))),
            f16_splat(block),
        )
    }
}

impl Decode for Q5_1 {
    const UNIT_BYTES: usize = 24;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: ()) -> [__m256; 4] {
        // d * q + m, q = nibble | fifth bit << 4
        let qh = (block.add(4) as *const u32).read_unaligned();
        let q = _mm256_or_si256(nibbles(load16(block.add(8))), fifth_bits(qh));
        mul_add(widen32(q), f16_splat(block), f16_splat(block.add(2)))
    }
}

impl Decode for Q8_0 {
    const UNIT_BYTES: usize = 34;
    const GROUPS: usize = 1;
    type Scales = ();
    unsafe fn scales(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: ()) -> [__m256; 4] {
        // q * d
        let d = f16_splat(block);
        let eight = |i: usize| {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(block.add(2 + 8 * i) as *const __m128i));
            _mm256_mul_ps(_mm256_cvtepi32_ps(q), d)
        };
        [eight(0), eight(1), eight(2), eight(3)]
    }
}

impl Decode for Q2_K {
    const UNIT_BYTES: usize = 84;
    const GROUPS: usize = 8;
    /// `d * scale` and `dmin * min` of the sixteen 16-element sub-blocks.
    type Scales = ([__m256; 2], [__m256; 2]);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: *const u8) -> Self::Scales {
        let bytes = load16(block);
        let scales = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
        let mins = _mm_and_si128(_mm_srli_epi16::<4>(bytes), _mm_set1_epi8(0x0F));
        let (d, dmin) = (f16_splat(block.add(80)), f16_splat(block.add(82)));
        let half = |v: __m128i, i: i32| {
            let v = if i == 0 { v } else { _mm_unpackhi_epi64(v, v) };
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
        };
        (
            [
                _mm256_mul_ps(d, half(scales, 0)),
                _mm256_mul_ps(d, half(scales, 1)),
            ],
            [
                _mm256_mul_ps(dmin, half(mins, 0)),
                _mm256_mul_ps(dmin, half(mins, 1)),
            ],
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, (dl, ml): Self::Scales) -> [__m256; 4] {
        // Group G = 4h + j: bits 2j.. of qs[32h..32h + 32]; (d * scale) * q - (dmin * min),
        // sub-block 2G + i for the i-th 16 elements.
        let qs = load32(block.add(16 + 32 * (G / 4)));
        let q = _mm256_and_si256(
            _mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * (G % 4) as i32)),
            _mm256_set1_epi8(3),
        );
        let [a, b, c, e] = widen32(q);
        let [a, b] = mul_sub([a, b], lane(dl, 2 * G), lane(ml, 2 * G));
        let [c, e] = mul_sub([c, e], lane(dl, 2 * G + 1), lane(ml, 2 * G + 1));
        [a, b, c, e]
    }
}

impl Decode for Q3_K {
    const UNIT_BYTES: usize = 110;
    const GROUPS: usize = 8;
    /// `d * scale` of the sixteen 16-element sub-blocks.
    type Scales = [__m256; 2];
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: *const u8) -> [__m256; 2] {
        let [a, b, c, e] = q3_k_scales(&*(block.add(96) as *const [u8; 12]));
        let d = f16_splat(block.add(108));
        let eight = |bytes: u64| {
            let scales = _mm256_sub_epi32(
                _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes as i64)),
                _mm256_set1_epi32(32),
            );
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(scales))
        };
        [
            eight(a as u64 | (b as u64) << 32),
            eight(c as u64 | (e as u64) << 32),
        ]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, dl: [__m256; 2]) -> [__m256; 4] {
        // Group G = 4h + j: low bits 2j.. of qs[32h..], third bit G of hmask[l] (clear: -4);
        // (d * scale) * q, sub-block 2G + i for the i-th 16 elements.
        let low = _mm256_srl_epi16(
            load32(block.add(32 + 32 * (G / 4))),
            _mm_cvtsi32_si128(2 * (G % 4) as i32),
        );
        let third = _mm256_srl_epi16(load32(block), _mm_cvtsi32_si128(G as i32));
        let low = _mm256_and_si256(low, _mm256_set1_epi8(3));
        let third = _mm256_slli_epi16::<2>(_mm256_and_si256(third, _mm256_set1_epi8(1)));
        let q = _mm256_sub_epi8(_mm256_or_si256(low, third), _mm256_set1_epi8(4));
        let [a, b, c, e] = widen32(q);
        let [a, b] = mul([a, b], lane(dl, 2 * G));
        let [c, e] = mul([c, e], lane(dl, 2 * G + 1));
        [a, b, c, e]
    }
}

/// Q4_K/Q5_K: `d * scale` and `dmin * min` of the eight 32-element sub-blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scales(block: *const u8) -> (__m256, __m256) {
    let (scales, mins) = k4_scales_mins(&*(block.add(4) as *const [u8; 12]));
    (
        _mm256_mul_ps(f16_splat(block), bytes8_to_f32(scales)),
        _mm256_mul_ps(f16_splat(block.add(2)), bytes8_to_f32(mins)),
    )
}

impl Decode for Q4_K {
    const UNIT_BYTES: usize = 144;
    const GROUPS: usize = 8;
    type Scales = (__m256, __m256);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: *const u8) -> Self::Scales {
        k4_scales(block)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, (dl, ml): Self::Scales) -> [__m256; 4] {
        // Nibble G % 2 of qs[32(G/2)..]; (d * scale) * q - (dmin * min).
        let qs = load32(block.add(16 + 32 * (G / 2)));
        let q = _mm256_and_si256(
            _mm256_srl_epi16(qs, _mm_cvtsi32_si128(4 * (G % 2) as i32)),
            _mm256_set1_epi8(0x0F),
        );
        mul_sub(widen32(q), lane([dl], G), lane([ml], G))
    }
}

impl Decode for Q5_K {
    const UNIT_BYTES: usize = 176;
    const GROUPS: usize = 8;
    type Scales = (__m256, __m256);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: *const u8) -> Self::Scales {
        k4_scales(block)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, (dl, ml): Self::Scales) -> [__m256; 4] {
        // Nibble G % 2 of qs[32(G/2)..], fifth bit G of qh[l]; (d * scale) * q - (dmin * min).
        let qs = load32(block.add(48 + 32 * (G / 2)));
        let low = _mm256_and_si256(
            _mm256_srl_epi16(qs, _mm_cvtsi32_si128(4 * (G % 2) as i32)),
            _mm256_set1_epi8(0x0F),
        );
        let fifth = _mm256_and_si256(
            _mm256_srl_epi16(load32(block.add(16)), _mm_cvtsi32_si128(G as i32)),
            _mm256_set1_epi8(1),
        );
        let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(fifth));
        mul_sub(widen32(q), lane([dl], G), lane([ml], G))
    }
}

impl Decode for Q6_K {
    const UNIT_BYTES: usize = 210;
    const GROUPS: usize = 8;
    /// `d * scale` of the sixteen 16-element sub-blocks.
    type Scales = [__m256; 2];
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: *const u8) -> [__m256; 2] {
        let d = f16_splat(block.add(208));
        let [a, b] = widen16(load16(block.add(192)));
        [_mm256_mul_ps(d, a), _mm256_mul_ps(d, b)]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, dl: [__m256; 2]) -> [__m256; 4] {
        // Group G = 4h + r: nibble r / 2 of ql[64h + 32(r % 2)..], top bits 2r.. of qh[32h..];
        // (d * scale) * (q - 32), sub-block 2G + i for the i-th 16 elements.
        let (h, r) = (G / 4, G % 4);
        let ql = load32(block.add(64 * h + 32 * (r % 2)));
        let qh = load32(block.add(128 + 32 * h));
        let low = _mm256_and_si256(
            _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (r / 2) as i32)),
            _mm256_set1_epi8(0x0F),
        );
        let top = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * r as i32)),
            _mm256_set1_epi8(3),
        );
        let q = _mm256_sub_epi8(
            _mm256_or_si256(low, _mm256_slli_epi16::<4>(top)),
            _mm256_set1_epi8(32),
        );
        let [a, b, c, e] = widen32(q);
        let [a, b] = mul([a, b], lane(dl, 2 * G));
        let [c, e] = mul([c, e], lane(dl, 2 * G + 1));
        [a, b, c, e]
    }
}

/// See `PackFn`: 16 rows, transposed as 8x8 squares.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack(rows: *const f32, row_stride: usize, depth: usize, packed: *mut f32) {
    let squares = depth / 8;
    for kb in 0..squares {
        for half in 0..2 {
            let mut square = [_mm256_setzero_ps(); 8];
            for (i, v) in square.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(rows.add((8 * half + i) * row_stride + 8 * kb));
            }
            for (c, v) in transpose8(square).iter().enumerate() {
                _mm256_storeu_ps(packed.add((8 * kb + c) * 16 + 8 * half), *v);
            }
        }
    }
    pack_columns(rows, row_stride, 16, 8 * squares, depth, packed);
}

/// The transpose of an 8x8 block: `out[j]` lane `i` is `rows[i]` lane `j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose8(rows: [__m256; 8]) -> [__m256; 8] {
    // u[4g + c] has, in 128-bit lane L, column 4L + c of rows 4g..4g + 4.
    let mut u = [_mm256_setzero_ps(); 8];
    for g in 0..2 {
        let r = &rows[4 * g..4 * g + 4];
        let (t0, t1) = (
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
        );
        let (t2, t3) = (
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
        );
        u[4 * g] = _mm256_shuffle_ps::<0x44>(t0, t2);
        u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(t0, t2);
        u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(t1, t3);
        u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(t1, t3);
    }
    let mut out = [_mm256_setzero_ps(); 8];
    for c in 0..4 {
        out[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
        out[4 + c] = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
    }
    out
}

/// The register tile: `T` tokens x 16 rows (two vectors), see `TileFn`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: usize>(
    panel: *const f32,
    depth: usize,
    x: *const f32,
    x_stride: usize,
    y: *mut f32,
    y_stride: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    if accumulate {
        for (t, acc) in acc.iter_mut().enumerate() {
            let y = y.add(t * y_stride);
            *acc = [_mm256_loadu_ps(y), _mm256_loadu_ps(y.add(8))];
        }
    }
    for k in 0..depth {
        let a0 = _mm256_loadu_ps(panel.add(16 * k));
        let a1 = _mm256_loadu_ps(panel.add(16 * k + 8));
        for (t, acc) in acc.iter_mut().enumerate() {
            let b = _mm256_set1_ps(*x.add(t * x_stride + k));
            acc[0] = _mm256_fmadd_ps(a0, b, acc[0]);
            acc[1] = _mm256_fmadd_ps(a1, b, acc[1]);
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        let y = y.add(t * y_stride);
        _mm256_storeu_ps(y, acc[0]);
        _mm256_storeu_ps(y.add(8), acc[1]);
    }
}

/// See `VecmatFn`: tiles of up to 4 rows of `a` x 16 columns (half a column block: two
/// vectors, masked at the right edge) in registers, each row of `m` loaded once per tile.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vecmat(a: *const f32, n: usize, depth: usize, m: Strided, cols: usize, y: *mut f32) {
    const TILES: [VecmatTile; 4] = [
        vecmat_tile::<1>,
        vecmat_tile::<2>,
        vecmat_tile::<3>,
        vecmat_tile::<4>,
    ];
    const _: () = assert!(COLUMN_BLOCK.is_multiple_of(16));
    for j in (0..cols).step_by(16) {
        let width = (cols - j).min(16);
        // Lane l is on when l < the vector's share of `width` (sign bit set).
        let mask = |from: usize| {
            let lanes = width.saturating_sub(from).min(8) as i32;
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        };
        let masks = [mask(0), mask(8)];
        for h in (0..n).step_by(TILES.len()) {
            let rows = TILES.len().min(n - h);
            TILES[rows - 1](
                a.add(h * depth),
                depth,
                m.column(j),
                m.row_stride,
                y.add(h * cols + j),
                cols,
                masks,
            );
        }
    }
}

type VecmatTile = unsafe fn(*const f32, usize, *const f32, usize, *mut f32, usize, [__m256i; 2]);

/// `R` rows of `a` (`depth` apart) times 16 columns of `m` (lanes outside `masks` are neither
/// read nor written) into `R` rows of `y` (`y_stride` apart).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vecmat_tile<const R: usize>(
    a: *const f32,
    depth: usize,
    m: *const f32,
    m_stride: usize,
    y: *mut f32,
    y_stride: usize,
    masks: [__m256i; 2],
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // As avx512's: the cached keys and values stream from memory; ask for them ahead.
    let ahead = super::prefetch_distance() / 4;
    for i in 0..depth {
        let row = m.add(i * m_stride);
        if ahead > 0 {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead) as *const i8);
        }
        let m0 = _mm256_maskload_ps(row, masks[0]);
        let m1 = _mm256_maskload_ps(row.add(8), masks[1]);
        for (r, acc) in acc.iter_mut().enumerate() {
            let b = _mm256_set1_ps(*a.add(r * depth + i));
            acc[0] = _mm256_fmadd_ps(m0, b, acc[0]);
            acc[1] = _mm256_fmadd_ps(m1, b, acc[1]);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let y = y.add(r * y_stride);
        _mm256_maskstore_ps(y, masks[0], acc[0]);
        _mm256_maskstore_ps(y.add(8), masks[1], acc[1]);
    }
}
