//! Every kernel path available on this machine, for every tensor type, against the scalar
//! dequantizer: dequantized rows bit for bit, and dot/matvec/matmul against an f64 dot of the
//! scalar weights within `TOLERANCE` of the sum of |w * x| (only the f32 summation order may
//! differ, so a single wrong weight in a row of thousands already shows).

use half::{bf16, f16};
use lean_quant::{scalar, Isa, TensorType};

/// Allowed |kernel - exact| relative to sum |w_i * x_i|.
const TOLERANCE: f64 = 1e-5;

/// splitmix64: deterministic test data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// Byte offsets of the f16 scale fields (d, dmin, m) inside one block.
fn f16_fields(ty: TensorType) -> &'static [usize] {
    match ty {
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => &[],
        TensorType::Q4_0 | TensorType::Q5_0 | TensorType::Q8_0 => &[0],
        TensorType::Q4_1 | TensorType::Q5_1 | TensorType::Q4_K | TensorType::Q5_K => &[0, 2],
        TensorType::Q2_K => &[80, 82],
        TensorType::Q3_K => &[108],
        TensorType::Q6_K => &[208],
    }
}

/// `rows` random rows of `cols` elements. Quant bits are random; scale fields are finite
/// (some negative, some tiny) so that every weight is finite; float elements are finite too
/// unless `raw_floats`, which keeps random bit patterns (NaN, infinities, subnormals).
fn random_matrix(
    rng: &mut Rng,
    ty: TensorType,
    rows: usize,
    cols: usize,
    raw_floats: bool,
) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols).expect("whole blocks");
    let mut w = rng.bytes(rows * row_bytes);
    let finite_f16 = |rng: &mut Rng, scale: f32| f16::from_f32(rng.unit() * scale).to_le_bytes();
    match ty {
        TensorType::F32 if !raw_floats => {
            for e in w.chunks_exact_mut(4) {
                e.copy_from_slice(&(rng.unit() * 4.0).to_le_bytes());
            }
        }
        TensorType::F16 if !raw_floats => {
            for e in w.chunks_exact_mut(2) {
                e.copy_from_slice(&finite_f16(rng, 4.0));
            }
        }
        TensorType::BF16 if !raw_floats => {
            for e in w.chunks_exact_mut(2) {
                e.copy_from_slice(&bf16::from_f32(rng.unit() * 4.0).to_le_bytes());
            }
        }
        _ => {
            for block in w.chunks_exact_mut(ty.block_bytes()) {
                for &at in f16_fields(ty) {
                    // Mostly ordinary scales, sometimes f16 subnormals.
                    let scale = if rng.next_u64().is_multiple_of(8) {
                        1e-5
                    } else {
                        0.05
                    };
                    block[at..at + 2].copy_from_slice(&finite_f16(rng, scale));
                }
            }
        }
    }
    w
}

fn scalar_rows(ty: TensorType, w: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    scalar::dequantize(ty, w, &mut out);
    out
}

/// Exact-ish reference: (f64 dot, sum of |w * x|).
fn reference_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &x)| {
        let p = w as f64 * x as f64;
        (s + p, a + p.abs())
    })
}

fn assert_close(got: f32, w: &[f32], x: &[f32], what: &dyn Fn() -> String) {
    let (exact, magnitude) = reference_dot(w, x);
    let err = (got as f64 - exact).abs();
    assert!(
        err <= TOLERANCE * magnitude + 1e-30,
        "{}: got {got}, exact {exact}, error {err:e} > {TOLERANCE:e} * {magnitude:e}",
        what()
    );
}

/// Column counts: 1..=5 blocks plus the real models' widths, where they are whole blocks;
/// float types also get counts that leave SIMD tails.
fn test_cols(ty: TensorType) -> Vec<usize> {
    let mut cols: Vec<usize> = (1..=5).map(|b| b * ty.block_len()).collect();
    if !ty.is_quantized() {
        cols.extend([31, 33, 37, 67, 100]);
    }
    cols.extend(
        [576, 896, 1536, 4864]
            .into_iter()
            .filter(|c| c % ty.block_len() == 0),
    );
    cols
}

#[test]
fn the_paths_this_target_has_are_available() {
    let available = Isa::available();
    assert_eq!(available.last(), Some(&Isa::Scalar));
    assert!(available.contains(&Isa::selected()));
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        assert_eq!(available.contains(&Isa::Avx2), avx2);
        let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        assert_eq!(available.contains(&Isa::Avx512), avx512);
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    assert_eq!(available, [Isa::Simd128, Isa::Scalar]);
    #[cfg(target_arch = "aarch64")]
    assert_eq!(available, [Isa::Neon, Isa::Scalar]);
}

#[test]
fn dequantize_row_is_bit_exact_on_every_path() {
    let mut rng = Rng(1);
    for &isa in Isa::available() {
        for ty in TensorType::ALL {
            for cols in test_cols(ty) {
                for raw in [false, true] {
                    let src = random_matrix(&mut rng, ty, 1, cols, raw);
                    let expected = scalar_rows(ty, &src, 1, cols);
                    let mut got = vec![f32::NAN; cols];
                    isa.dequantize_row(ty, &src, &mut got);
                    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{} {ty} cols {cols} element {i}: {g} vs scalar {e}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn dot_matches_the_scalar_weights_on_every_path() {
    let mut rng = Rng(2);
    for &isa in Isa::available() {
        for ty in TensorType::ALL {
            for cols in test_cols(ty) {
                for _ in 0..3 {
                    let row = random_matrix(&mut rng, ty, 1, cols, false);
                    let w = scalar_rows(ty, &row, 1, cols);
                    let x = rng.floats(cols);
                    let got = isa.dot(ty, &row, &x);
                    assert_close(got, &w, &x, &|| {
                        format!("{} {ty} dot cols {cols}", isa.name())
                    });
                }
            }
        }
    }
}

#[test]
fn matvec_matches_the_scalar_weights_on_every_path() {
    let mut rng = Rng(3);
    for &isa in Isa::available() {
        for ty in TensorType::ALL {
            for cols in test_cols(ty) {
                for rows in [1, 3, 17, 33] {
                    check_matvec(&mut rng, isa, ty, rows, cols);
                }
            }
        }
    }
}

fn check_matvec(rng: &mut Rng, isa: Isa, ty: TensorType, rows: usize, cols: usize) {
    let w = random_matrix(rng, ty, rows, cols, false);
    let wf = scalar_rows(ty, &w, rows, cols);
    let x = rng.floats(cols);
    let mut y = vec![f32::NAN; rows];
    isa.matvec(ty, &w, rows, cols, &x, &mut y);
    for (r, &got) in y.iter().enumerate() {
        assert_close(got, &wf[r * cols..][..cols], &x, &|| {
            format!("{} {ty} matvec {rows}x{cols} row {r}", isa.name())
        });
    }
}

fn check_matmul(rng: &mut Rng, isa: Isa, ty: TensorType, rows: usize, cols: usize, n: usize) {
    let w = random_matrix(rng, ty, rows, cols, false);
    let wf = scalar_rows(ty, &w, rows, cols);
    let x = rng.floats(n * cols);
    let mut y = vec![f32::NAN; n * rows];
    isa.matmul(ty, &w, rows, cols, &x, n, &mut y);
    for t in 0..n {
        for r in 0..rows {
            assert_close(
                y[t * rows + r],
                &wf[r * cols..][..cols],
                &x[t * cols..][..cols],
                &|| {
                    format!(
                        "{} {ty} matmul {rows}x{cols} n {n}: token {t} row {r}",
                        isa.name()
                    )
                },
            );
        }
    }
}

#[test]
fn matmul_matches_the_scalar_weights_on_every_path() {
    let mut rng = Rng(4);
    for &isa in Isa::available() {
        for ty in TensorType::ALL {
            let cols = test_cols(ty);
            // Token counts around every path's register tile (4, 6, 12) and the fused-dot
            // cutoff; row counts around its panel (8, 16, 32).
            for (i, n) in [1, 2, 3, 5, 7, 13, 25].into_iter().enumerate() {
                for rows in [1, 3, 17, 33] {
                    check_matmul(&mut rng, isa, ty, rows, cols[(i + rows) % cols.len()], n);
                }
            }
        }
    }
}

/// Sizes big enough to be split across threads (rows, and for matmul token ranges too), and
/// deep enough for several cache blocks; run on a 3-thread pool whatever the machine has
/// (inline where threads cannot be spawned, as on wasm32 without atomics).
#[test]
fn threaded_matvec_and_matmul_match() {
    let run = || {
        let mut rng = Rng(5);
        for &isa in Isa::available() {
            for ty in [
                TensorType::Q4_0,
                TensorType::Q4_K,
                TensorType::Q6_K,
                TensorType::F16,
            ] {
                check_matvec(&mut rng, isa, ty, 131, 1536);
                check_matmul(&mut rng, isa, ty, 45, 1536, 70);
                check_matmul(&mut rng, isa, ty, 200, 512, 9);
            }
        }
    };
    match rayon::ThreadPoolBuilder::new().num_threads(3).build() {
        Ok(pool) => pool.install(run),
        Err(_) => run(),
    }
}

#[test]
fn crate_functions_use_the_selected_path() {
    let mut rng = Rng(6);
    let (ty, rows, cols, n) = (TensorType::Q4_0, 5, 64, 4);
    let w = random_matrix(&mut rng, ty, rows, cols, false);
    let x = rng.floats(n * cols);
    let isa = Isa::selected();
    assert_eq!(lean_quant::isa(), isa.name());
    assert_eq!(
        lean_quant::dot(ty, &w[..36], &x[..cols]).to_bits(),
        isa.dot(ty, &w[..36], &x[..cols]).to_bits()
    );
    let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
    lean_quant::matvec(ty, &w, rows, cols, &x[..cols], &mut a);
    isa.matvec(ty, &w, rows, cols, &x[..cols], &mut b);
    assert_eq!(a, b);
    let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
    lean_quant::matmul(ty, &w, rows, cols, &x, n, &mut a);
    isa.matmul(ty, &w, rows, cols, &x, n, &mut b);
    assert_eq!(a, b);
    let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
    lean_quant::dequantize_row(ty, &w[..36], &mut a);
    isa.dequantize_row(ty, &w[..36], &mut b);
    assert_eq!(a, b);
}

#[test]
fn empty_shapes_give_zeros() {
    for &isa in Isa::available() {
        let mut y = vec![f32::NAN; 3];
        isa.matvec(TensorType::Q8_0, &[], 3, 0, &[], &mut y);
        assert_eq!(y, [0.0; 3]);
        let mut y = vec![f32::NAN; 6];
        isa.matmul(TensorType::Q8_0, &[], 3, 0, &[], 2, &mut y);
        assert_eq!(y, [0.0; 6]);
        assert_eq!(isa.dot(TensorType::Q4_K, &[], &[]), 0.0);
        isa.matmul(TensorType::Q8_0, &[], 0, 32, &[0.0; 320], 10, &mut []);
    }
}

#[test]
#[should_panic(expected = "whole 32-element blocks")]
fn a_partial_block_is_refused() {
    let x = [0f32; 48];
    lean_quant::dot(TensorType::Q4_0, &[0u8; 27], &x);
}

#[test]
#[should_panic(expected = "do not hold a 4x64 matrix")]
fn a_short_matrix_is_refused() {
    let mut y = [0f32; 4];
    lean_quant::matvec(TensorType::Q8_0, &[0u8; 3 * 68], 4, 64, &[0.0; 64], &mut y);
}

#[test]
#[should_panic(expected = "matmul: x has")]
fn a_wrong_activation_size_is_refused() {
    let mut y = [0f32; 8];
    lean_quant::matmul(
        TensorType::Q8_0,
        &[0u8; 4 * 68],
        4,
        64,
        &[0.0; 64],
        2,
        &mut y,
    );
}
