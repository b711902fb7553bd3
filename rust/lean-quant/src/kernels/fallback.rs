//! Portable kernels, for targets without a SIMD path: the scalar dequantizers plus plain f32
//! loops over independent lanes, which the compiler can vectorize for whatever the target has.

use super::{dot_via_buffer, pack_columns, Gemm, Kernels, Strided, COLUMN_BLOCK};
use crate::{scalar, TensorType};

pub(super) static KERNELS: Kernels = Kernels {
    dot,
    rows,
    columns: None,
    dequant,
    vecmat,
    gemm: Gemm {
        panel_rows: ROWS,
        depth_block: 256,
        tiles: &[tile::<1>, tile::<2>, tile::<3>, tile::<4>],
        pack,
    },
};

/// Weight rows per micro-kernel panel.
const ROWS: usize = 8;
/// Independent partial sums of `f32_dot`.
const LANES: usize = 8;

/// See `RowsFn`: one fused dot per row.
unsafe fn rows(ty: TensorType, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]) {
    super::rows_by_dot(dot, ty, w, row_bytes, x, y)
}

unsafe fn dot(ty: TensorType, row: &[u8], x: &[f32]) -> f32 {
    dot_via_buffer(ty, row, x, f32_dot)
}

unsafe fn dequant(ty: TensorType, src: &[u8], dst: &mut [f32]) {
    scalar::dequantize(ty, src, dst)
}

/// See `PackFn`.
unsafe fn pack(rows: *const f32, row_stride: usize, depth: usize, packed: *mut f32) {
    pack_columns(rows, row_stride, ROWS, 0, depth, packed)
}

fn f32_dot(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (w_body, w_tail) = w.split_at(w.len() / LANES * LANES);
    let (x_body, x_tail) = x.split_at(w_body.len());
    for (ws, xs) in w_body.chunks_exact(LANES).zip(x_body.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += ws[l] * xs[l];
        }
    }
    let tail: f32 = w_tail.iter().zip(x_tail).map(|(w, x)| w * x).sum();
    acc.iter().sum::<f32>() + tail
}

/// See `TileFn`.
unsafe fn tile<const T: usize>(
    panel: *const f32,
    depth: usize,
    x: *const f32,
    x_stride: usize,
    y: *mut f32,
    y_stride: usize,
    accumulate: bool,
) {
    let mut acc = [[0f32; ROWS]; T];
    if accumulate {
        for (t, acc) in acc.iter_mut().enumerate() {
            *acc = *(y.add(t * y_stride) as *const [f32; ROWS]);
        }
    }
    for k in 0..depth {
        let a = *(panel.add(k * ROWS) as *const [f32; ROWS]);
        for (t, acc) in acc.iter_mut().enumerate() {
            let b = *x.add(t * x_stride + k);
            for r in 0..ROWS {
                acc[r] += a[r] * b;
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        *(y.add(t * y_stride) as *mut [f32; ROWS]) = *acc;
    }
}

/// Columns per `vecmat` tile: independent lanes the compiler can vectorize.
const VECMAT_COLS: usize = 16;
/// Rows of `a` per `vecmat` tile, sharing each loaded row of `m`.
const VECMAT_ROWS: usize = 4;

/// See `VecmatFn`. Portable: also the simd128 and NEON paths' kernel (they compile their
/// vector extension in, so these fixed-width loops vectorize for them).
pub(super) unsafe fn vecmat(
    a: *const f32,
    n: usize,
    depth: usize,
    m: Strided,
    cols: usize,
    y: *mut f32,
) {
    const _: () = assert!(COLUMN_BLOCK.is_multiple_of(VECMAT_COLS));
    for j in (0..cols).step_by(VECMAT_COLS) {
        let width = VECMAT_COLS.min(cols - j);
        let top = m.column(j);
        for h in (0..n).step_by(VECMAT_ROWS) {
            let rows = VECMAT_ROWS.min(n - h);
            let mut acc = [[0f32; VECMAT_COLS]; VECMAT_ROWS];
            for i in 0..depth {
                let src = top.add(i * m.row_stride);
                let m_row = if width == VECMAT_COLS {
                    (src as *const [f32; VECMAT_COLS]).read()
                } else {
                    // A tail tile reads its columns into a zero-padded row: full-width loops.
                    let mut row = [0f32; VECMAT_COLS];
                    std::ptr::copy_nonoverlapping(src, row.as_mut_ptr(), width);
                    row
                };
                for (r, acc) in acc[..rows].iter_mut().enumerate() {
                    let b = *a.add((h + r) * depth + i);
                    for (acc, &mv) in acc.iter_mut().zip(&m_row) {
                        *acc += b * mv;
                    }
                }
            }
            for (r, acc) in acc[..rows].iter().enumerate() {
                std::ptr::copy_nonoverlapping(acc.as_ptr(), y.add((h + r) * cols + j), width);
            }
        }
    }
}
