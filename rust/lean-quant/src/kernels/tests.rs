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
