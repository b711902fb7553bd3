//! WebAssembly SIMD128 matvec for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K: integer dots over the weights' own
//! quants, with `i32x4.dot_i16x8_s` (one `pmaddwd` on x86), instead of widening every weight
//! to f32.
//!
//! The activations are NOT quantized to one integer: per 32-element block, x = s * (a0 +
//! a1 / 2^15) with s = max|x| / 16383 and two i16 limbs (a0 in [-16383, 16383], a1 in
//! [-16384, 16384]), which keeps 29 bits of each block (f32 keeps 24 per element). Each limb's
//! dot is exact in i32 and each 4-lane partial exact in f32 (8 products of at most 128 * 16384
//! = 2^24), so a block costs one rounding where the limbs combine, `f32(dot0) * 2^15 +
//! f32(dot1)`, then one multiply by `d * s / 2^15`.
//!
//! Weights are read as eight 16-bit lanes of their quant bytes, so shifts and masks of whole
//! lanes give i16 quants without byte shuffles; the activations are laid out once per call in
//! the order those lanes come out.
//!
//! `columns` (speculative decoding's verification pass) decodes each 32-element unit of a row
//! once for all its activation columns, through the same `step` as `rows`: the same bits per
//! column. Only the decoding is shared, so the gain is what decoding costs beside the limb
//! dots: 4 columns cost about 3.5 matvecs of Q4_0 or Q8_0 (4.1-4.5 one at a time), 2.7 of Q5_0
//! (kernel_bench `--columns`, Node 20 on a Zen 4 core).

use super::super::TensorType;
use super::k4_scales_mins;
use core::arch::wasm32::*;
use std::cell::RefCell;

/// Largest |a0|: keeps an 8-product lane of Q8_0 quants (|q| <= 128) under 2^24.
const LIMB0_MAX: f64 = 16383.0;

/// One block of split activations. Element order per limb, in i16 lanes i = 0..8: `v[0]`
/// elements 2i, `v[1]` 2i+1, `v[2]` 16+2i, `v[3]` 17+2i.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Block {
    limbs: [[v128; 4]; 2],
    /// Per i32 lane, -8 times the lane's sum of each limb: what Q4_0's offset of 8 takes off
    /// (Q5_0: twice that; Q4_1 takes it off too, and adds 8d to its minimum).
    offset8: [v128; 2],
    /// s / 2^15.
    scale: f32,
    /// The block's sum of x (f64-summed), for Q4_1's minimum.
    sum: f32,
}

thread_local! {
    /// This thread's last split (one layout for every type: no key, see `SplitCache`).
    static PREPARED: RefCell<super::SplitCache<(), Block>> =
        const { RefCell::new(super::SplitCache::new()) };
}

/// Drops this thread's cached splits (tests: a call after this sees nothing cached).
#[cfg(test)]
pub(super) fn forget() {
    PREPARED.with(|prepared| prepared.borrow_mut().forget());
    COLUMN_SPLITS.with(|splits| splits.borrow_mut().iter_mut().for_each(|s| s.forget()));
}

/// Splits `x` into limbs; `false` when a value is not finite or a block's scale would be too
/// small for f32 (the caller then takes the f32 kernels).
fn prepare(x: &[f32], blocks: &mut Vec<Block>) -> bool {
    blocks.clear();
    for xs in x.chunks_exact(32) {
        if xs.iter().any(|v| !v.is_finite()) {
            return false;
        }
        let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = (max as f64 / LIMB0_MAX) as f32;
        if max > 0.0 && s < 1e-30 {
            return false;
        }
        let inv = if max > 0.0 { 1.0 / s as f64 } else { 0.0 };
        let mut limbs = [[0i16; 32]; 2];
        let mut lane_sums = [[0i32; 4]; 2];
        for (e, &v) in xs.iter().enumerate() {
            let v = v as f64 * inv;
            let a0 = v.round_ties_even().clamp(-LIMB0_MAX, LIMB0_MAX);
            let a1 = ((v - a0) * 32768.0).round_ties_even();
            // Element e's place: vector (e / 16) * 2 + e % 2, lane (e % 16) / 2.
            let (vector, lane) = ((e / 16) * 2 + e % 2, (e % 16) / 2);
            for (l, a) in [a0, a1].into_iter().enumerate() {
                limbs[l][8 * vector + lane] = a as i16;
                lane_sums[l][lane / 2] += a as i32;
            }
        }
        let load = |l: usize, v: usize| {
            // SAFETY: 8 i16 of the 32.
            unsafe { v128_load(limbs[l][8 * v..].as_ptr() as *const v128) }
        };
        let offset = |l: usize| {
            let [a, b, c, d] = lane_sums[l].map(|s| -8 * s);
            i32x4(a, b, c, d)
        };
        blocks.push(Block {
            limbs: [0, 1].map(|l| [0, 1, 2, 3].map(|v| load(l, v))),
            offset8: [offset(0), offset(1)],
            scale: s / 32768.0,
            sum: xs.iter().map(|&v| v as f64).sum::<f64>() as f32,
        });
    }
    true
}

/// `RowsFn` for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K; `false` (nothing written) when the activations have
/// a non-finite or tiny-scaled block. Safety: as `RowsFn`.
pub(super) unsafe fn rows(
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    y: &mut [f32],
) -> bool {
    PREPARED.with(|prepared| {
        let mut prepared = prepared.borrow_mut();
        let Some(blocks) = prepared.get_or_make((), x, |blocks| prepare(x, blocks)) else {
            return false;
        };
        for (out, row) in y.iter_mut().zip(w.chunks_exact(row_bytes)) {
            *out = match ty {
                TensorType::Q4_0 => row_dot::<Q4_0>(row.as_ptr(), blocks),
                TensorType::Q4_1 => row_dot::<Q4_1>(row.as_ptr(), blocks),
                TensorType::Q5_0 => row_dot::<Q5_0>(row.as_ptr(), blocks),
                TensorType::Q8_0 => row_dot::<Q8_0>(row.as_ptr(), blocks),
                TensorType::Q4_K => row_dot::<Q4_K>(row.as_ptr(), blocks),
                _ => row_dot::<Q6_K>(row.as_ptr(), blocks),
            };
        }
        true
    })
}

thread_local! {
    /// `columns`' splits, one cache per column (q, k and v; gate and up share them).
    static COLUMN_SPLITS: RefCell<Vec<super::SplitCache<(), Block>>> =
        const { RefCell::new(Vec::new()) };
}

/// `ColumnsFn` for `rows`' types: each 32-element unit of a row is decoded once for all the
/// columns, then `step`s each column's sums, the same operations in the same order as `rows`
/// (`row_dot`), so column c's value is `rows`'s for it alone, bit for bit. `false` (nothing
/// written) when some column cannot be split (`rows` then declines it too).
///
/// The columns are a loop, their sums in memory: with the columns unrolled and the sums in
/// registers, V8 hoisted every column's activation loads to the top of the unit (its loads
/// keep their order, the arithmetic between them sinks to its use) and spilled them, which
/// made 8 columns together slower than 8 matvecs; storing each column's sums keeps its
/// arithmetic before the next column's loads.
/// Safety: as `ColumnsFn`.
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
        if !super::split_columns(&mut splits, (), x, cols, n, prepare) {
            return false;
        }
        let starts: Vec<*const Block> = splits[..n].iter().map(|s| s.held().as_ptr()).collect();
        let units = cols / 32;
        debug_assert!(splits[..n].iter().all(|s| s.held().len() == units));
        let mut sums = vec![Sums::ZERO; n];
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            sums.fill(Sums::ZERO);
            match ty {
                TensorType::Q4_0 => row_dots::<Q4_0>(row.as_ptr(), units, &starts, &mut sums),
                TensorType::Q4_1 => row_dots::<Q4_1>(row.as_ptr(), units, &starts, &mut sums),
                TensorType::Q5_0 => row_dots::<Q5_0>(row.as_ptr(), units, &starts, &mut sums),
                TensorType::Q8_0 => row_dots::<Q8_0>(row.as_ptr(), units, &starts, &mut sums),
                TensorType::Q4_K => row_dots::<Q4_K>(row.as_ptr(), units, &starts, &mut sums),
                _ => row_dots::<Q6_K>(row.as_ptr(), units, &starts, &mut sums),
            }
            for (y, sums) in ys.iter_mut().zip(&sums) {
                y[r] = sums.finish(ty != TensorType::Q6_K);
            }
        }
        true
    })
}

/// The kernels' block types (`KIND`).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q8_0: u8 = 3;
const Q4_K: u8 = 4;
const Q6_K: u8 = 5;

/// One column's running sums over a row.
#[derive(Clone, Copy)]
struct Sums {
    acc: v128,
    /// Q4_0, Q4_1, Q5_0, Q8_0 and Q4_K: the minimums' part, added at the end (0 but for Q4_1
    /// and Q4_K).
    minimums: f32,
}

impl Sums {
    const ZERO: Sums = Sums {
        acc: f32x4(0.0, 0.0, 0.0, 0.0),
        minimums: 0.0,
    };

    /// The row's dot: the lanes summed in pairs, then the minimums where the type has them
    /// (all but Q6_K, where `+ 0.0` would turn a -0.0 sum into +0.0).
    #[inline(always)]
    fn finish(self, minimums: bool) -> f32 {
        let a = self.acc;
        let sum = (f32x4_extract_lane::<0>(a) + f32x4_extract_lane::<1>(a))
            + (f32x4_extract_lane::<2>(a) + f32x4_extract_lane::<3>(a));
        match minimums {
            true => sum + self.minimums,
            false => sum,
        }
    }
}

/// One 32-element unit of a row, decoded: its quants as i16 lanes in `Block`'s element order,
/// and two factors whose meaning depends on the type (see `step`).
struct Unit {
    w: [v128; 4],
    first: f32,
    second: f32,
}

/// Adds unit `unit`'s dot with `block` (the column's split of the same 32 elements) to `sums`.
/// Per type, `first` and `second` are: Q4_0, Q5_0, Q8_0: d; Q4_1: d and m + 8d; Q4_K:
/// d * scale and 8 d * scale - dmin * min; Q6_K: d * scale of elements 0..16 and of 16..32.
#[inline(always)]
unsafe fn step<const KIND: u8>(sums: &mut Sums, unit: &Unit, block: &Block) {
    let w = &unit.w;
    match KIND {
        Q6_K => {
            // Elements 0..16 (w[0], w[1]) and 16..32 (w[2], w[3]) have a scale each.
            let zero = [i32x4_splat(0); 2];
            let low = combine(&[w[0], w[1]], block, 0, zero);
            sums.acc = accumulate(sums.acc, low, unit.first, block.scale);
            let high = combine(&[w[2], w[3]], block, 2, zero);
            sums.acc = accumulate(sums.acc, high, unit.second, block.scale);
        }
        _ => {
            let offset = match KIND {
                // Q4_1 too: d * sum(q x) + m * sum(x) as d * sum((q - 8) x) + (m + 8d) *
                // sum(x), where m is about -8d: the two terms would nearly cancel. Likewise
                // Q4_K's d * scale * q - dmin * min.
                Q4_0 | Q4_1 | Q4_K => block.offset8,
                Q5_0 => [
                    i32x4_shl(block.offset8[0], 1),
                    i32x4_shl(block.offset8[1], 1),
                ],
                _ => [i32x4_splat(0); 2],
            };
            let combined = combine(w, block, 0, offset);
            sums.acc = accumulate(sums.acc, combined, unit.first, block.scale);
            if matches!(KIND, Q4_1 | Q4_K) {
                sums.minimums += unit.second * block.sum;
            }
        }
    }
}

/// One row's dot with the split activations.
#[inline(always)]
unsafe fn row_dot<const KIND: u8>(row: *const u8, blocks: &[Block]) -> f32 {
    let mut sums = Sums::ZERO;
    // SAFETY: `decode_row` passes units below `blocks.len()`.
    decode_row::<KIND>(row, blocks.len(), |u, unit| {
        step::<KIND>(&mut sums, unit, blocks.get_unchecked(u))
    });
    sums.finish(KIND != Q6_K)
}

/// One row's dots with several columns' split activations (`starts[c]`: column c's first
/// block, `units` of them), each unit decoded once, into `sums` (zeros on entry, one per
/// column).
#[inline(never)]
unsafe fn row_dots<const KIND: u8>(
    row: *const u8,
    units: usize,
    starts: &[*const Block],
    sums: &mut [Sums],
) {
    decode_row::<KIND>(row, units, |u, unit| {
        for (sums, start) in sums.iter_mut().zip(starts) {
            step::<KIND>(sums, unit, &*start.add(u));
        }
    });
}

/// Calls `f(u, unit)` for each of the `units` 32-element units of the row at `row`, in order.
#[inline(always)]
unsafe fn decode_row<const KIND: u8>(
    row: *const u8,
    units: usize,
    mut f: impl FnMut(usize, &Unit),
) {
    match KIND {
        Q4_K => {
            let mask = u16x8_splat(0x0F);
            for b in 0..units / 8 {
                let p = row.add(b * 144);
                let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
                let (scales, mins) = k4_scales_mins(&*(p.add(4) as *const [u8; 12]));
                for pair in 0..4 {
                    // Units 2 pair and 2 pair + 1: the low and high nibbles of the same 32
                    // bytes.
                    let qs = p.add(16 + 32 * pair);
                    let (a, c) = (
                        v128_load(qs as *const v128),
                        v128_load(qs.add(16) as *const v128),
                    );
                    let low = [
                        v128_and(a, mask),
                        v128_and(u16x8_shr(a, 8), mask),
                        v128_and(c, mask),
                        v128_and(u16x8_shr(c, 8), mask),
                    ];
                    let high = [
                        v128_and(u16x8_shr(a, 4), mask),
                        u16x8_shr(a, 12),
                        v128_and(u16x8_shr(c, 4), mask),
                        u16x8_shr(c, 12),
                    ];
                    for (g, w) in [(2 * pair, low), (2 * pair + 1, high)] {
                        let scale = d * ((scales >> (8 * g)) as u8) as f32;
                        let min = dmin * ((mins >> (8 * g)) as u8) as f32;
                        let unit = Unit {
                            w,
                            first: scale,
                            second: 8.0 * scale - min,
                        };
                        f(8 * b + g, &unit);
                    }
                }
            }
        }
        Q6_K => {
            let (nibble, top, offset) = (u16x8_splat(0x0F), u16x8_splat(0x30), u16x8_splat(32));
            for b in 0..units / 8 {
                let p = row.add(b * 210);
                let d = f16_at(p.add(208));
                let scales = p.add(192) as *const i8;
                for h in 0..2 {
                    let qh = p.add(128 + 32 * h);
                    let qh = [
                        v128_load(qh as *const v128),
                        v128_load(qh.add(16) as *const v128),
                    ];
                    for r in 0..4 {
                        // Unit 4h + r: nibble r / 2 of ql[64h + 32 (r % 2)..], bits 2r.. of
                        // qh[32h..].
                        let g = 4 * h + r;
                        let ql = p.add(64 * h + 32 * (r % 2));
                        let ql = [
                            v128_load(ql as *const v128),
                            v128_load(ql.add(16) as *const v128),
                        ];
                        let shift = 4 * (r / 2) as u32;
                        let mut w = [f32x4_splat(0.0); 4];
                        for half in 0..2 {
                            let (l, q) = (ql[half], qh[half]);
                            // Even bytes (lane's low byte), then odd bytes; bits 2r..2r+2 of qh
                            // to 4..6.
                            let top_even = match r {
                                3 => u16x8_shr(q, 2),
                                _ => u16x8_shl(q, 4 - 2 * r as u32),
                            };
                            let top_odd = u16x8_shr(q, 4 + 2 * r as u32);
                            let even = v128_or(
                                v128_and(u16x8_shr(l, shift), nibble),
                                v128_and(top_even, top),
                            );
                            let odd = v128_or(
                                v128_and(u16x8_shr(l, 8 + shift), nibble),
                                v128_and(top_odd, top),
                            );
                            w[2 * half] = i16x8_sub(even, offset);
                            w[2 * half + 1] = i16x8_sub(odd, offset);
                        }
                        let unit = Unit {
                            w,
                            first: d * *scales.add(2 * g) as f32,
                            second: d * *scales.add(2 * g + 1) as f32,
                        };
                        f(8 * b + g, &unit);
                    }
                }
            }
        }
        _ => {
            let block_bytes = [18, 20, 22, 34][KIND as usize];
            for b in 0..units {
                let p = row.add(b * block_bytes);
                let w = match KIND {
                    Q4_0 => nibbles(p.add(2)),
                    Q4_1 => nibbles(p.add(4)),
                    Q5_0 => {
                        // q = nibble | fifth bit << 4, the offset of 16 through `offset8` * 2.
                        let qh = (p.add(2) as *const u32).read_unaligned();
                        let [n0, n1, n2, n3] = nibbles(p.add(6));
                        let (low, high) = (u16x8_splat(qh as u16), u16x8_splat((qh >> 16) as u16));
                        [
                            v128_or(n0, fifth_bits(low, 0)),
                            v128_or(n1, fifth_bits(low, 1)),
                            v128_or(n2, fifth_bits(high, 0)),
                            v128_or(n3, fifth_bits(high, 1)),
                        ]
                    }
                    _ => {
                        // Signed bytes: the even ones by a shift up and back, the odd ones by a
                        // shift.
                        let (a, c) = (
                            v128_load(p.add(2) as *const v128),
                            v128_load(p.add(18) as *const v128),
                        );
                        [
                            i16x8_shr(i16x8_shl(a, 8), 8),
                            i16x8_shr(a, 8),
                            i16x8_shr(i16x8_shl(c, 8), 8),
                            i16x8_shr(c, 8),
                        ]
                    }
                };
                let d = f16_at(p);
                let unit = Unit {
                    w,
                    first: d,
                    // Q4_1's minimum plus 8d. Exact: both are f16 values, and 8d too.
                    second: match KIND {
                        Q4_1 => f16_at(p.add(2)) + 8.0 * d,
                        _ => 0.0,
                    },
                };
                f(b, &unit);
            }
        }
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits((p as *const u16).read_unaligned()).to_f32()
}

/// The 16 quant bytes at `qs` as 4-bit quants in i16 lanes, in `Block`'s element order:
/// lane i of the bytes' 16-bit view holds elements 2i, 2i+16 (byte 2i) and 2i+1, 2i+17.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> [v128; 4] {
    let q = v128_load(qs as *const v128);
    let mask = u16x8_splat(0x0F);
    [
        v128_and(q, mask),
        v128_and(u16x8_shr(q, 8), mask),
        v128_and(u16x8_shr(q, 4), mask),
        u16x8_shr(q, 12),
    ]
}

/// `init` plus the integer dot of the i16 quant vectors `w` with `limbs`.
#[inline(always)]
fn limb_dot<const N: usize>(w: &[v128; N], limbs: &[v128], init: v128) -> v128 {
    let mut sum = init;
    for i in 0..N {
        sum = i32x4_add(sum, i32x4_dot_i16x8(w[i], limbs[i]));
    }
    sum
}

/// i16 quant vectors against vectors `first..first + N` of a block's two limbs: per i32 lane,
/// `f32(dot0) * 2^15 + f32(dot1)` (one rounding), after adding `offset` (per limb; zeros for
/// none) to the integer dots.
#[inline(always)]
fn combine<const N: usize>(w: &[v128; N], block: &Block, first: usize, offset: [v128; 2]) -> v128 {
    let dot0 = limb_dot(w, &block.limbs[0][first..first + N], offset[0]);
    let dot1 = limb_dot(w, &block.limbs[1][first..first + N], offset[1]);
    f32x4_add(
        f32x4_mul(f32x4_convert_i32x4(dot0), f32x4_splat(32768.0)),
        f32x4_convert_i32x4(dot1),
    )
}

/// `acc + combined * (scale * block_scale)`, the scale product in scalar f32.
#[inline(always)]
fn accumulate(acc: v128, combined: v128, scale: f32, block_scale: f32) -> v128 {
    f32x4_add(acc, f32x4_mul(combined, f32x4_splat(scale * block_scale)))
}

/// Lane i = 16 where bit `first + 2i` of the 16-bit `bits` is set, else 0.
#[inline(always)]
fn fifth_bits(bits: v128, first: u32) -> v128 {
    let mask = match first {
        0 => u16x8(1, 4, 16, 64, 256, 1024, 4096, 16384),
        _ => u16x8(2, 8, 32, 128, 512, 2048, 8192, 32768),
    };
    v128_and(i16x8_eq(v128_and(bits, mask), mask), u16x8_splat(16))
}
