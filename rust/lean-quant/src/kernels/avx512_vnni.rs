//! AVX-512 VNNI matvec for Q4_0, Q4_1, Q5_0 and Q8_0: integer dots over the weights' own quants.
//!
//! The activations are NOT quantized to one int8: per 32-element block, x = s * (a0 + a1/128 +
//! a2/128^2) with s = max|x| / 127 and three int8 limbs (a0 in [-127, 127], a1, a2 in
//! [-64, 64]), which keeps 22 bits of each block (f32 keeps 24 per element; the dot error stays
//! in the range of f32 summation-order differences, see the tests). `vpdpbusd` (u8 weights x s8
//! limbs) gives each limb's dot; the limbs combine exactly in i32 as `a0<<14 + a1<<7 + a2`
//! (|sum| < 2^31 by construction), then one f32 multiply by `d * s / 2^14` per block.
//!
//! The limbs are laid out once per call in the order the kernels gather weight bytes, so the
//! inner loop needs no activation shuffles.

use crate::TensorType;
use std::arch::x86_64::*;
use std::cell::RefCell;

pub(super) fn supported() -> bool {
    super::avx512::supported()
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
}

/// Limb base: each limb after the first holds the previous one's rounding residual times this.
const BASE_BITS: i32 = 7;

/// Rows per pass.
const TILE: usize = 4;

/// One group of activations (Q4_0: 4 blocks = 128 elements; Q8_0: 2 blocks = 64), laid out to
/// match the bytes `Q4_0`'s / `Q8_0`'s gather produces.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Group {
    /// `limbs[k]` for Q8_0: limb k of the group's 64 elements in order. Q4_0, Q4_1, Q5_0: `limbs[2k]` holds
    /// limb k of elements 0..16 of each of the 4 blocks (16 bytes per block, low nibbles),
    /// `limbs[2k+1]` elements 16..32 (high nibbles).
    limbs: [[i8; 64]; 6],
    /// Per i32 lane: what the weights' offset adds, negated (Q4_0: -8 * the lane's combined
    /// limbs, Q5_0: -16 *; Q8_0: -128 * the lane's own limb sums, one vector per limb).
    offset: [[i32; 16]; 3],
    /// Per i32 lane: the lane's block scale s / 2^14.
    scale: [f32; 16],
    /// Q4_1: each block's sum of x (f64-summed) in its first lane, for the weights' minimum.
    sums: [f32; 16],
}

const EMPTY: Group = Group {
    limbs: [[0; 64]; 6],
    offset: [[0; 16]; 3],
    scale: [0.0; 16],
    sums: [0.0; 16],
};

thread_local! {
    /// This thread's last split, keyed by the type whose layout it has (see `SplitCache`).
    static PREPARED: RefCell<super::SplitCache<TensorType, Group>> =
        const { RefCell::new(super::SplitCache::new()) };
}

thread_local! {
    /// `columns`' splits, one cache per column (q, k and v; gate and up share them).
    static COLUMN_SPLITS: RefCell<Vec<super::SplitCache<TensorType, Group>>> =
        const { RefCell::new(Vec::new()) };
}

/// Columns `columns` takes at once (one accumulator each).
const COLUMN_CHUNK: usize = 8;

/// `ColumnsFn` for Q4_0, Q4_1 and Q5_0 when the CPU has VNNI and VBMI: each row's quants are
/// gathered and unpacked once for up to `COLUMN_CHUNK` columns; column c's value is `rows`'s
/// for it alone, bit for bit (the same per-lane operations in the same order). `false`
/// (nothing written) when some column cannot be split.
/// Safety: as `ColumnsFn`, and `supported()`.
pub(super) unsafe fn columns(
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    cols: usize,
    ys: &mut [&mut [f32]],
) -> bool {
    COLUMN_SPLITS.with(|splits| {
        let mut splits = splits.borrow_mut();
        let n = ys.len();
        // SAFETY: the caller checked the CPU (as `prepare` needs).
        if !super::split_columns(&mut splits, ty, x, cols, n, |xc, groups| unsafe {
            prepare(ty, xc, groups)
        }) {
            return false;
        }
        let blocks = cols / 32;
        let mut first = 0;
        while first < n {
            let chunk = (n - first).min(COLUMN_CHUNK);
            // Past `chunk`, repeats of the last column (computed, not stored).
            let groups: [&[Group]; COLUMN_CHUNK] =
                std::array::from_fn(|c| splits[first + c.min(chunk - 1)].held());
            macro_rules! by_kind {
                ($c:literal) => {
                    match ty {
                        TensorType::Q4_1 => rows_q4_columns::<$c, Q4_1>,
                        TensorType::Q5_0 => rows_q4_columns::<$c, Q5_0>,
                        _ => rows_q4_columns::<$c, Q4_0>,
                    }
                };
            }
            let dots: unsafe fn(
                *const u8,
                usize,
                &[&[Group]; COLUMN_CHUNK],
            ) -> [f32; COLUMN_CHUNK] = match chunk {
                1 => by_kind!(1),
                2 => by_kind!(2),
                3 => by_kind!(3),
                4 => by_kind!(4),
                5..=6 => by_kind!(6),
                _ => by_kind!(8),
            };
            for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                super::prefetch_ahead(w, r * row_bytes..(r + 1) * row_bytes);
                let out = dots(row.as_ptr(), blocks, &groups);
                for (c, y) in ys[first..first + chunk].iter_mut().enumerate() {
                    y[r] = out[c];
                }
            }
            first += chunk;
        }
        true
    })
}

/// Drops this thread's cached split (tests: a call after this sees nothing cached).
#[cfg(test)]
pub(super) fn forget() {
    PREPARED.with(|prepared| prepared.borrow_mut().forget());
}

/// Splits the 32-element block at `x` into limbs, writing its 8-element pieces to
/// `out(piece, limb)`; returns the block's scale (times 2^-14). `None` when a value is not
/// finite or the block is too small for an f32 scale (the caller then takes the f32 path).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn split_block(x: *const f32, out: impl Fn(usize, usize) -> *mut i8) -> Option<f32> {
    let halves = [_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16))];
    if halves
        .iter()
        .any(|&h| _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(h, h) != 0)
    {
        return None;
    }
    let max = _mm512_reduce_max_ps(_mm512_max_ps(
        _mm512_abs_ps(halves[0]),
        _mm512_abs_ps(halves[1]),
    ));
    let base = (1 << BASE_BITS) as f64;
    let scale = max / (127.0 * (base * base) as f32);
    if !max.is_finite() || (max > 0.0 && scale == 0.0) {
        return None;
    }
    // Residuals in f64 relative to the f32 scale actually applied, so the limbs represent
    // x / scale to within half a unit of the last limb.
    let inv = _mm512_set1_pd(if max > 0.0 {
        1.0 / (scale as f64 * base * base)
    } else {
        0.0
    });
    let (base, limit) = (_mm512_set1_pd(base), _mm512_set1_pd(127.0));
    let round =
        |v: __m512d| _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    for piece in 0..4 {
        let v = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x.add(8 * piece))), inv);
        let a0 = _mm512_min_pd(
            _mm512_max_pd(round(v), _mm512_sub_pd(_mm512_setzero_pd(), limit)),
            limit,
        );
        let r1 = _mm512_mul_pd(_mm512_sub_pd(v, a0), base);
        let a1 = round(r1);
        let a2 = round(_mm512_mul_pd(_mm512_sub_pd(r1, a1), base));
        for (limb, a) in [a0, a1, a2].into_iter().enumerate() {
            let bytes = _mm256_cvtepi32_epi8(_mm512_cvtpd_epi32(a));
            _mm_storel_epi64(out(piece, limb) as *mut __m128i, bytes);
        }
    }
    Some(scale)
}

/// Lays out `x` for `ty`'s kernel; `false` if some block cannot be split. Safety: `supported()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn prepare(ty: TensorType, x: &[f32], groups: &mut Vec<Group>) -> bool {
    let q4 = matches!(ty, TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q5_0);
    let per_group = if q4 { 4 } else { 2 };
    let blocks = x.len() / 32;
    groups.clear();
    groups.resize(blocks.div_ceil(per_group), EMPTY);
    let ones = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    for (g, group) in groups.iter_mut().enumerate() {
        let limbs = group.limbs.as_mut_ptr() as *mut i8;
        for k in 0..per_group.min(blocks - g * per_group) {
            let xs = x.as_ptr().add((g * per_group + k) * 32);
            let scale = match q4 {
                // Elements 0..16 (low nibbles) go to `limbs[2l]`, 16..32 to `limbs[2l+1]`.
                true => split_block(xs, |piece, l| {
                    limbs.add(64 * (2 * l + piece / 2) + 16 * k + 8 * (piece % 2))
                }),
                false => split_block(xs, |piece, l| limbs.add(64 * l + 32 * k + 8 * piece)),
            };
            let Some(scale) = scale else {
                return false;
            };
            let lanes = 16 / per_group;
            group.scale[lanes * k..lanes * (k + 1)].fill(scale);
            if ty == TensorType::Q4_1 {
                let xs = &x[(g * per_group + k) * 32..][..32];
                group.sums[lanes * k] = xs.iter().map(|&v| v as f64).sum::<f64>() as f32;
            }
        }
        // Each i32 lane's limb sums (4 bytes per lane) by a dot with ones.
        let lv = |i: usize| _mm512_load_si512(group.limbs[i].as_ptr() as *const _);
        let sums: [__m512i; 3] = std::array::from_fn(|l| match q4 {
            true => _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(zero, ones, lv(2 * l)),
                ones,
                lv(2 * l + 1),
            ),
            false => _mm512_dpbusd_epi32(zero, ones, lv(l)),
        });
        if ty == TensorType::Q4_1 {
            // Unsigned quants: no offset.
        } else if q4 {
            // -8 (Q5_0: -16) * the lane's combined limbs: the quants' offset, spread over the
            // block's lanes.
            let comb = _mm512_add_epi32(
                _mm512_add_epi32(
                    _mm512_slli_epi32::<{ 2 * BASE_BITS as u32 }>(sums[0]),
                    _mm512_slli_epi32::<{ BASE_BITS as u32 }>(sums[1]),
                ),
                sums[2],
            );
            let offset = match ty {
                TensorType::Q5_0 => _mm512_sub_epi32(zero, _mm512_slli_epi32::<4>(comb)),
                _ => _mm512_sub_epi32(zero, _mm512_slli_epi32::<3>(comb)),
            };
            _mm512_store_si512(group.offset[0].as_mut_ptr() as *mut _, offset);
        } else {
            for (l, sum) in sums.into_iter().enumerate() {
                let offset = _mm512_sub_epi32(zero, _mm512_slli_epi32::<7>(sum));
                _mm512_store_si512(group.offset[l].as_mut_ptr() as *mut _, offset);
            }
        }
    }
    true
}

/// `RowsFn` for Q4_0, Q4_1, Q5_0 and Q8_0 when the CPU has VNNI and VBMI; `false` (nothing written) when
/// the activations have a non-finite or subnormal-scaled block.
/// Safety: as `RowsFn`, and `supported()`.
pub(super) unsafe fn rows(
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    y: &mut [f32],
) -> bool {
    PREPARED.with(|prepared| {
        let mut prepared = prepared.borrow_mut();
        let Some(groups) = prepared.get_or_make(ty, x, |groups| prepare(ty, x, groups)) else {
            return false;
        };
        let blocks = x.len() / 32;
        // Four rows per pass share each activation load (loads, not arithmetic, limit one row
        // at a time); the last rows one at a time.
        let done = y.len() / TILE * TILE;
        let mut chunks = y.chunks_exact_mut(TILE);
        for (t, out) in chunks.by_ref().enumerate() {
            super::prefetch_ahead(w, t * TILE * row_bytes..(t + 1) * TILE * row_bytes);
            let row = w.as_ptr().add(t * TILE * row_bytes);
            let out: &mut [f32; TILE] = out.try_into().unwrap();
            *out = match ty {
                TensorType::Q4_0 => rows_q4::<TILE, Q4_0>(row, row_bytes, blocks, groups),
                TensorType::Q4_1 => rows_q4::<TILE, Q4_1>(row, row_bytes, blocks, groups),
                TensorType::Q5_0 => rows_q4::<TILE, Q5_0>(row, row_bytes, blocks, groups),
                _ => rows_q8_0::<TILE>(row, row_bytes, blocks, groups),
            };
        }
        for (r, out) in chunks.into_remainder().iter_mut().enumerate() {
            let row = w.as_ptr().add((done + r) * row_bytes);
            *out = match ty {
                TensorType::Q4_0 => rows_q4::<1, Q4_0>(row, row_bytes, blocks, groups)[0],
                TensorType::Q4_1 => rows_q4::<1, Q4_1>(row, row_bytes, blocks, groups)[0],
                TensorType::Q5_0 => rows_q4::<1, Q5_0>(row, row_bytes, blocks, groups)[0],
                _ => rows_q8_0::<1>(row, row_bytes, blocks, groups)[0],
            };
        }
        true
    })
}

/// Gather indices: byte j is quant byte j%16 of block j/16 (Q4_0: after the 2-byte scale,
/// blocks 18 bytes apart; Q4_1: after scale and minimum, 20 bytes apart; Q5_0: after the scale
/// and the 4 bytes of fifth bits, 22 bytes apart).
const fn q4_bytes(stride: usize, head: usize) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        out[j] = (stride * (j / 16) + head + j % 16) as u8;
        j += 1;
    }
    out
}

const fn q8_0_bytes() -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        out[j] = (34 * (j / 32) + 2 + j % 32) as u8;
        j += 1;
    }
    out
}

/// Word indices putting block k's f16 at byte `stride * k + at` in lanes `lanes*k..`.
const fn scale_words(stride: usize, at: usize, lanes: usize) -> [u16; 32] {
    let mut out = [0u16; 32];
    let mut i = 0;
    while i < 16 {
        out[i] = (((i / lanes) * stride + at) / 2) as u16;
        i += 1;
    }
    out
}

static Q4_0_BYTES: [u8; 64] = q4_bytes(18, 2);
static Q4_1_BYTES: [u8; 64] = q4_bytes(20, 4);
static Q5_0_BYTES: [u8; 64] = q4_bytes(22, 6);
static Q8_0_BYTES: [u8; 64] = q8_0_bytes();
static Q4_0_SCALES: [u16; 32] = scale_words(18, 0, 4);
static Q4_1_SCALES: [u16; 32] = scale_words(20, 0, 4);
static Q4_1_MINS: [u16; 32] = scale_words(20, 2, 4);
static Q5_0_SCALES: [u16; 32] = scale_words(22, 0, 4);
/// For Q5_0's quant byte j (block j/16, element j%16, and 16 more for the high nibble): the byte
/// of the block's qh (after its 2-byte scale) that holds the element's fifth bit.
static Q5_0_FIFTH_LOW: [u8; 64] = q5_fifth_bytes(0);
static Q5_0_FIFTH_HIGH: [u8; 64] = q5_fifth_bytes(2);
/// Byte j: bit j % 8, the bit `Q5_0_FIFTH_*`'s byte j holds for it.
static BIT_OF_BYTE: [u8; 64] = {
    let mut out = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        out[j] = 1 << (j % 8);
        j += 1;
    }
    out
};

const fn q5_fifth_bytes(first: usize) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        out[j] = (22 * (j / 16) + 2 + first + (j % 16) / 8) as u8;
        j += 1;
    }
    out
}
static Q8_0_SCALES: [u16; 32] = scale_words(34, 0, 8);

/// Bytes `p..p+n` (n <= 64), the rest zero, without reading past them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn load_partial(p: *const u8, n: usize) -> __m512i {
    _mm512_maskz_loadu_epi8(u64::MAX >> (64 - n), p as *const i8)
}

/// `sum over lanes` of `acc += f32(a0<<14 + a1<<7 + a2) * d * scale`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn combine(limb: [__m512i; 3], d: __m512, scale: __m512, acc: __m512) -> __m512 {
    let sum = _mm512_add_epi32(
        _mm512_add_epi32(
            _mm512_slli_epi32::<{ 2 * BASE_BITS as u32 }>(limb[0]),
            _mm512_slli_epi32::<{ BASE_BITS as u32 }>(limb[1]),
        ),
        limb[2],
    );
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, scale), acc)
}

/// `rows_q4`'s block types: 4-bit quants and 16 bytes of them per block, Q5_0's fifth bits aside.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;

/// The constant vectors `rows_q4`'s unpacking of `KIND` uses, loaded once per call.
#[derive(Clone, Copy)]
struct Q4Unpack {
    gather: __m512i,
    scales: __m512i,
    mins: __m512i,
    nibble: __m512i,
    fifth: __m512i,
    fifth_low: __m512i,
    fifth_high: __m512i,
    bit_of_byte: __m512i,
}

/// One group of 4 blocks of a Q4_0, Q4_1 or Q5_0 row, unpacked: elements 0..16 of each block as
/// u8 (`low`), 16..32 (`high`), the blocks' scales per lane (`d`), Q4_1's minimums (`m`).
struct Q4Group {
    low: __m512i,
    high: __m512i,
    d: __m512,
    m: __m512,
}

impl Q4Unpack {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
    unsafe fn new<const KIND: u8>() -> Self {
        let (gather, scales) = match KIND {
            Q4_1 => (Q4_1_BYTES.as_ptr(), Q4_1_SCALES.as_ptr()),
            Q5_0 => (Q5_0_BYTES.as_ptr(), Q5_0_SCALES.as_ptr()),
            _ => (Q4_0_BYTES.as_ptr(), Q4_0_SCALES.as_ptr()),
        };
        Q4Unpack {
            gather: _mm512_loadu_si512(gather as *const _),
            scales: _mm512_loadu_si512(scales as *const _),
            mins: _mm512_loadu_si512(Q4_1_MINS.as_ptr() as *const _),
            nibble: _mm512_set1_epi8(0x0F),
            fifth: _mm512_set1_epi8(0x10),
            fifth_low: _mm512_loadu_si512(Q5_0_FIFTH_LOW.as_ptr() as *const _),
            fifth_high: _mm512_loadu_si512(Q5_0_FIFTH_HIGH.as_ptr() as *const _),
            bit_of_byte: _mm512_loadu_si512(BIT_OF_BYTE.as_ptr() as *const _),
        }
    }

    /// Group `g` of the row at `row` (`left` blocks from it to the row's end): one gather of
    /// its 64 quant bytes, whose low nibbles are elements 0..16 of each block and high nibbles
    /// 16..32 (Q5_0 adds each element's fifth bit from its block's `qh`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
    unsafe fn group<const KIND: u8>(self, row: *const u8, g: usize, left: usize) -> Q4Group {
        let block_bytes = [18, 20, 22][KIND as usize];
        let p = row.add(g * 4 * block_bytes);
        // A whole group is 64 bytes and 8 (Q4_0), 16 (Q4_1) or 24 (Q5_0) more, never read
        // past.
        let (lo, hi) = if left >= 4 {
            let head = _mm512_loadu_si512(p as *const _);
            let tail = match KIND {
                Q4_1 => _mm512_castsi128_si512(_mm_loadu_si128(p.add(64) as *const __m128i)),
                Q5_0 => load_partial(p.add(64), 24),
                _ => _mm512_castsi128_si512(_mm_loadl_epi64(p.add(64) as *const __m128i)),
            };
            (head, tail)
        } else if block_bytes * left > 64 {
            (
                _mm512_loadu_si512(p as *const _),
                load_partial(p.add(64), block_bytes * left - 64),
            )
        } else {
            (load_partial(p, block_bytes * left), _mm512_setzero_si512())
        };
        let q = _mm512_permutex2var_epi8(lo, self.gather, hi);
        let mut low = _mm512_and_si512(q, self.nibble);
        let mut high = _mm512_and_si512(_mm512_srli_epi16::<4>(q), self.nibble);
        if KIND == Q5_0 {
            // Element i's fifth bit is bit i of its block's qh: gather for every quant byte
            // the qh byte holding its bit, test that bit, and add 16 where it is set.
            let low_bits = _mm512_permutex2var_epi8(lo, self.fifth_low, hi);
            let high_bits = _mm512_permutex2var_epi8(lo, self.fifth_high, hi);
            low = _mm512_mask_add_epi8(
                low,
                _mm512_test_epi8_mask(low_bits, self.bit_of_byte),
                low,
                self.fifth,
            );
            high = _mm512_mask_add_epi8(
                high,
                _mm512_test_epi8_mask(high_bits, self.bit_of_byte),
                high,
                self.fifth,
            );
        }
        // Block k's scale in lanes 4k..4k+4 (Q5_0's last block's is past byte 64: in `hi`).
        let d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(
            lo,
            self.scales,
            hi,
        )));
        let m = match KIND {
            Q4_1 => _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(
                self.mins, lo,
            ))),
            _ => _mm512_setzero_ps(),
        };
        Q4Group { low, high, d, m }
    }
}

/// `acc` plus one unpacked group's dot with one column's split group.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn accumulate_q4<const KIND: u8>(w: &Q4Group, group: &Group, acc: __m512) -> __m512 {
    let lv = |i: usize| _mm512_load_si512(group.limbs[i].as_ptr() as *const _);
    let offset = _mm512_load_si512(group.offset[0].as_ptr() as *const _);
    let scale = _mm512_load_ps(group.scale.as_ptr());
    let dot = |k: usize, init: __m512i| {
        _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(init, w.low, lv(2 * k)),
            w.high,
            lv(2 * k + 1),
        )
    };
    let zero = _mm512_setzero_si512();
    let acc = combine(
        [dot(0, zero), dot(1, zero), dot(2, offset)],
        w.d,
        scale,
        acc,
    );
    if KIND == Q4_1 {
        // + m * sum(x) per block.
        _mm512_fmadd_ps(w.m, _mm512_load_ps(group.sums.as_ptr()), acc)
    } else {
        acc
    }
}

/// `R` rows of Q4_0, Q4_1 or Q5_0 (`KIND`) against the split activations.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn rows_q4<const R: usize, const KIND: u8>(
    row: *const u8,
    row_bytes: usize,
    blocks: usize,
    groups: &[Group],
) -> [f32; R] {
    let unpack = Q4Unpack::new::<KIND>();
    let mut acc = [_mm512_setzero_ps(); R];
    for (g, group) in groups.iter().enumerate() {
        for (r, acc) in acc.iter_mut().enumerate() {
            let w = unpack.group::<KIND>(row.add(r * row_bytes), g, blocks - 4 * g);
            *acc = accumulate_q4::<KIND>(&w, group, *acc);
        }
    }
    acc.map(|a| _mm512_reduce_add_ps(a))
}

/// One row of Q4_0, Q4_1 or Q5_0 (`KIND`) against the first `C` of `columns`' splits, each
/// group unpacked once: column c's value is `rows_q4`'s for it alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
#[allow(clippy::needless_range_loop)] // g indexes every column's groups
unsafe fn rows_q4_columns<const C: usize, const KIND: u8>(
    row: *const u8,
    blocks: usize,
    columns: &[&[Group]; COLUMN_CHUNK],
) -> [f32; COLUMN_CHUNK] {
    let unpack = Q4Unpack::new::<KIND>();
    let mut acc = [_mm512_setzero_ps(); C];
    for g in 0..columns[0].len() {
        let w = unpack.group::<KIND>(row, g, blocks - 4 * g);
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = accumulate_q4::<KIND>(&w, &columns[c][g], *acc);
        }
    }
    let mut out = [0.0; COLUMN_CHUNK];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = _mm512_reduce_add_ps(a);
    }
    out
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn rows_q8_0<const R: usize>(
    row: *const u8,
    row_bytes: usize,
    blocks: usize,
    groups: &[Group],
) -> [f32; R] {
    let gather = _mm512_loadu_si512(Q8_0_BYTES.as_ptr() as *const _);
    let scales = _mm512_loadu_si512(Q8_0_SCALES.as_ptr() as *const _);
    let sign = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); R];
    for (g, group) in groups.iter().enumerate() {
        let whole = blocks - 2 * g >= 2;
        let lv = |i: usize| _mm512_load_si512(group.limbs[i].as_ptr() as *const _);
        let ov = |i: usize| _mm512_load_si512(group.offset[i].as_ptr() as *const _);
        let (limbs, offsets) = ([lv(0), lv(1), lv(2)], [ov(0), ov(1), ov(2)]);
        let scale = _mm512_load_ps(group.scale.as_ptr());
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = row.add(r * row_bytes + g * 68);
            let (lo, hi) = if whole {
                (
                    _mm512_loadu_si512(p as *const _),
                    _mm512_castsi128_si512(_mm_cvtsi32_si128(
                        (p.add(64) as *const i32).read_unaligned(),
                    )),
                )
            } else {
                (load_partial(p, 34), _mm512_setzero_si512())
            };
            // w + 128 as u8; the offset vectors take 128 * sum(limbs) back out.
            let q = _mm512_xor_si512(_mm512_permutex2var_epi8(lo, gather, hi), sign);
            let dot = |k: usize| _mm512_dpbusd_epi32(offsets[k], q, limbs[k]);
            let d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(scales, lo)));
            *acc = combine([dot(0), dot(1), dot(2)], d, scale, *acc);
        }
    }
    acc.map(|a| _mm512_reduce_add_ps(a))
}
