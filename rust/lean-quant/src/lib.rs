//! Tensor types and their kernels.
//!
//! `scalar` holds the reference dequantizers (bit-exact with gguf-py); the crate-level functions
//! run the fastest kernel set for this machine (see `Isa`), whose weights equal the scalar
//! dequantizer's bit for bit and whose sums are f32 in a different order.
pub use lean_gguf::TensorType;
mod kernels;
pub mod scalar;

pub use kernels::{F32Matrix, Isa, COLUMN_BLOCK};

/// Which kernel set runs here ("avx512", "avx2", "simd128", "neon", "scalar"), for logs and
/// benchmarks.
pub fn isa() -> &'static str {
    Isa::selected().name()
}

/// `dot(dequantize(row), x)`: `row` is one row of `x.len()` elements of type `ty`.
///
/// # Panics
/// If `x.len()` is not a whole number of blocks or `row` is not exactly that many blocks.
pub fn dot(ty: TensorType, row: &[u8], x: &[f32]) -> f32 {
    Isa::selected().dot(ty, row, x)
}

/// Decode step: `y[r] = dot(row r of w, x)` for a `rows` x `cols` matrix `w`. Runs on the
/// current rayon pool when the "threads" feature is on.
///
/// # Panics
/// If the slice sizes do not match `rows`, `cols` and `ty`.
pub fn matvec(ty: TensorType, w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    Isa::selected().matvec(ty, w, rows, cols, x, y)
}

/// `matvec` on the calling thread only: for callers that split the rows (or several matrices)
/// into parallel tasks of their own.
///
/// # Panics
/// As `matvec`.
pub fn matvec_serial(ty: TensorType, w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    Isa::selected().matvec_serial(ty, w, rows, cols, x, y)
}

/// `matvec_serial` for several activations at once: `x` holds `ys.len()` of `cols` elements,
/// one after another, and `ys[c][r] = dot(row r of w, x[c*cols..(c+1)*cols])`. Each column's
/// values equal `matvec_serial`'s for it alone bit for bit, while the weights are read and
/// decoded once for all columns (speculative decoding's verification pass costs little more
/// than one decode step, and agrees with plain decoding exactly).
///
/// # Panics
/// If the slice sizes do not match `rows`, `cols`, `ys.len()` and `ty`.
pub fn matvec_columns(
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    ys: &mut [&mut [f32]],
) {
    Isa::selected().matvec_columns(ty, w, rows, cols, x, ys)
}

/// Prefill: `x` is `n` x `cols` (one token per row), `y` is `n` x `rows`:
/// `y[t*rows + r] = dot(row r of w, row t of x)`. Dequantizes panels of weight rows once and
/// runs an f32 register-tiled kernel over all tokens; parallel over panels with "threads".
///
/// # Panics
/// If the slice sizes do not match `rows`, `cols`, `n` and `ty`.
pub fn matmul(
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    Isa::selected().matmul(ty, w, rows, cols, x, n, y)
}

/// `y = a · m` in f32, on the calling thread: `a` is `n` x `m.rows()` (row-major), `y` is
/// `n` x `m.cols()`. Each output sums its products in order of `m`'s rows. Attention runs on
/// this: queries times transposed keys, probabilities times values.
///
/// # Panics
/// If the slice sizes do not match `n` and `m`'s shape, or `m`'s layout reaches past its data.
pub fn vecmat(a: &[f32], n: usize, m: F32Matrix, y: &mut [f32]) {
    Isa::selected().vecmat(a, n, m, y)
}

/// Dequantizes a whole row (e.g. an embedding lookup); values identical to
/// `scalar::dequantize`.
///
/// # Panics
/// If `dst.len()` is not a whole number of blocks or `src` is not exactly that many blocks.
pub fn dequantize_row(ty: TensorType, src: &[u8], dst: &mut [f32]) {
    Isa::selected().dequantize_row(ty, src, dst)
}
