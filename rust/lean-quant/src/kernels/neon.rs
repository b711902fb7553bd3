//! AArch64 NEON kernels (NEON is part of the base AArch64 target): 4 f32 lanes, 32 vector
//! registers.
//!
//! Fused decoders for every type but F16 (Rust's f16 vector types are not stable yet): it goes
//! through the scalar dequantizer into a small buffer and a SIMD f32 dot.

use super::formats::*;
use super::{dot_via_buffer, k4_scales_mins, pack_columns, q3_k_scales, Gemm, Kernels};
use crate::{scalar, TensorType};
use core::arch::aarch64::*;

pub(super) static KERNELS: Kernels = Kernels {
    dot,
    rows,
    columns: None,
    dequant,
    vecmat: super::fallback::vecmat,
    gemm: Gemm {
        panel_rows: 16,
        depth_block: 128,
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
        TensorType::F16 => dot_via_buffer(ty, row, x, f32_dot),
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
        TensorType::F16 => scalar::dequantize(ty, src, dst),
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

type V = float32x4_t;

/// A tensor type's decoder. A unit is a block (for float types: 32 elements), made of
/// `GROUPS` groups of 32 weights.
trait Decode {
    const UNIT_BYTES: usize;
    const GROUPS: usize;
    /// The 32 weights of group `G` of the unit at `unit`, each bit-identical to
    /// `scalar::dequantize`'s. Safety: `unit` points at a whole unit; `G < GROUPS`.
    unsafe fn group<const G: usize>(unit: *const u8) -> [V; 8];
}

/// `acc += w * x[..32]`. Safety: `x` covers 32 elements.
#[inline(always)]
unsafe fn fma_acc(acc: &mut [V; 8], w: [V; 8], x: *const f32) {
    for i in 0..8 {
        acc[i] = vfmaq_f32(acc[i], w[i], vld1q_f32(x.add(4 * i)));
    }
}

unsafe fn sum_acc(acc: [V; 8]) -> f32 {
    let quad = |i: usize| vaddq_f32(acc[i], acc[i + 4]);
    vaddvq_f32(vaddq_f32(
        vaddq_f32(quad(0), quad(1)),
        vaddq_f32(quad(2), quad(3)),
    ))
}

/// Fused dot over whole units: `x.len()` must be a multiple of `32 * D::GROUPS` and `row` hold
/// the matching units.
unsafe fn dot_blocks<D: Decode>(row: &[u8], x: &[f32]) -> f32 {
    let units = x.len() / (32 * D::GROUPS);
    let (w, x) = (row.as_ptr(), x.as_ptr());
    // Eight independent sums (one per vector of a group) hide the FMA latency.
    let mut acc = [vdupq_n_f32(0.0); 8];
    for u in 0..units {
        let unit = w.add(u * D::UNIT_BYTES);
        let xs = x.add(u * 32 * D::GROUPS);
        macro_rules! groups {
            ($($g:literal),*) => { $( if $g < D::GROUPS {
                fma_acc(&mut acc, D::group::<$g>(unit), xs.add(32 * $g));
            } )* };
        }
        groups!(0, 1, 2, 3, 4, 5, 6, 7);
    }
    sum_acc(acc)
}

unsafe fn dequant_blocks<D: Decode>(src: &[u8], dst: &mut [f32]) {
    let units = dst.len() / (32 * D::GROUPS);
    let (w, out) = (src.as_ptr(), dst.as_mut_ptr());
    for u in 0..units {
        let unit = w.add(u * D::UNIT_BYTES);
        let o = out.add(u * 32 * D::GROUPS);
        macro_rules! groups {
            ($($g:literal),*) => { $( if $g < D::GROUPS {
                for (i, v) in D::group::<$g>(unit).iter().enumerate() {
                    vst1q_f32(o.add(32 * $g + 4 * i), *v);
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
        + scalar::dot(ty, &row[body_bytes..], &x[body..])
}

unsafe fn dequant_floats<D: Decode>(ty: TensorType, src: &[u8], dst: &mut [f32]) {
    let body = dst.len() / 32 * 32;
    let body_bytes = body * ty.block_bytes();
    let (head, tail) = dst.split_at_mut(body);
    dequant_blocks::<D>(&src[..body_bytes], head);
    scalar::dequantize(ty, &src[body_bytes..], tail);
}

/// SIMD f32 dot of equal-length slices (any length).
fn f32_dot(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let body = w.len() / 32 * 32;
    // SAFETY: every load is within `body <= w.len() == x.len()` elements.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 8];
        for i in (0..body).step_by(32) {
            let mut wv = [vdupq_n_f32(0.0); 8];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = vld1q_f32(w.as_ptr().add(i + 4 * j));
            }
            fma_acc(&mut acc, wv, x.as_ptr().add(i));
        }
        let tail: f32 = w[body..].iter().zip(&x[body..]).map(|(w, x)| w * x).sum();
        sum_acc(acc) + tail
    }
}

unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits((p as *const u16).read_unaligned()).to_f32()
}

/// `v >> shift` per byte (`shift` < 8).
#[inline(always)]
unsafe fn shr(v: uint8x16_t, shift: usize) -> uint8x16_t {
    vshlq_u8(v, vdupq_n_s8(-(shift as i8)))
}

/// 16 signed bytes as four vectors of f32.
#[inline(always)]
unsafe fn widen16(v: int8x16_t) -> [V; 4] {
    let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

/// 32 bytes (two vectors, values below 128 or meant as signed) as eight vectors of f32.
#[inline(always)]
unsafe fn widen32(a: uint8x16_t, b: uint8x16_t) -> [V; 8] {
    let [w0, w1, w2, w3] = widen16(vreinterpretq_s8_u8(a));
    let [w4, w5, w6, w7] = widen16(vreinterpretq_s8_u8(b));
    [w0, w1, w2, w3, w4, w5, w6, w7]
}

/// Byte i = 0x10 where bit i of the 16-bit `bits` is set, else 0.
#[inline(always)]
unsafe fn fifth_bits(bits: u32) -> uint8x16_t {
    const SPREAD: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let spread = vqtbl1q_u8(
        vreinterpretq_u8_u32(vdupq_n_u32(bits)),
        vld1q_u8(SPREAD.as_ptr()),
    );
    vandq_u8(vtstq_u8(spread, vld1q_u8(BIT.as_ptr())), vdupq_n_u8(0x10))
}

/// `a * w + b` per vector, unfused.
#[inline(always)]
unsafe fn mul_add(w: &mut [V], a: f32, b: f32) {
    let (a, b) = (vdupq_n_f32(a), vdupq_n_f32(b));
    for v in w {
        *v = vaddq_f32(vmulq_f32(a, *v), b);
    }
}

/// `a * w - b` per vector, unfused.
#[inline(always)]
unsafe fn mul_sub(w: &mut [V], a: f32, b: f32) {
    let (a, b) = (vdupq_n_f32(a), vdupq_n_f32(b));
    for v in w {
        *v = vsubq_f32(vmulq_f32(a, *v), b);
    }
}

#[inline(always)]
unsafe fn mul(w: &mut [V], a: f32) {
    let a = vdupq_n_f32(a);
    for v in w {
        *v = vmulq_f32(a, *v);
    }
}

impl Decode for F32 {
    const UNIT_BYTES: usize = 128;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(unit: *const u8) -> [V; 8] {
        let p = unit as *const f32;
        let mut w = [vdupq_n_f32(0.0); 8];
        for (i, v) in w.iter_mut().enumerate() {
            *v = vld1q_f32(p.add(4 * i));
        }
        w
    }
}

impl Decode for BF16 {
    const UNIT_BYTES: usize = 64;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(unit: *const u8) -> [V; 8] {
        let mut w = [vdupq_n_f32(0.0); 8];
        for (i, pair) in w.chunks_exact_mut(2).enumerate() {
            let halves = vld1q_u16(unit.add(16 * i) as *const u16);
            for (v, bits) in pair.iter_mut().zip([
                vshll_n_u16::<16>(vget_low_u16(halves)),
                vshll_high_n_u16::<16>(halves),
            ]) {
                // Like `half::bf16::to_f32`, NaNs come out quiet.
                let nan = vcgtq_u32(
                    vandq_u32(bits, vdupq_n_u32(0x7FFF_FFFF)),
                    vdupq_n_u32(0x7F80_0000),
                );
                *v = vreinterpretq_f32_u32(vorrq_u32(
                    bits,
                    vandq_u32(nan, vdupq_n_u32(0x0040_0000)),
                ));
            }
        }
        w
    }
}

/// The low and high nibbles of a legacy block's 16 quant bytes: elements 0..16 and 16..32.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> (uint8x16_t, uint8x16_t) {
    let q = vld1q_u8(qs);
    (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q))
}

impl Decode for Q4_0 {
    const UNIT_BYTES: usize = 18;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // d * (q - 8)
        let (lo, hi) = nibbles(block.add(2));
        let eight = vdupq_n_u8(8);
        let mut w = widen32(vsubq_u8(lo, eight), vsubq_u8(hi, eight));
        mul(&mut w, f16_at(block));
        w
    }
}

impl Decode for Q4_1 {
    const UNIT_BYTES: usize = 20;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // d * q + m
        let (lo, hi) = nibbles(block.add(4));
        let mut w = widen32(lo, hi);
        mul_add(&mut w, f16_at(block), f16_at(block.add(2)));
        w
    }
}

impl Decode for Q5_0 {
    const UNIT_BYTES: usize = 22;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // d * (q - 16), q = nibble | fifth bit << 4
        let qh = (block.add(2) as *const u32).read_unaligned();
        let (lo, hi) = nibbles(block.add(6));
        let sixteen = vdupq_n_u8(16);
        let lo = vsubq_u8(vorrq_u8(lo, fifth_bits(qh & 0xFFFF)), sixteen);
        let hi = vsubq_u8(vorrq_u8(hi, fifth_bits(qh >> 16)), sixteen);
        let mut w = widen32(lo, hi);
        mul(&mut w, f16_at(block));
        w
    }
}

impl Decode for Q5_1 {
    const UNIT_BYTES: usize = 24;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // d * q + m, q = nibble | fifth bit << 4
        let qh = (block.add(4) as *const u32).read_unaligned();
        let (lo, hi) = nibbles(block.add(8));
        let mut w = widen32(
            vorrq_u8(lo, fifth_bits(qh & 0xFFFF)),
            vorrq_u8(hi, fifth_bits(qh >> 16)),
        );
        mul_add(&mut w, f16_at(block), f16_at(block.add(2)));
        w
    }
}

impl Decode for Q8_0 {
    const UNIT_BYTES: usize = 34;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // q * d
        let mut w = widen32(vld1q_u8(block.add(2)), vld1q_u8(block.add(18)));
        mul(&mut w, f16_at(block));
        w
    }
}

impl Decode for Q2_K {
    const UNIT_BYTES: usize = 84;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // Group G = 4h + j: bits 2j.. of qs[32h..32h + 32]; (d * scale) * q - (dmin * min) with
        // one (scale, min) byte per 16 elements.
        let (d, dmin) = (f16_at(block.add(80)), f16_at(block.add(82)));
        let qs = block.add(16 + 32 * (G / 4));
        let bits = |p: *const u8| vandq_u8(shr(vld1q_u8(p), 2 * (G % 4)), vdupq_n_u8(3));
        let mut w = widen32(bits(qs), bits(qs.add(16)));
        for (i, half) in w.chunks_exact_mut(4).enumerate() {
            let sc = *block.add(2 * G + i);
            mul_sub(half, d * (sc & 0x0F) as f32, dmin * (sc >> 4) as f32);
        }
        w
    }
}

impl Decode for Q3_K {
    const UNIT_BYTES: usize = 110;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // Group G = 4h + j: low bits 2j.. of qs[32h..], third bit G of hmask[l] (clear: -4);
        // (d * scale) * q with one scale per 16 elements.
        let d = f16_at(block.add(108));
        let packed = &*(block.add(96) as *const [u8; 12]);
        let qs = block.add(32 + 32 * (G / 4));
        let q = |i: usize| {
            let low = vandq_u8(shr(vld1q_u8(qs.add(16 * i)), 2 * (G % 4)), vdupq_n_u8(3));
            let third = vandq_u8(shr(vld1q_u8(block.add(16 * i)), G), vdupq_n_u8(1));
            vsubq_u8(vorrq_u8(low, vshlq_n_u8::<2>(third)), vdupq_n_u8(4))
        };
        let mut w = widen32(q(0), q(1));
        let stored = q3_k_scales(packed);
        for (i, half) in w.chunks_exact_mut(4).enumerate() {
            let s = 2 * G + i;
            let scale = (stored[s / 4] >> (8 * (s % 4))) as u8 as i32 - 32;
            mul(half, d * scale as f32);
        }
        w
    }
}

/// Q4_K/Q5_K's `(d * scale, dmin * min)` of sub-block `g`.
unsafe fn k4_scales(block: *const u8, g: usize) -> (f32, f32) {
    let (scales, mins) = k4_scales_mins(&*(block.add(4) as *const [u8; 12]));
    let (scale, min) = ((scales >> (8 * g)) as u8, (mins >> (8 * g)) as u8);
    (
        f16_at(block) * scale as f32,
        f16_at(block.add(2)) * min as f32,
    )
}

impl Decode for Q4_K {
    const UNIT_BYTES: usize = 144;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // Nibble G % 2 of qs[32(G/2)..]; (d * scale) * q - (dmin * min).
        let qs = block.add(16 + 32 * (G / 2));
        let q = |p: *const u8| vandq_u8(shr(vld1q_u8(p), 4 * (G % 2)), vdupq_n_u8(0x0F));
        let mut w = widen32(q(qs), q(qs.add(16)));
        let (dl, ml) = k4_scales(block, G);
        mul_sub(&mut w, dl, ml);
        w
    }
}

impl Decode for Q5_K {
    const UNIT_BYTES: usize = 176;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // Nibble G % 2 of qs[32(G/2)..], fifth bit G of qh[l]; (d * scale) * q - (dmin * min).
        let qs = block.add(48 + 32 * (G / 2));
        let q = |i: usize| {
            let low = vandq_u8(shr(vld1q_u8(qs.add(16 * i)), 4 * (G % 2)), vdupq_n_u8(0x0F));
            let fifth = vandq_u8(shr(vld1q_u8(block.add(16 + 16 * i)), G), vdupq_n_u8(1));
            vorrq_u8(low, vshlq_n_u8::<4>(fifth))
        };
        let mut w = widen32(q(0), q(1));
        let (dl, ml) = k4_scales(block, G);
        mul_sub(&mut w, dl, ml);
        w
    }
}

impl Decode for Q6_K {
    const UNIT_BYTES: usize = 210;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [V; 8] {
        // Group G = 4h + r: nibble r / 2 of ql[64h + 32(r % 2)..], top bits 2r.. of qh[32h..];
        // (d * scale) * (q - 32) with one i8 scale per 16 elements.
        let (h, r) = (G / 4, G % 4);
        let q = |i: usize| {
            let ql = vld1q_u8(block.add(64 * h + 32 * (r % 2) + 16 * i));
            let qh = vld1q_u8(block.add(128 + 32 * h + 16 * i));
            let low = vandq_u8(shr(ql, 4 * (r / 2)), vdupq_n_u8(0x0F));
            let top = vandq_u8(shr(qh, 2 * r), vdupq_n_u8(3));
            vsubq_u8(vorrq_u8(low, vshlq_n_u8::<4>(top)), vdupq_n_u8(32))
        };
        let mut w = widen32(q(0), q(1));
        let d = f16_at(block.add(208));
        let scales = block.add(192 + 2 * G) as *const i8;
        for (i, half) in w.chunks_exact_mut(4).enumerate() {
            mul(half, d * *scales.add(i) as f32);
        }
        w
    }
}

/// See `PackFn`: 16 rows, transposed as 4x4 squares.
unsafe fn pack(rows: *const f32, row_stride: usize, depth: usize, packed: *mut f32) {
    let squares = depth / 4;
    for kb in 0..squares {
        for quarter in 0..4 {
            let row = |i: usize| vld1q_f32(rows.add((4 * quarter + i) * row_stride + 4 * kb));
            let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
            let (t0, t1) = (vtrn1q_f32(r0, r1), vtrn2q_f32(r0, r1));
            let (t2, t3) = (vtrn1q_f32(r2, r3), vtrn2q_f32(r2, r3));
            let pairs = |a: V, b: V, high: bool| {
                let (a, b) = (vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b));
                vreinterpretq_f32_f64(if high {
                    vtrn2q_f64(a, b)
                } else {
                    vtrn1q_f64(a, b)
                })
            };
            let columns = [
                pairs(t0, t2, false),
                pairs(t1, t3, false),
                pairs(t0, t2, true),
                pairs(t1, t3, true),
            ];
            for (c, v) in columns.iter().enumerate() {
                vst1q_f32(packed.add((4 * kb + c) * 16 + 4 * quarter), *v);
            }
        }
    }
    pack_columns(rows, row_stride, 16, 4 * squares, depth, packed);
}

/// The register tile: `T` tokens x 16 rows (four vectors), see `TileFn`.
unsafe fn tile<const T: usize>(
    panel: *const f32,
    depth: usize,
    x: *const f32,
    x_stride: usize,
    y: *mut f32,
    y_stride: usize,
    accumulate: bool,
) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    if accumulate {
        for (t, acc) in acc.iter_mut().enumerate() {
            for (i, v) in acc.iter_mut().enumerate() {
                *v = vld1q_f32(y.add(t * y_stride + 4 * i));
            }
        }
    }
    for k in 0..depth {
        let p = panel.add(16 * k);
        let a = [
            vld1q_f32(p),
            vld1q_f32(p.add(4)),
            vld1q_f32(p.add(8)),
            vld1q_f32(p.add(12)),
        ];
        for (t, acc) in acc.iter_mut().enumerate() {
            let b = vdupq_n_f32(*x.add(t * x_stride + k));
            for (v, a) in acc.iter_mut().zip(a) {
                *v = vfmaq_f32(*v, a, b);
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        for (i, v) in acc.iter().enumerate() {
            vst1q_f32(y.add(t * y_stride + 4 * i), *v);
        }
    }
}
