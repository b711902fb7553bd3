//! WebAssembly SIMD128 kernels (built with `-C target-feature=+simd128`): 4 f32 lanes. Plain
//! simd128 has no fused multiply-add, so sums are a multiply then an add.
//!
//! Fused decoders for every type but F16, which has no hardware conversion here: it goes
//! through the scalar dequantizer into a small buffer and a SIMD f32 dot.

use super::formats::*;
use super::{dot_via_buffer, k4_scales_mins, pack_columns, q3_k_scales, Gemm, Kernels};
use crate::{scalar, TensorType};
use core::arch::wasm32::*;

pub(super) static KERNELS: Kernels = Kernels {
    dot,
    rows,
    columns: Some(columns),
    dequant,
    vecmat: super::fallback::vecmat,
    gemm: Gemm {
        panel_rows: 8,
        depth_block: 256,
        tiles: &[tile::<1>, tile::<2>, tile::<3>, tile::<4>],
        pack,
    },
};

/// See `RowsFn`: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K through integer dots over limb-split activations
/// (see `simd128_limbs`), the rest one fused dot per row.
unsafe fn rows(ty: TensorType, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]) {
    if limb_type(ty) && limbs() && super::simd128_limbs::rows(ty, w, row_bytes, x, y) {
        return;
    }
    super::rows_by_dot(dot, ty, w, row_bytes, x, y)
}

/// See `ColumnsFn`: the limb kernels' multi-column form where `rows` takes them (declining
/// where they decline: each column then goes to `rows`); other types decline.
unsafe fn columns(
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    cols: usize,
    ys: &mut [&mut [f32]],
) -> bool {
    limb_type(ty) && limbs() && super::simd128_limbs::columns(ty, w, row_bytes, x, cols, ys)
}

/// The types the limb kernels (`simd128_limbs`) compute.
fn limb_type(ty: TensorType) -> bool {
    matches!(
        ty,
        TensorType::Q4_0
            | TensorType::Q4_1
            | TensorType::Q5_0
            | TensorType::Q8_0
            | TensorType::Q4_K
            | TensorType::Q6_K
    )
}

/// Whether `rows` may take the limb kernels: `LEAN_LIMBS` is not "0" (read where the
/// environment exists: Node's WASI, for comparing the two paths; browsers have none).
fn limbs() -> bool {
    static LIMBS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LIMBS.get_or_init(|| std::env::var("LEAN_LIMBS").map_or(true, |v| v.trim() != "0"))
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

/// A tensor type's decoder. A unit is a block (for float types: 32 elements), made of
/// `GROUPS` groups of 32 weights.
trait Decode {
    const UNIT_BYTES: usize;
    const GROUPS: usize;
    /// The 32 weights of group `G` of the unit at `unit`, each bit-identical to
    /// `scalar::dequantize`'s. Safety: `unit` points at a whole unit; `G < GROUPS`.
    unsafe fn group<const G: usize>(unit: *const u8) -> [v128; 8];
}

/// `acc += w * x[..32]`. Safety: `x` covers 32 elements.
#[inline(always)]
unsafe fn mul_add_acc(acc: &mut [v128; 8], w: [v128; 8], x: *const f32) {
    for i in 0..8 {
        let xv = v128_load(x.add(4 * i) as *const v128);
        acc[i] = f32x4_add(acc[i], f32x4_mul(w[i], xv));
    }
}

fn sum_lanes(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v)
        + f32x4_extract_lane::<1>(v)
        + f32x4_extract_lane::<2>(v)
        + f32x4_extract_lane::<3>(v)
}

/// Fused dot over whole units: `x.len()` must be a multiple of `32 * D::GROUPS` and `row` hold
/// the matching units.
unsafe fn dot_blocks<D: Decode>(row: &[u8], x: &[f32]) -> f32 {
    let units = x.len() / (32 * D::GROUPS);
    let (w, x) = (row.as_ptr(), x.as_ptr());
    // Eight independent sums (one per vector of a group) hide the add latency.
    let mut acc = [f32x4_splat(0.0); 8];
    for u in 0..units {
        let unit = w.add(u * D::UNIT_BYTES);
        let xs = x.add(u * 32 * D::GROUPS);
        macro_rules! groups {
            ($($g:literal),*) => { $( if $g < D::GROUPS {
                mul_add_acc(&mut acc, D::group::<$g>(unit), xs.add(32 * $g));
            } )* };
        }
        groups!(0, 1, 2, 3, 4, 5, 6, 7);
    }
    let quad = |i: usize| f32x4_add(acc[i], acc[i + 4]);
    sum_lanes(f32x4_add(
        f32x4_add(quad(0), quad(1)),
        f32x4_add(quad(2), quad(3)),
    ))
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
                    v128_store(o.add(32 * $g + 4 * i) as *mut v128, *v);
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
    let mut acc = [f32x4_splat(0.0); 8];
    for i in (0..body).step_by(32) {
        let mut wv = [f32x4_splat(0.0); 8];
        for (j, v) in wv.iter_mut().enumerate() {
            // SAFETY: i + 32 <= body <= w.len().
            *v = unsafe { v128_load(w.as_ptr().add(i + 4 * j) as *const v128) };
        }
        // SAFETY: x has as many elements as w.
        unsafe { mul_add_acc(&mut acc, wv, x.as_ptr().add(i)) };
    }
    let quad = |i: usize| f32x4_add(acc[i], acc[i + 4]);
    let tail: f32 = w[body..].iter().zip(&x[body..]).map(|(w, x)| w * x).sum();
    sum_lanes(f32x4_add(
        f32x4_add(quad(0), quad(1)),
        f32x4_add(quad(2), quad(3)),
    )) + tail
}

unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits((p as *const u16).read_unaligned()).to_f32()
}

unsafe fn load(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

/// 16 signed bytes as four vectors of f32.
fn widen16(v: v128) -> [v128; 4] {
    let (lo, hi) = (i16x8_extend_low_i8x16(v), i16x8_extend_high_i8x16(v));
    [
        f32x4_convert_i32x4(i32x4_extend_low_i16x8(lo)),
        f32x4_convert_i32x4(i32x4_extend_high_i16x8(lo)),
        f32x4_convert_i32x4(i32x4_extend_low_i16x8(hi)),
        f32x4_convert_i32x4(i32x4_extend_high_i16x8(hi)),
    ]
}

/// 32 signed bytes (two vectors) as eight vectors of f32.
fn widen32(a: v128, b: v128) -> [v128; 8] {
    let [w0, w1, w2, w3] = widen16(a);
    let [w4, w5, w6, w7] = widen16(b);
    [w0, w1, w2, w3, w4, w5, w6, w7]
}

/// Byte i = 0x10 where bit i of the 16-bit `bits` is set, else 0.
fn fifth_bits(bits: u32) -> v128 {
    let spread = i8x16_swizzle(
        u32x4_splat(bits),
        i8x16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
    );
    let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    v128_and(i8x16_eq(v128_and(spread, bit), bit), u8x16_splat(0x10))
}

/// `a * w + b` per vector, unfused.
fn mul_add(w: &mut [v128], a: f32, b: f32) {
    let (a, b) = (f32x4_splat(a), f32x4_splat(b));
    for v in w {
        *v = f32x4_add(f32x4_mul(a, *v), b);
    }
}

/// `a * w - b` per vector, unfused.
fn mul_sub(w: &mut [v128], a: f32, b: f32) {
    let (a, b) = (f32x4_splat(a), f32x4_splat(b));
    for v in w {
        *v = f32x4_sub(f32x4_mul(a, *v), b);
    }
}

fn mul(w: &mut [v128], a: f32) {
    let a = f32x4_splat(a);
    for v in w {
        *v = f32x4_mul(a, *v);
    }
}

impl Decode for F32 {
    const UNIT_BYTES: usize = 128;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(unit: *const u8) -> [v128; 8] {
        let mut w = [f32x4_splat(0.0); 8];
        for (i, v) in w.iter_mut().enumerate() {
            *v = load(unit.add(16 * i));
        }
        w
    }
}

impl Decode for BF16 {
    const UNIT_BYTES: usize = 64;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(unit: *const u8) -> [v128; 8] {
        let mut w = [f32x4_splat(0.0); 8];
        for (i, pair) in w.chunks_exact_mut(2).enumerate() {
            let halves = load(unit.add(16 * i));
            for (v, bits) in pair.iter_mut().zip([
                u32x4_extend_low_u16x8(halves),
                u32x4_extend_high_u16x8(halves),
            ]) {
                let bits = i32x4_shl(bits, 16);
                // Like `half::bf16::to_f32`, NaNs come out quiet.
                let nan = i32x4_gt(
                    v128_and(bits, i32x4_splat(0x7FFF_FFFF)),
                    i32x4_splat(0x7F80_0000),
                );
                *v = v128_or(bits, v128_and(nan, i32x4_splat(0x0040_0000)));
            }
        }
        w
    }
}

/// The low and high nibbles of a legacy block's 16 quant bytes: elements 0..16 and 16..32.
unsafe fn nibbles(qs: *const u8) -> (v128, v128) {
    let q = load(qs);
    (v128_and(q, u8x16_splat(0x0F)), u8x16_shr(q, 4))
}

impl Decode for Q4_0 {
    const UNIT_BYTES: usize = 18;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // d * (q - 8)
        let (lo, hi) = nibbles(block.add(2));
        let eight = u8x16_splat(8);
        let mut w = widen32(i8x16_sub(lo, eight), i8x16_sub(hi, eight));
        mul(&mut w, f16_at(block));
        w
    }
}

impl Decode for Q4_1 {
    const UNIT_BYTES: usize = 20;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
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
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // d * (q - 16), q = nibble | fifth bit << 4
        let qh = (block.add(2) as *const u32).read_unaligned();
        let (lo, hi) = nibbles(block.add(6));
        let sixteen = u8x16_splat(16);
        let lo = i8x16_sub(v128_or(lo, fifth_bits(qh & 0xFFFF)), sixteen);
        let hi = i8x16_sub(v128_or(hi, fifth_bits(qh >> 16)), sixteen);
        let mut w = widen32(lo, hi);
        mul(&mut w, f16_at(block));
        w
    }
}

impl Decode for Q5_1 {
    const UNIT_BYTES: usize = 24;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // d * q + m, q = nibble | fifth bit << 4
        let qh = (block.add(4) as *const u32).read_unaligned();
        let (lo, hi) = nibbles(block.add(8));
        let mut w = widen32(
            v128_or(lo, fifth_bits(qh & 0xFFFF)),
            v128_or(hi, fifth_bits(qh >> 16)),
        );
        mul_add(&mut w, f16_at(block), f16_at(block.add(2)));
        w
    }
}

impl Decode for Q8_0 {
    const UNIT_BYTES: usize = 34;
    const GROUPS: usize = 1;
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // q * d
        let mut w = widen32(load(block.add(2)), load(block.add(18)));
        mul(&mut w, f16_at(block));
        w
    }
}

impl Decode for Q2_K {
    const UNIT_BYTES: usize = 84;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // Group G = 4h + j: bits 2j.. of qs[32h..32h + 32]; (d * scale) * q - (dmin * min) with
        // one (scale, min) byte per 16 elements.
        let (d, dmin) = (f16_at(block.add(80)), f16_at(block.add(82)));
        let qs = block.add(16 + 32 * (G / 4));
        let bits = |p: *const u8| v128_and(u8x16_shr(load(p), 2 * (G % 4) as u32), u8x16_splat(3));
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
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // Group G = 4h + j: low bits 2j.. of qs[32h..], third bit G of hmask[l] (clear: -4);
        // (d * scale) * q with one scale per 16 elements.
        let d = f16_at(block.add(108));
        let packed = &*(block.add(96) as *const [u8; 12]);
        let qs = block.add(32 + 32 * (G / 4));
        let q = |i: usize| {
            let low = v128_and(
                u8x16_shr(load(qs.add(16 * i)), 2 * (G % 4) as u32),
                u8x16_splat(3),
            );
            let third = v128_and(u8x16_shr(load(block.add(16 * i)), G as u32), u8x16_splat(1));
            i8x16_sub(v128_or(low, i8x16_shl(third, 2)), u8x16_splat(4))
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
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // Nibble G % 2 of qs[32(G/2)..]; (d * scale) * q - (dmin * min).
        let qs = block.add(16 + 32 * (G / 2));
        let q = |p: *const u8| v128_and(u8x16_shr(load(p), 4 * (G % 2) as u32), u8x16_splat(0x0F));
        let mut w = widen32(q(qs), q(qs.add(16)));
        let (dl, ml) = k4_scales(block, G);
        mul_sub(&mut w, dl, ml);
        w
    }
}

impl Decode for Q5_K {
    const UNIT_BYTES: usize = 176;
    const GROUPS: usize = 8;
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // Nibble G % 2 of qs[32(G/2)..], fifth bit G of qh[l]; (d * scale) * q - (dmin * min).
        let qs = block.add(48 + 32 * (G / 2));
        let q = |i: usize| {
            let low = v128_and(
                u8x16_shr(load(qs.add(16 * i)), 4 * (G % 2) as u32),
                u8x16_splat(0x0F),
            );
            let fifth = v128_and(
                u8x16_shr(load(block.add(16 + 16 * i)), G as u32),
                u8x16_splat(1),
            );
            v128_or(low, i8x16_shl(fifth, 4))
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
    unsafe fn group<const G: usize>(block: *const u8) -> [v128; 8] {
        // Group G = 4h + r: nibble r / 2 of ql[64h + 32(r % 2)..], top bits 2r.. of qh[32h..];
        // (d * scale) * (q - 32) with one i8 scale per 16 elements.
        let (h, r) = (G / 4, G % 4);
        let q = |i: usize| {
            let ql = load(block.add(64 * h + 32 * (r % 2) + 16 * i));
            let qh = load(block.add(128 + 32 * h + 16 * i));
            let low = v128_and(u8x16_shr(ql, 4 * (r / 2) as u32), u8x16_splat(0x0F));
            let top = v128_and(u8x16_shr(qh, 2 * r as u32), u8x16_splat(3));
            i8x16_sub(v128_or(low, i8x16_shl(top, 4)), u8x16_splat(32))
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

/// See `PackFn`: 8 rows, transposed as 4x4 squares.
unsafe fn pack(rows: *const f32, row_stride: usize, depth: usize, packed: *mut f32) {
    let squares = depth / 4;
    for kb in 0..squares {
        for half in 0..2 {
            let row =
                |i: usize| v128_load(rows.add((4 * half + i) * row_stride + 4 * kb) as *const v128);
            let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
            let (t0, t1) = (
                i32x4_shuffle::<0, 4, 1, 5>(r0, r1),
                i32x4_shuffle::<2, 6, 3, 7>(r0, r1),
            );
            let (t2, t3) = (
                i32x4_shuffle::<0, 4, 1, 5>(r2, r3),
                i32x4_shuffle::<2, 6, 3, 7>(r2, r3),
            );
            let columns = [
                i32x4_shuffle::<0, 1, 4, 5>(t0, t2),
                i32x4_shuffle::<2, 3, 6, 7>(t0, t2),
                i32x4_shuffle::<0, 1, 4, 5>(t1, t3),
                i32x4_shuffle::<2, 3, 6, 7>(t1, t3),
            ];
            for (c, v) in columns.iter().enumerate() {
                v128_store(packed.add((4 * kb + c) * 8 + 4 * half) as *mut v128, *v);
            }
        }
    }
    pack_columns(rows, row_stride, 8, 4 * squares, depth, packed);
}

/// The register tile: `T` tokens x 8 rows (two vectors), see `TileFn`.
unsafe fn tile<const T: usize>(
    panel: *const f32,
    depth: usize,
    x: *const f32,
    x_stride: usize,
    y: *mut f32,
    y_stride: usize,
    accumulate: bool,
) {
    let mut acc = [[f32x4_splat(0.0); 2]; T];
    if accumulate {
        for (t, acc) in acc.iter_mut().enumerate() {
            let y = y.add(t * y_stride);
            *acc = [
                v128_load(y as *const v128),
                v128_load(y.add(4) as *const v128),
            ];
        }
    }
    for k in 0..depth {
        let a0 = v128_load(panel.add(8 * k) as *const v128);
        let a1 = v128_load(panel.add(8 * k + 4) as *const v128);
        for (t, acc) in acc.iter_mut().enumerate() {
            let b = f32x4_splat(*x.add(t * x_stride + k));
            acc[0] = f32x4_add(acc[0], f32x4_mul(a0, b));
            acc[1] = f32x4_add(acc[1], f32x4_mul(a1, b));
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        let y = y.add(t * y_stride);
        v128_store(y as *mut v128, acc[0]);
        v128_store(y.add(4) as *mut v128, acc[1]);
    }
}
