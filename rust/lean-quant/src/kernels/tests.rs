//! `vecmat` on every path available here against an exact (f64) product, within `TOLERANCE`
//! of the sum of |a * m| (only the f32 rounding of the sums may differ).

use super::{F32Matrix, Isa, COLUMN_BLOCK};

/// Allowed |kernel - exact| relative to sum |a_i * m_i|.
const TOLERANCE: f64 = 1e-5;

/// Deterministic floats in [-1, 1) (splitmix64).
fn floats(state: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Row counts around every path's tile height (4, 8), column counts around its tile width
/// (16, 32) and vector width, both layouts (row-major with rows wider than the columns,
/// column-blocked within a taller matrix), and data that ends exactly at the layout's last
/// element.
#[test]
fn vecmat_matches_an_exact_product_on_every_path() {
    let mut state = 7;
    for &isa in Isa::available() {
        for n in [1, 2, 3, 5, 8, 9, 17] {
            for depth in [0usize, 1, 7, 64, 100] {
                for cols in [1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 545] {
                    let extra = (n + depth) % 3 * 5;
                    let stride = cols + extra;
                    let m = floats(&mut state, depth.saturating_sub(1) * stride + cols);
                    let row_major = F32Matrix::row_major(&m, depth, cols, stride);
                    check(&mut state, isa, n, row_major, &|i, j| m[i * stride + j]);

                    let block_rows = depth + extra;
                    let blocks = cols.div_ceil(COLUMN_BLOCK);
                    let last_width = cols - (blocks - 1) * COLUMN_BLOCK;
                    let len = match depth {
                        0 => 0,
                        _ => {
                            (blocks - 1) * block_rows * COLUMN_BLOCK
                                + (depth - 1) * COLUMN_BLOCK
                                + last_width
                        }
                    };
                    let m = floats(&mut state, len);
                    let blocked = F32Matrix::column_blocked(&m, depth, cols, block_rows);
                    let at = |i: usize, j: usize| {
                        m[j / COLUMN_BLOCK * block_rows * COLUMN_BLOCK
                            + i * COLUMN_BLOCK
                            + j % COLUMN_BLOCK]
                    };
                    check(&mut state, isa, n, blocked, &at);
                }
            }
        }
    }
}

fn check(state: &mut u64, isa: Isa, n: usize, m: F32Matrix, at: &dyn Fn(usize, usize) -> f32) {
    let (depth, cols) = (m.rows(), m.cols());
    let a = floats(state, n * depth);
    let mut y = vec![f32::NAN; n * cols];
    isa.vecmat(&a, n, m, &mut y);
    for h in 0..n {
        for j in 0..cols {
            let (exact, magnitude) = (0..depth).fold((0f64, 0f64), |(s, mag), i| {
                let p = a[h * depth + i] as f64 * at(i, j) as f64;
                (s + p, mag + p.abs())
            });
            let got = y[h * cols + j];
            assert!(
                (got as f64 - exact).abs() <= TOLERANCE * magnitude + 1e-30,
                "{} vecmat {m:?} n {n}: ({h}, {j}) is {got}, exact {exact}",
                isa.name()
            );
        }
    }
}

#[test]
fn the_crate_function_uses_the_selected_path() {
    let mut state = 8;
    let (n, depth, cols) = (3, 64, 40);
    let (a, m) = (
        floats(&mut state, n * depth),
        floats(&mut state, depth * cols),
    );
    let m = F32Matrix::row_major(&m, depth, cols, cols);
    let (mut got, mut want) = (vec![0f32; n * cols], vec![0f32; n * cols]);
    crate::vecmat(&a, n, m, &mut got);
    Isa::selected().vecmat(&a, n, m, &mut want);
    assert_eq!(got, want);
}

#[test]
#[should_panic(expected = "vecmat: a has")]
fn a_matrix_past_its_data_is_refused() {
    let mut y = [0f32; 2 * 40];
    // Two column blocks of 4 rows: the second block's last row ends at 4*32 + 3*32 + 8.
    let m = [0f32; 4 * 32 + 3 * 32 + 7];
    crate::vecmat(
        &[0.0; 2 * 4],
        2,
        F32Matrix::column_blocked(&m, 4, 40, 4),
        &mut y,
    );
}

/// A row's sum does not depend on which rows a call covers (serial, threaded with any split,
/// or a sub-range), so results do not change with the thread count.
#[test]
fn matvec_rows_do_not_depend_on_the_row_range() {
    let mut state = 9;
    let (rows, cols) = (23, 768);
    for ty in [
        crate::TensorType::Q4_0,
        crate::TensorType::Q8_0,
        crate::TensorType::Q4_K,
    ] {
        let row_bytes = ty.row_bytes(cols).unwrap();
        // Small finite scales: random f16 bits could be NaN.
        let mut w: Vec<u8> = floats(&mut state, rows * row_bytes)
            .iter()
            .map(|f| (f.to_bits() >> 9) as u8)
            .collect();
        // Every one of these types opens its blocks with f16 scales (Q4_K: d, dmin).
        let d = half::f16::from_f32(0.01).to_le_bytes();
        for block in w.chunks_exact_mut(ty.block_bytes()) {
            block[..2].copy_from_slice(&d);
            block[2..4].copy_from_slice(&d);
        }
        let x = floats(&mut state, cols);
        for &isa in Isa::available() {
            let mut whole = vec![0f32; rows];
            isa.matvec_serial(ty, &w, rows, cols, &x, &mut whole);
            for start in 0..rows {
                for end in start + 1..=rows {
                    let mut part = vec![0f32; end - start];
                    let bytes = &w[start * row_bytes..end * row_bytes];
                    isa.matvec_serial(ty, bytes, end - start, cols, &x, &mut part);
                    assert_eq!(
                        part,
                        whole[start..end],
                        "{} {ty} rows {start}..{end}",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// The integer kernels over limb-split activations this target has: x86_64's AVX-512 VNNI and
/// wasm's simd128 (`RowsFn`s that may decline), each with a way to forget the thread's cached
/// split and the f32 path they stand beside.
type LimbRowsFn = unsafe fn(crate::TensorType, &[u8], usize, &[f32], &mut [f32]) -> bool;

struct LimbKernel {
    name: &'static str,
    types: &'static [crate::TensorType],
    rows: LimbRowsFn,
    forget: fn(),
    isa: Isa,
}

#[allow(unused_mut, clippy::vec_init_then_push)] // which pushes exist depends on the target
fn limb_kernels() -> Vec<LimbKernel> {
    let mut kernels = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if super::avx512_vnni::supported() {
        kernels.push(LimbKernel {
            name: "avx512_vnni",
            types: &LIMB_TYPES[..4],
            rows: super::avx512_vnni::rows,
            forget: super::avx512_vnni::forget,
            isa: Isa::Avx512,
        });
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    kernels.push(LimbKernel {
        name: "simd128_limbs",
        types: &LIMB_TYPES,
        rows: super::simd128_limbs::rows,
        forget: super::simd128_limbs::forget,
        isa: Isa::Simd128,
    });
    kernels
}

const LIMB_TYPES: [crate::TensorType; 6] = [
    crate::TensorType::Q4_0,
    crate::TensorType::Q4_1,
    crate::TensorType::Q5_0,
    crate::TensorType::Q8_0,
    crate::TensorType::Q4_K,
    crate::TensorType::Q6_K,
];

/// Rows of `ty` (one of `LIMB_TYPES`) with random quants, scales and bits, and f16 scales in
/// [0.005, 0.015) (Q4_1's minimum about -8 times that, Q4_K's dmin positive).
fn quant_rows(state: &mut u64, ty: crate::TensorType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut w: Vec<u8> = floats(state, rows * row_bytes)
        .iter()
        .map(|f| (f.to_bits() >> 7) as u8)
        .collect();
    let scales = floats(state, w.len() / ty.block_bytes());
    for (block, s) in w.chunks_exact_mut(ty.block_bytes()).zip(scales) {
        let d = half::f16::from_f32(0.01 + 0.005 * s).to_le_bytes();
        let at = if ty == crate::TensorType::Q6_K {
            208
        } else {
            0
        };
        block[at..at + 2].copy_from_slice(&d);
        let second = match ty {
            // Q4_1's minimum, about -8 * d.
            crate::TensorType::Q4_1 => Some(-0.08 + 0.01 * s),
            // Q4_K's dmin.
            crate::TensorType::Q4_K => Some(0.01 - 0.005 * s),
            _ => None,
        };
        if let Some(v) = second {
            block[2..4].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    w
}

/// Activations like a hidden state's: mostly small, some blocks with an outlier, some zero or
/// tiny blocks.
fn activations(state: &mut u64, cols: usize) -> Vec<f32> {
    let mut x = floats(state, cols);
    for (b, block) in x.chunks_exact_mut(32).enumerate() {
        match b % 7 {
            1 => block[b % 32] *= 60.0,
            3 => block.fill(0.0),
            5 => block.iter_mut().for_each(|v| *v *= 1e-20),
            _ => {}
        }
    }
    x
}

/// `(|got - exact| / sum |w x|)` of each row, with the f64 dot of the scalar weights as exact.
fn relative_errors(ty: crate::TensorType, w: &[u8], cols: usize, x: &[f32], y: &[f32]) -> Vec<f64> {
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut weights = vec![0f32; cols];
    y.iter()
        .zip(w.chunks_exact(row_bytes))
        .map(|(&got, row)| {
            crate::scalar::dequantize(ty, row, &mut weights);
            let (exact, magnitude) =
                weights
                    .iter()
                    .zip(x)
                    .fold((0f64, 0f64), |(s, m), (&w, &x)| {
                        let p = w as f64 * x as f64;
                        (s + p, m + p.abs())
                    });
            (got as f64 - exact).abs() / magnitude.max(1e-300)
        })
        .collect()
}

/// The limb kernels against an f64 dot on awkward shapes: one row, one block, partial groups
/// of blocks (VNNI's Q4_0 groups 4 blocks, Q8_0 2), with zero, tiny and outlier blocks.
#[test]
fn limb_rows_match_an_exact_dot() {
    let mut state = 11;
    for kernel in limb_kernels() {
        for &ty in kernel.types {
            for rows in [1, 2, 3, 5] {
                for cols in [32, 64, 96, 128, 160, 192, 224, 256, 512, 576, 1536, 4864]
                    .into_iter()
                    .filter(|c| c % ty.block_len() == 0)
                {
                    let w = quant_rows(&mut state, ty, rows, cols);
                    let x = activations(&mut state, cols);
                    let mut y = vec![f32::NAN; rows];
                    let row_bytes = ty.row_bytes(cols).unwrap();
                    // SAFETY: `limb_kernels` checked the CPU; `w` holds `rows` rows of `cols`.
                    assert!(unsafe { (kernel.rows)(ty, &w, row_bytes, &x, &mut y) });
                    for (r, err) in relative_errors(ty, &w, cols, &x, &y)
                        .into_iter()
                        .enumerate()
                    {
                        assert!(
                            err <= 1e-5,
                            "{} {ty} {rows}x{cols} row {r}: relative error {err:e}",
                            kernel.name
                        );
                    }
                }
            }
        }
    }
}

/// The limb kernels keep the last split activations per thread: a call with other activations
/// (one element changed), or the same activations for another type, must give what a thread
/// with nothing cached gives, bit for bit.
#[test]
fn limb_rows_never_reuse_a_stale_split() {
    let mut state = 13;
    let (rows, cols) = (6, 1536);
    let weights: Vec<_> = LIMB_TYPES
        .into_iter()
        .map(|ty| (ty, quant_rows(&mut state, ty, rows, cols)))
        .collect();
    let x = activations(&mut state, cols);
    let mut nudged = x.clone();
    nudged[300] = 1.0 - 3.0 * nudged[300];
    for kernel in limb_kernels() {
        let run = |ty: crate::TensorType, w: &[u8], x: &[f32]| {
            let mut y = vec![f32::NAN; rows];
            // SAFETY: `limb_kernels` checked the CPU; `w` holds `rows` rows of `cols`.
            assert!(unsafe { (kernel.rows)(ty, w, ty.row_bytes(cols).unwrap(), x, &mut y) });
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let fresh = |ty, w: &[u8], x: &[f32]| {
            (kernel.forget)();
            run(ty, w, x)
        };
        let calls = [
            (0, &x),
            (0, &x),
            (0, &nudged),
            (1, &nudged),
            (3, &nudged),
            (5, &nudged),
            (2, &nudged),
            (4, &x),
            (0, &x),
            (1, &x),
        ];
        let calls: Vec<_> = calls
            .into_iter()
            .filter(|(i, _)| kernel.types.contains(&weights[*i].0))
            .collect();
        let history: Vec<_> = calls
            .iter()
            .map(|&(i, x)| run(weights[i].0, &weights[i].1, x))
            .collect();
        for ((i, x), got) in calls.into_iter().zip(history) {
            let (ty, w) = &weights[i];
            assert_eq!(
                got,
                fresh(*ty, w, x),
                "{} {ty} after the earlier calls",
                kernel.name
            );
        }
    }
}

/// Non-finite activations make the limb kernels decline (the f32 path propagates them).
#[test]
fn limb_rows_decline_non_finite_activations() {
    let mut state = 12;
    for kernel in limb_kernels() {
        for &ty in kernel.types {
            let cols = 256;
            let w = quant_rows(&mut state, ty, 2, cols);
            for bad in [f32::NAN, f32::INFINITY] {
                let mut x = activations(&mut state, cols);
                x[40] = bad;
                let mut y = [0f32; 2];
                // SAFETY: as above.
                assert!(!unsafe { (kernel.rows)(ty, &w, ty.row_bytes(cols).unwrap(), &x, &mut y) });
                kernel.isa.matvec_serial(ty, &w, 2, cols, &x, &mut y);
                assert!(y.iter().all(|v| !v.is_finite()), "{} {ty}", kernel.name);
            }
        }
    }
}

/// Error study (run with --nocapture): the limb kernels' and the f32 kernels' errors against
/// an f64 dot, relative to sum |w x|, on SmolLM2-like shapes.
#[test]
fn limb_error_study() {
    let mut state = 13;
    for kernel in limb_kernels() {
        for &ty in kernel.types {
            for (rows, cols) in [(256, 576), (64, 1536), (64, 4864)]
                .into_iter()
                .filter(|(_, c)| c % ty.block_len() == 0)
            {
                let w = quant_rows(&mut state, ty, rows, cols);
                let x = activations(&mut state, cols);
                let row_bytes = ty.row_bytes(cols).unwrap();
                let mut limbs = vec![0f32; rows];
                // SAFETY: as above.
                assert!(unsafe { (kernel.rows)(ty, &w, row_bytes, &x, &mut limbs) });
                let f32_path: Vec<f32> = w
                    .chunks_exact(row_bytes)
                    .map(|row| kernel.isa.dot(ty, row, &x))
                    .collect();
                for (what, y) in [("limbs", &limbs), ("f32  ", &f32_path)] {
                    let errs = relative_errors(ty, &w, cols, &x, y);
                    let max = errs.iter().cloned().fold(0f64, f64::max);
                    let mean = errs.iter().sum::<f64>() / errs.len() as f64;
                    println!(
                        "{} {ty} {rows}x{cols} {what}: max {max:.2e} mean {mean:.2e}",
                        kernel.name
                    );
                    assert!(max <= 1e-5);
                }
            }
        }
    }
}

/// `matvec_columns` must give each column exactly `matvec_serial`'s bits for it alone:
/// speculative decoding's verification then agrees with plain decoding on every token. Every
/// path here; the limb kernels' types (the VNNI and simd128 limb kernels, and
/// `dot_blocks_columns`, one- and eight-group units), a float type; 1 to 10 and 17 columns
/// (past each kernel's column chunk); partial groups of blocks; a column the limb kernels
/// decline (NaN), beside finite ones.
#[test]
fn matvec_columns_equal_single_columns_bit_for_bit() {
    let mut state = 11;
    let types = LIMB_TYPES
        .iter()
        .copied()
        .chain([crate::TensorType::F16, crate::TensorType::F32]);
    for ty in types {
        for cols in [32, 96, 160, 256, 768] {
            if cols % ty.block_len() != 0 {
                continue;
            }
            for rows in [1, 5, 23] {
                let w = match ty {
                    crate::TensorType::F32 => floats(&mut state, rows * cols)
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                    crate::TensorType::F16 => floats(&mut state, rows * cols)
                        .iter()
                        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                        .collect(),
                    _ => quant_rows(&mut state, ty, rows, cols),
                };
                for n in (1..=10).chain([17]) {
                    let mut x: Vec<f32> =
                        (0..n).flat_map(|_| activations(&mut state, cols)).collect();
                    if n == 3 {
                        x[cols + 5] = f32::NAN;
                    }
                    for &isa in Isa::available() {
                        let mut together = vec![vec![0f32; rows]; n];
                        let mut ys: Vec<&mut [f32]> =
                            together.iter_mut().map(|y| y.as_mut_slice()).collect();
                        isa.matvec_columns(ty, &w, rows, cols, &x, &mut ys);
                        for (c, got) in together.iter().enumerate() {
                            let mut alone = vec![0f32; rows];
                            let xc = &x[c * cols..(c + 1) * cols];
                            isa.matvec_serial(ty, &w, rows, cols, xc, &mut alone);
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(got),
                                bits(&alone),
                                "{} {ty} {rows}x{cols}, column {c} of {n}",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }
}
