//! AVX-512 kernels (F, BW, VL; with FMA and F16C): 16 f32 lanes, fused decoders for every type.
//!
//! Small quants (4, 5 and the 2/3-bit K-quant fields) decode through a 16-entry table per
//! scale: `table[q]` is computed with exactly the scalar dequantizer's f32 operations, so
//! `vpermps` by the quant yields bit-identical weights for one op per 16 weights.

use super::formats::*;
use super::{k4_scales_mins, pack_columns, q3_k_scales, Gemm, Kernels, Strided, COLUMN_BLOCK};
use crate::TensorType;
use std::arch::x86_64::*;

pub(super) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(super) static KERNELS: Kernels = Kernels {
    dot,
    rows,
    columns: Some(columns),
    dequant,
    vecmat,
    gemm: Gemm {
        panel_rows: 32,
        depth_block: 128,
        tiles: &[
            tile::<1>, tile::<2>, tile::<3>, tile::<4>, tile::<5>, tile::<6>, tile::<7>, tile::<8>,
            tile::<9>, tile::<10>, tile::<11>, tile::<12>,
        ],
        pack,
    },
};

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

/// See `RowsFn`: Q4_0, Q4_1 and Q5_0 through the VNNI kernels where the CPU has them (limb-split
/// activations, see `avx512_vnni`), otherwise one fused dot per row. (The VNNI Q8_0 kernel is
/// ~20% faster in cache but measured 3x slower on a 30 MB LM head streamed from memory on Zen 4,
/// so Q8_0 stays on the f32 kernel.) (Passes over several rows
/// at once, sharing the activation loads, measured ~5% faster on matrices in cache but up to 2x
/// slower on a Q8_0 LM head streamed from memory.)
unsafe fn rows(ty: TensorType, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]) {
    if matches!(ty, TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q5_0)
        && vnni()
        && super::avx512_vnni::rows(ty, w, row_bytes, x, y)
    {
        return;
    }
    super::rows_by_dot(dot, ty, w, row_bytes, x, y)
}

/// See `ColumnsFn`: the VNNI kernels' multi-column form where `rows` takes them (declining
/// where they decline: each column then goes to `rows`, the VNNI kernels for the others); for
/// the other block types `dot_blocks_columns`, each block decoded once for up to
/// `COLUMN_CHUNK` columns; float types decline.
unsafe fn columns(
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    cols: usize,
    ys: &mut [&mut [f32]],
) -> bool {
    if matches!(ty, TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q5_0) && vnni() {
        return super::avx512_vnni::columns(ty, w, row_bytes, x, cols, ys);
    }
    macro_rules! by_type {
        ($c:literal) => {
            match ty {
                TensorType::Q4_0 => dot_blocks_columns::<Q4_0, $c>,
                TensorType::Q4_1 => dot_blocks_columns::<Q4_1, $c>,
                TensorType::Q5_0 => dot_blocks_columns::<Q5_0, $c>,
                TensorType::Q5_1 => dot_blocks_columns::<Q5_1, $c>,
                TensorType::Q8_0 => dot_blocks_columns::<Q8_0, $c>,
                TensorType::Q2_K => dot_blocks_columns::<Q2_K, $c>,
                TensorType::Q3_K => dot_blocks_columns::<Q3_K, $c>,
                TensorType::Q4_K => dot_blocks_columns::<Q4_K, $c>,
                TensorType::Q5_K => dot_blocks_columns::<Q5_K, $c>,
                TensorType::Q6_K => dot_blocks_columns::<Q6_K, $c>,
                TensorType::F32 | TensorType::F16 | TensorType::BF16 => return false,
            }
        };
    }
    for first in (0..ys.len()).step_by(COLUMN_CHUNK) {
        let chunk = (ys.len() - first).min(COLUMN_CHUNK);
        let xs = x[first * cols..].as_ptr();
        let dots: unsafe fn(*const u8, *const f32, usize) -> [f32; COLUMN_CHUNK] = match chunk {
            1 => by_type!(1),
            2 => by_type!(2),
            3 => by_type!(3),
            _ => by_type!(4),
        };
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            super::prefetch_ahead(w, r * row_bytes..(r + 1) * row_bytes);
            let out = dots(row.as_ptr(), xs, cols);
            for (y, value) in ys[first..first + chunk].iter_mut().zip(out) {
                y[r] = value;
            }
        }
    }
    true
}

/// Columns `dot_blocks_columns` takes at once (four accumulators each: 16 registers).
const COLUMN_CHUNK: usize = 4;

/// Whether `rows` may take the VNNI kernels: the CPU has them and `LEAN_VNNI` is not "0" (for
/// comparing the two on one machine).
fn vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        super::avx512_vnni::supported()
            && std::env::var("LEAN_VNNI").map_or(true, |v| v.trim() != "0")
    })
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
///
/// K-quant scales reach `group` through memory: the loops write a unit's scales to a buffer
/// and `group` broadcast-loads them, which costs no shuffle; shuffles (widening, table
/// lookups, register broadcasts) are what limits these kernels on AVX-512.
trait Decode {
    const UNIT_BYTES: usize;
    const GROUPS: usize;
    /// K-quants: writes the f32 scales the unit's groups share. Safety: the CPU has this
    /// module's features; `unit` points at a whole unit.
    unsafe fn scales(_unit: *const u8, _out: &mut Scales) {}
    /// The 32 weights of group `G` of the unit at `unit`, each bit-identical to
    /// `scalar::dequantize`'s (a compile-time group index lets shifts and offsets fold).
    /// `scales` points at this unit's `scales` output (K-quants).
    /// Safety: as `scales`, with `G < GROUPS`.
    unsafe fn group<const G: usize>(unit: *const u8, scales: *const f32) -> [__m512; 2];
}

type Scales = [f32; 32];

/// `p[i]` in every lane, as a broadcast load.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn splat_at(p: *const f32, i: usize) -> __m512 {
    _mm512_set1_ps(*p.add(i))
}

/// Fused dot over whole units: `x.len()` must be a multiple of `32 * D::GROUPS` and `row` hold
/// the matching units. The one-column case of `dot_blocks_columns`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_blocks<D: Decode>(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks_columns::<D, 1>(row.as_ptr(), x.as_ptr(), x.len())[0]
}

/// Fused dot of one row (whole units: `cols` a multiple of `32 * D::GROUPS`) against `C`
/// activations (`cols` elements each, one after another at `x`), each block decoded once:
/// column c's sums are the same operations in the same order whatever `C` is, so `C` = 1
/// (`dot_blocks`) gives each column's value alone bit for bit. Returns `COLUMN_CHUNK` values,
/// the first `C` of them set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_blocks_columns<D: Decode, const C: usize>(
    w: *const u8,
    x: *const f32,
    cols: usize,
) -> [f32; COLUMN_CHUNK] {
    let units = cols / (32 * D::GROUPS);
    // Consecutive groups alternate between two accumulator sets, so that each FMA chain has
    // time to retire while the next group decodes.
    let mut even = [[_mm512_setzero_ps(); 2]; C];
    let mut odd = [[_mm512_setzero_ps(); 2]; C];
    let fma = |acc: &mut [[__m512; 2]; C], wv: [__m512; 2], at: usize| {
        for (c, acc) in acc.iter_mut().enumerate() {
            let xs = x.add(c * cols + at);
            acc[0] = _mm512_fmadd_ps(wv[0], _mm512_loadu_ps(xs), acc[0]);
            acc[1] = _mm512_fmadd_ps(wv[1], _mm512_loadu_ps(xs.add(16)), acc[1]);
        }
    };
    let mut buf: Scales = [0.0; 32];
    let single = |unit: *const u8| D::group::<0>(unit, std::ptr::null());
    if D::GROUPS == 1 {
        let mut u = 0;
        while u + 2 <= units {
            fma(&mut even, single(w.add(u * D::UNIT_BYTES)), u * 32);
            fma(
                &mut odd,
                single(w.add((u + 1) * D::UNIT_BYTES)),
                u * 32 + 32,
            );
            u += 2;
        }
        if u < units {
            fma(&mut even, single(w.add(u * D::UNIT_BYTES)), u * 32);
        }
    } else {
        debug_assert_eq!(D::GROUPS, 8);
        for u in 0..units {
            let unit = w.add(u * D::UNIT_BYTES);
            D::scales(unit, &mut buf);
            let scales = std::hint::black_box(buf.as_ptr());
            let at = u * 256;
            macro_rules! groups {
                ($($g:literal => $acc:ident),*) => { $( fma(&mut $acc, D::group::<$g>(unit, scales), at + 32 * $g); )* };
            }
            groups!(0 => even, 1 => odd, 2 => even, 3 => odd, 4 => even, 5 => odd, 6 => even, 7 => odd);
        }
    }
    let mut out = [0.0; COLUMN_CHUNK];
    for c in 0..C {
        let sum = _mm512_add_ps(
            _mm512_add_ps(even[c][0], even[c][1]),
            _mm512_add_ps(odd[c][0], odd[c][1]),
        );
        out[c] = _mm512_reduce_add_ps(sum);
    }
    out
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dequant_blocks<D: Decode>(src: &[u8], dst: &mut [f32]) {
    let units = dst.len() / (32 * D::GROUPS);
    let (w, out) = (src.as_ptr(), dst.as_mut_ptr());
    let mut buf: Scales = [0.0; 32];
    let store = |o: *mut f32, wv: [__m512; 2]| {
        _mm512_storeu_ps(o, wv[0]);
        _mm512_storeu_ps(o.add(16), wv[1]);
    };
    if D::GROUPS == 1 {
        for u in 0..units {
            store(
                out.add(u * 32),
                D::group::<0>(w.add(u * D::UNIT_BYTES), std::ptr::null()),
            );
        }
    } else {
        for u in 0..units {
            let unit = w.add(u * D::UNIT_BYTES);
            D::scales(unit, &mut buf);
            let scales = std::hint::black_box(buf.as_ptr());
            let o = out.add(u * 256);
            macro_rules! groups {
                ($($g:literal),*) => { $( store(o.add(32 * $g), D::group::<$g>(unit, scales)); )* };
            }
            groups!(0, 1, 2, 3, 4, 5, 6, 7);
        }
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

/// The f16 at `p` in every lane. (Converting a broadcast keeps the compiler from merging a
/// scalar into a stale register, which chained every block behind the previous one's FMAs.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn f16_splat(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()))
}

/// Two f16 at `p` alternating across the lanes: `[a, b, a, b, ...]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn f16_pair_splat(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi32((p as *const i32).read_unaligned()))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn load_iota(values: &[f32; 16]) -> __m512 {
    _mm512_loadu_ps(values.as_ptr())
}

/// The 16 bytes at `p` widened to one u32 lane each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn bytes16(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
}

/// `table[idx & 15]` per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn lookup(idx: __m512i, table: __m512) -> __m512 {
    _mm512_permutexvar_ps(idx, table)
}

/// 32-entry lookup: `high` where the lane's bit of `fifth_bits` is set, else `low`, by `idx & 15`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn lookup32(idx: __m512i, low: __m512, high: __m512, fifth_bits: __mmask16) -> __m512 {
    _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(idx, low), fifth_bits, idx, high)
}

/// `[start, start + 1, ..., start + 15]`: the quant values a 16-entry lookup table covers.
const fn iota16(start: f32) -> [f32; 16] {
    let mut out = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = start + i as f32;
        i += 1;
    }
    out
}

const IOTA: [f32; 16] = iota16(0.0);
const IOTA_16: [f32; 16] = iota16(16.0);
const IOTA_M4: [f32; 16] = iota16(-4.0);
const IOTA_M8: [f32; 16] = iota16(-8.0);
const IOTA_M16: [f32; 16] = iota16(-16.0);

impl Decode for F32 {
    const UNIT_BYTES: usize = 128;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(unit: *const u8, _: *const f32) -> [__m512; 2] {
        let p = unit as *const f32;
        [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
    }
}

impl Decode for F16 {
    const UNIT_BYTES: usize = 64;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(unit: *const u8, _: *const f32) -> [__m512; 2] {
        let p = unit as *const __m256i;
        [
            _mm512_cvtph_ps(_mm256_loadu_si256(p)),
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(1))),
        ]
    }
}

impl Decode for BF16 {
    const UNIT_BYTES: usize = 64;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(unit: *const u8, _: *const f32) -> [__m512; 2] {
        let p = unit as *const __m256i;
        let widen = |half: __m256i| {
            let bits = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(half));
            // Like `half::bf16::to_f32`, NaNs come out quiet.
            let magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
            let nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7F80_0000));
            _mm512_castsi512_ps(_mm512_mask_or_epi32(
                bits,
                nan,
                bits,
                _mm512_set1_epi32(0x0040_0000),
            ))
        };
        [
            widen(_mm256_loadu_si256(p)),
            widen(_mm256_loadu_si256(p.add(1))),
        ]
    }
}

impl Decode for Q4_0 {
    const UNIT_BYTES: usize = 18;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: *const f32) -> [__m512; 2] {
        // d * (q - 8)
        let table = _mm512_mul_ps(f16_splat(block), load_iota(&IOTA_M8));
        let q = bytes16(block.add(2));
        [lookup(q, table), lookup(_mm512_srli_epi32::<4>(q), table)]
    }
}

impl Decode for Q4_1 {
    const UNIT_BYTES: usize = 20;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: *const f32) -> [__m512; 2] {
        // d * q + m
        let table = _mm512_add_ps(
            _mm512_mul_ps(f16_splat(block), load_iota(&IOTA)),
            f16_splat(block.add(2)),
        );
        let q = bytes16(block.add(4));
        [lookup(q, table), lookup(_mm512_srli_epi32::<4>(q), table)]
    }
}

impl Decode for Q5_0 {
    const UNIT_BYTES: usize = 22;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: *const f32) -> [__m512; 2] {
        // d * (q - 16), q = nibble | fifth bit << 4
        let d = f16_splat(block);
        let low = _mm512_mul_ps(d, load_iota(&IOTA_M16));
        let high = _mm512_mul_ps(d, load_iota(&IOTA));
        let qh = (block.add(2) as *const u32).read_unaligned();
        let q = bytes16(block.add(6));
        [
            lookup32(q, low, high, qh as u16),
            lookup32(_mm512_srli_epi32::<4>(q), low, high, (qh >> 16) as u16),
        ]
    }
}

impl Decode for Q5_1 {
    const UNIT_BYTES: usize = 24;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: *const f32) -> [__m512; 2] {
        // d * q + m, q = nibble | fifth bit << 4
        let (d, m) = (f16_splat(block), f16_splat(block.add(2)));
        let low = _mm512_add_ps(_mm512_mul_ps(d, load_iota(&IOTA)), m);
        let high = _mm512_add_ps(_mm512_mul_ps(d, load_iota(&IOTA_16)), m);
        let qh = (block.add(4) as *const u32).read_unaligned();
        let q = bytes16(block.add(8));
        [
            lookup32(q, low, high, qh as u16),
            lookup32(_mm512_srli_epi32::<4>(q), low, high, (qh >> 16) as u16),
        ]
    }
}

impl Decode for Q8_0 {
    const UNIT_BYTES: usize = 34;
    const GROUPS: usize = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, _: *const f32) -> [__m512; 2] {
        // q * d
        let d = f16_splat(block);
        let q = |p: *const u8| {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
        };
        [
            _mm512_mul_ps(q(block.add(2)), d),
            _mm512_mul_ps(q(block.add(18)), d),
        ]
    }
}

impl Decode for Q2_K {
    const UNIT_BYTES: usize = 84;
    const GROUPS: usize = 8;
    /// `d * scale` of the sixteen 16-element sub-blocks, then their `dmin * min`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scales(block: *const u8, out: &mut Scales) {
        let bytes = bytes16(block);
        let scales = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)));
        let mins = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(bytes));
        _mm512_storeu_ps(
            out.as_mut_ptr(),
            _mm512_mul_ps(f16_splat(block.add(80)), scales),
        );
        _mm512_storeu_ps(
            out.as_mut_ptr().add(16),
            _mm512_mul_ps(f16_splat(block.add(82)), mins),
        );
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, scales: *const f32) -> [__m512; 2] {
        // Group G = 4h + j: bits 2j.. of qs[32h..32h + 32]; (d * scale) * q - (dmin * min),
        // sub-block 2G + i for the i-th 16 elements.
        let qs = block.add(16 + 32 * (G / 4));
        let shift = _mm_cvtsi32_si128(2 * (G % 4) as i32);
        let half = |i: usize| {
            let (dl, ml) = (
                splat_at(scales, 2 * G + i),
                splat_at(scales, 16 + 2 * G + i),
            );
            let table = _mm512_sub_ps(_mm512_mul_ps(dl, load_iota(&IOTA)), ml);
            let q = _mm512_and_si512(
                _mm512_srl_epi32(bytes16(qs.add(16 * i)), shift),
                _mm512_set1_epi32(3),
            );
            lookup(q, table)
        };
        [half(0), half(1)]
    }
}

impl Decode for Q3_K {
    const UNIT_BYTES: usize = 110;
    const GROUPS: usize = 8;
    /// `d * scale` of the sixteen 16-element sub-blocks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scales(block: *const u8, out: &mut Scales) {
        let [a, b, c, e] = q3_k_scales(&*(block.add(96) as *const [u8; 12]));
        let stored = _mm512_cvtepu8_epi32(_mm_setr_epi32(a as i32, b as i32, c as i32, e as i32));
        let scales = _mm512_cvtepi32_ps(_mm512_sub_epi32(stored, _mm512_set1_epi32(32)));
        _mm512_storeu_ps(
            out.as_mut_ptr(),
            _mm512_mul_ps(f16_splat(block.add(108)), scales),
        );
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, dl: *const f32) -> [__m512; 2] {
        // Group G = 4h + j: low bits 2j.. of qs[32h..], third bit G of hmask[l] (clear: -4);
        // (d * scale) * q. The table is indexed by q + 4 = low | third bit << 2.
        let hmask = _mm256_loadu_si256(block as *const __m256i);
        let third = _mm256_test_epi8_mask(hmask, _mm256_set1_epi8((1u8 << G) as i8));
        let qs = block.add(32 + 32 * (G / 4));
        let shift = _mm_cvtsi32_si128(2 * (G % 4) as i32);
        let half = |i: usize| {
            let table = _mm512_mul_ps(splat_at(dl, 2 * G + i), load_iota(&IOTA_M4));
            let low = _mm512_and_si512(
                _mm512_srl_epi32(bytes16(qs.add(16 * i)), shift),
                _mm512_set1_epi32(3),
            );
            let q =
                _mm512_mask_or_epi32(low, (third >> (16 * i)) as u16, low, _mm512_set1_epi32(4));
            lookup(q, table)
        };
        [half(0), half(1)]
    }
}

/// Q4_K/Q5_K: `[d * scale_0, dmin * min_0, d * scale_1, dmin * min_1, ...]` of the eight
/// 32-element sub-blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn k4_scales(block: *const u8, out: &mut Scales) {
    let (scales, mins) = k4_scales_mins(&*(block.add(4) as *const [u8; 12]));
    let pairs = _mm_unpacklo_epi8(
        _mm_cvtsi64_si128(scales as i64),
        _mm_cvtsi64_si128(mins as i64),
    );
    let products = _mm512_mul_ps(
        f16_pair_splat(block),
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pairs)),
    );
    _mm512_storeu_ps(out.as_mut_ptr(), products);
}

impl Decode for Q4_K {
    const UNIT_BYTES: usize = 144;
    const GROUPS: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scales(block: *const u8, out: &mut Scales) {
        k4_scales(block, out)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, scales: *const f32) -> [__m512; 2] {
        // Nibble G % 2 of qs[32(G/2)..]; (d * scale) * q - (dmin * min).
        let table = _mm512_sub_ps(
            _mm512_mul_ps(splat_at(scales, 2 * G), load_iota(&IOTA)),
            splat_at(scales, 2 * G + 1),
        );
        let qs = block.add(16 + 32 * (G / 2));
        let shift = _mm_cvtsi32_si128(4 * (G % 2) as i32);
        [
            lookup(_mm512_srl_epi32(bytes16(qs), shift), table),
            lookup(_mm512_srl_epi32(bytes16(qs.add(16)), shift), table),
        ]
    }
}

impl Decode for Q5_K {
    const UNIT_BYTES: usize = 176;
    const GROUPS: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scales(block: *const u8, out: &mut Scales) {
        k4_scales(block, out)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, scales: *const f32) -> [__m512; 2] {
        // Nibble G % 2 of qs[32(G/2)..], fifth bit G of qh[l]; (d * scale) * q - (dmin * min).
        let (dl, ml) = (splat_at(scales, 2 * G), splat_at(scales, 2 * G + 1));
        let low = _mm512_sub_ps(_mm512_mul_ps(dl, load_iota(&IOTA)), ml);
        let high = _mm512_sub_ps(_mm512_mul_ps(dl, load_iota(&IOTA_16)), ml);
        let qh = _mm256_loadu_si256(block.add(16) as *const __m256i);
        let fifth = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << G) as i8));
        let qs = block.add(48 + 32 * (G / 2));
        let shift = _mm_cvtsi32_si128(4 * (G % 2) as i32);
        [
            lookup32(
                _mm512_srl_epi32(bytes16(qs), shift),
                low,
                high,
                fifth as u16,
            ),
            lookup32(
                _mm512_srl_epi32(bytes16(qs.add(16)), shift),
                low,
                high,
                (fifth >> 16) as u16,
            ),
        ]
    }
}

impl Decode for Q6_K {
    const UNIT_BYTES: usize = 210;
    const GROUPS: usize = 8;
    /// `d * scale` of the sixteen 16-element sub-blocks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scales(block: *const u8, out: &mut Scales) {
        let scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            block.add(192) as *const __m128i
        )));
        _mm512_storeu_ps(
            out.as_mut_ptr(),
            _mm512_mul_ps(f16_splat(block.add(208)), scales),
        );
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const G: usize>(block: *const u8, dl: *const f32) -> [__m512; 2] {
        // Group G = 4h + r: nibble r / 2 of ql[64h + 32(r % 2)..], top bits 2r.. of qh[32h..];
        // (d * scale) * (q - 32), sub-block 2G + i for the i-th 16 elements.
        let (h, r) = (G / 4, G % 4);
        let ql = _mm256_loadu_si256(block.add(64 * h + 32 * (r % 2)) as *const __m256i);
        let qh = _mm256_loadu_si256(block.add(128 + 32 * h) as *const __m256i);
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
        let widen = |q: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
        [
            _mm512_mul_ps(splat_at(dl, 2 * G), widen(_mm256_castsi256_si128(q))),
            _mm512_mul_ps(
                splat_at(dl, 2 * G + 1),
                widen(_mm256_extracti128_si256::<1>(q)),
            ),
        ]
    }
}

/// See `PackFn`: 32 rows, transposed as 16x16 squares.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn pack(rows: *const f32, row_stride: usize, depth: usize, packed: *mut f32) {
    let squares = depth / 16;
    for kb in 0..squares {
        for half in 0..2 {
            let mut square = [_mm512_setzero_ps(); 16];
            for (i, v) in square.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(rows.add((16 * half + i) * row_stride + 16 * kb));
            }
            for (c, v) in transpose16(square).iter().enumerate() {
                _mm512_storeu_ps(packed.add((16 * kb + c) * 32 + 16 * half), *v);
            }
        }
    }
    pack_columns(rows, row_stride, 32, 16 * squares, depth, packed);
}

/// The transpose of a 16x16 block: `out[j]` lane `i` is `rows[i]` lane `j`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn transpose16(rows: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved, then 64-bit pairs: u[4g + c] has, in 128-bit lane L,
    // column 4L + c of rows 4g..4g + 4.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let r = &rows[4 * g..4 * g + 4];
        let (t0, t1) = (
            _mm512_unpacklo_ps(r[0], r[1]),
            _mm512_unpackhi_ps(r[0], r[1]),
        );
        let (t2, t3) = (
            _mm512_unpacklo_ps(r[2], r[3]),
            _mm512_unpackhi_ps(r[2], r[3]),
        );
        u[4 * g] = _mm512_shuffle_ps::<0x44>(t0, t2);
        u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(t0, t2);
        u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(t1, t3);
        u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(t1, t3);
    }
    // Then gather the four 128-bit lanes of each column.
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let low_lanes = (
            _mm512_shuffle_f32x4::<0x44>(u[c], u[4 + c]),
            _mm512_shuffle_f32x4::<0x44>(u[8 + c], u[12 + c]),
        );
        let high_lanes = (
            _mm512_shuffle_f32x4::<0xEE>(u[c], u[4 + c]),
            _mm512_shuffle_f32x4::<0xEE>(u[8 + c], u[12 + c]),
        );
        out[c] = _mm512_shuffle_f32x4::<0x88>(low_lanes.0, low_lanes.1);
        out[4 + c] = _mm512_shuffle_f32x4::<0xDD>(low_lanes.0, low_lanes.1);
        out[8 + c] = _mm512_shuffle_f32x4::<0x88>(high_lanes.0, high_lanes.1);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(high_lanes.0, high_lanes.1);
    }
    out
}

/// See `VecmatFn`: tiles of up to 8 rows of `a` x 32 columns (one column block: two vectors,
/// masked at the right edge) in registers, each row of `m` loaded once per tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn vecmat(a: *const f32, n: usize, depth: usize, m: Strided, cols: usize, y: *mut f32) {
    const TILES: [VecmatTile; 8] = [
        vecmat_tile::<1>,
        vecmat_tile::<2>,
        vecmat_tile::<3>,
        vecmat_tile::<4>,
        vecmat_tile::<5>,
        vecmat_tile::<6>,
        vecmat_tile::<7>,
        vecmat_tile::<8>,
    ];
    const _: () = assert!(COLUMN_BLOCK == 32);
    for j in (0..cols).step_by(COLUMN_BLOCK) {
        let width = (cols - j).min(COLUMN_BLOCK);
        let mask = |from: usize| {
            let lanes = width.saturating_sub(from).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        };
        let masks = [mask(0), mask(16)];
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

type VecmatTile = unsafe fn(*const f32, usize, *const f32, usize, *mut f32, usize, [__mmask16; 2]);

/// `R` rows of `a` (`depth` apart) times 32 columns of `m` (lanes outside `masks` are neither
/// read nor written) into `R` rows of `y` (`y_stride` apart).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn vecmat_tile<const R: usize>(
    a: *const f32,
    depth: usize,
    m: *const f32,
    m_stride: usize,
    y: *mut f32,
    y_stride: usize,
    masks: [__mmask16; 2],
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    // The cached keys and values stream from memory like the weights do (a small model's cache
    // at 512 positions is a third of its weights' bytes): ask for them ahead, as `rows` does.
    let ahead = super::prefetch_distance() / 4;
    for i in 0..depth {
        let row = m.add(i * m_stride);
        if ahead > 0 {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead + 16) as *const i8);
        }
        let m0 = _mm512_maskz_loadu_ps(masks[0], row);
        let m1 = _mm512_maskz_loadu_ps(masks[1], row.add(16));
        for (r, acc) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*a.add(r * depth + i));
            acc[0] = _mm512_fmadd_ps(m0, b, acc[0]);
            acc[1] = _mm512_fmadd_ps(m1, b, acc[1]);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let y = y.add(r * y_stride);
        _mm512_mask_storeu_ps(y, masks[0], acc[0]);
        _mm512_mask_storeu_ps(y.add(16), masks[1], acc[1]);
    }
}

/// The register tile: `T` tokens x 32 rows (two vectors), see `TileFn`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile<const T: usize>(
    panel: *const f32,
    depth: usize,
    x: *const f32,
    x_stride: usize,
    y: *mut f32,
    y_stride: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    if accumulate {
        for (t, acc) in acc.iter_mut().enumerate() {
            let y = y.add(t * y_stride);
            *acc = [_mm512_loadu_ps(y), _mm512_loadu_ps(y.add(16))];
        }
    }
    for k in 0..depth {
        let a0 = _mm512_loadu_ps(panel.add(32 * k));
        let a1 = _mm512_loadu_ps(panel.add(32 * k + 16));
        for (t, acc) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*x.add(t * x_stride + k));
            acc[0] = _mm512_fmadd_ps(a0, b, acc[0]);
            acc[1] = _mm512_fmadd_ps(a1, b, acc[1]);
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        let y = y.add(t * y_stride);
        _mm512_storeu_ps(y, acc[0]);
        _mm512_storeu_ps(y.add(16), acc[1]);
    }
}
