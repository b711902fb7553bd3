//! Portable kernels, for targets without a SIMD path: the scalar dequantizers plus plain f32
//! loops over independent lanes, which the compiler can vectorize for whatever the target has.

use super::{dot_via_buffer, pack_columns, Gemm, Kernels};
use crate::{scalar, TensorType};

pub(super) static KERNELS: Kernels = Kernels {
    dot,
    dequant,
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
