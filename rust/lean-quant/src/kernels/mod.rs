//! Fast kernels behind one dispatch: one module per instruction set, each providing
//! - a fused row dot (weights decoded in registers, FMA'd with f32 activations),
//! - a row dequantizer whose values equal `scalar::dequantize` bit for bit,
//! - an f32 register-tiled micro-kernel that `matmul` drives over dequantized weight panels.
//!
//! Activations stay f32 and sums are f32 on every path (no int8 activation quantization, which
//! would change greedy tokens against the float reference); paths differ only in summation
//! order.

use crate::TensorType;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod fallback;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;

/// A row dot. Safety: the CPU supports the kernel's ISA, `x.len()` is a whole number of blocks
/// of `ty` and `row` holds exactly those blocks.
type DotFn = unsafe fn(ty: TensorType, row: &[u8], x: &[f32]) -> f32;
/// A row dequantizer. Safety: as `DotFn`, with `dst` in place of `x`.
type DequantFn = unsafe fn(ty: TensorType, src: &[u8], dst: &mut [f32]);
/// Micro-kernel for `T` tokens (its index in `Gemm::tiles` plus one) and `Gemm::panel_rows`
/// weight rows: for t < T, r < R,
/// `y[t*y_stride + r] = (accumulate ? y[..] : 0) + sum_k panel[k*R + r] * x[t*x_stride + k]`
/// over k < depth. Safety: the CPU supports the ISA and every pointer covers what it reads or
/// writes.
type TileFn = unsafe fn(
    panel: *const f32,
    depth: usize,
    x: *const f32,
    x_stride: usize,
    y: *mut f32,
    y_stride: usize,
    accumulate: bool,
);

/// Packs `depth` columns of `Gemm::panel_rows` rows (row-major, `row_stride` apart) into
/// `packed` column-major: `packed[k*R + r] = rows[r*row_stride + k]`. Safety: the CPU supports
/// the ISA and the pointers cover that.
type PackFn = unsafe fn(rows: *const f32, row_stride: usize, depth: usize, packed: *mut f32);

struct Gemm {
    /// Weight rows per panel (the micro-kernel's vector width times its vectors per row).
    panel_rows: usize,
    /// Columns per cache block (dividing `PACK_COLUMNS`): a panel's slice of this depth
    /// should stay in L1.
    depth_block: usize,
    /// `tiles[i]` computes `i + 1` tokens; the last is the full register tile.
    tiles: &'static [TileFn],
    pack: PackFn,
}

struct Kernels {
    dot: DotFn,
    dequant: DequantFn,
    gemm: Gemm,
}

/// The instruction-set paths this crate has kernels for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// x86_64 AVX-512 F/BW/VL (with FMA and F16C), detected at run time.
    Avx512,
    /// x86_64 AVX2 with FMA and F16C, detected at run time.
    Avx2,
    /// wasm32 built with `-C target-feature=+simd128`.
    Simd128,
    /// Portable code: the scalar dequantizers plus plain f32 loops.
    Scalar,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Simd128 => "simd128",
            Isa::Scalar => "scalar",
        }
    }

    /// The paths that can run on this machine, fastest first (always ends with `Scalar`).
    pub fn available() -> &'static [Isa] {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(|| {
            let mut isas = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                if avx512::supported() {
                    isas.push(Isa::Avx512);
                }
                if avx2::supported() {
                    isas.push(Isa::Avx2);
                }
            }
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            isas.push(Isa::Simd128);
            isas.push(Isa::Scalar);
            isas
        })
    }

    /// The path the crate-level functions use: the fastest available one, unless the
    /// environment variable `LEAN_ISA` names another available path (for comparing paths on
    /// one machine; an unknown or unavailable name is ignored, and `crate::isa()` reports
    /// what actually runs).
    pub fn selected() -> Isa {
        static SELECTED: OnceLock<Isa> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let available = Isa::available();
            std::env::var("LEAN_ISA")
                .ok()
                .and_then(|name| available.iter().copied().find(|isa| isa.name().eq_ignore_ascii_case(name.trim())))
                .unwrap_or(available[0])
        })
    }

    fn kernels(self) -> &'static Kernels {
        assert!(Isa::available().contains(&self), "the {} kernels cannot run on this machine", self.name());
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &avx512::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &avx2::KERNELS,
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Isa::Simd128 => &simd128::KERNELS,
            Isa::Scalar => &fallback::KERNELS,
            #[allow(unreachable_patterns)] // `available()` never lists a path not compiled in.
            _ => unreachable!(),
        }
    }

    /// `crate::dot` on this path. Panics if the path is not available here or the sizes do not
    /// match (see `crate::dot`).
    pub fn dot(self, ty: TensorType, row: &[u8], x: &[f32]) -> f32 {
        let kernels = self.kernels();
        check_row(ty, row.len(), x.len());
        // SAFETY: `kernels()` checked the CPU; `check_row` checked the sizes.
        unsafe { (kernels.dot)(ty, row, x) }
    }

    /// `crate::dequantize_row` on this path.
    pub fn dequantize_row(self, ty: TensorType, src: &[u8], dst: &mut [f32]) {
        let kernels = self.kernels();
        check_row(ty, src.len(), dst.len());
        // SAFETY: as in `dot`.
        unsafe { (kernels.dequant)(ty, src, dst) }
    }

    /// `crate::matvec` on this path.
    pub fn matvec(self, ty: TensorType, w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
        let kernels = self.kernels();
        let row_bytes = check_matrix(ty, w.len(), rows, cols);
        assert!(x.len() == cols && y.len() == rows, "matvec: x has {} (want {cols}), y {} (want {rows}) elements", x.len(), y.len());
        if cols == 0 {
            y.fill(0.0);
            return;
        }
        let dot = kernels.dot;
        let rows_dot = |first_row: usize, ys: &mut [f32]| {
            let w = &w[first_row * row_bytes..];
            for (y, row) in ys.iter_mut().zip(w.chunks_exact(row_bytes)) {
                // SAFETY: the CPU was checked; `row` is one whole row and `x` has `cols` elements.
                *y = unsafe { dot(ty, row, x) };
            }
        };
        #[cfg(feature = "threads")]
        {
            use rayon::prelude::*;
            let tasks = parallel_tasks(rows * cols);
            if tasks > 1 {
                let chunk = rows.div_ceil(tasks);
                y.par_chunks_mut(chunk).enumerate().for_each(|(i, ys)| rows_dot(i * chunk, ys));
                return;
            }
        }
        rows_dot(0, y)
    }

    /// `crate::matmul` on this path.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(self, ty: TensorType, w: &[u8], rows: usize, cols: usize, x: &[f32], n: usize, y: &mut [f32]) {
        let kernels = self.kernels();
        let row_bytes = check_matrix(ty, w.len(), rows, cols);
        assert!(
            Some(x.len()) == n.checked_mul(cols) && Some(y.len()) == n.checked_mul(rows),
            "matmul: x has {} (want {n}x{cols}), y {} (want {n}x{rows}) elements",
            x.len(),
            y.len()
        );
        if cols == 0 {
            y.fill(0.0);
            return;
        }
        if n < MIN_BATCHED_TOKENS {
            // Too few tokens to pay for dequantizing panels: fused dots per token.
            for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows.max(1))) {
                self.matvec(ty, w, rows, cols, xt, yt);
            }
            return;
        }
        let gemm = Panels { kernels, ty, w, row_bytes, rows, cols, x, y: SharedOut(y.as_mut_ptr()) };
        let panels = rows.div_ceil(kernels.gemm.panel_rows);
        #[cfg(feature = "threads")]
        {
            use rayon::prelude::*;
            let tasks = parallel_tasks(rows * cols * n);
            if tasks > 1 {
                // Few panels (small `rows`) would leave threads idle: also split the tokens,
                // at the price of dequantizing a panel once per token range.
                let token_splits = tasks.div_ceil(panels).clamp(1, n.div_ceil(MIN_SPLIT_TOKENS));
                let per_split = n.div_ceil(token_splits);
                (0..panels * token_splits)
                    .into_par_iter()
                    .for_each_init(PanelScratch::default, |scratch, task| {
                        let first = (task % token_splits) * per_split;
                        let tokens = first..(first + per_split).min(n);
                        gemm.run(task / token_splits, tokens, scratch);
                    });
                return;
            }
        }
        let mut scratch = PanelScratch::default();
        for panel in 0..panels {
            gemm.run(panel, 0..n, &mut scratch);
        }
    }
}

/// Below this many tokens `matmul` runs fused matvecs instead of dequantizing panels.
const MIN_BATCHED_TOKENS: usize = 3;
/// A token range split off for parallelism keeps at least this many tokens.
#[cfg(feature = "threads")]
const MIN_SPLIT_TOKENS: usize = 32;
/// Multiply-adds worth a rayon task (several microseconds of work).
#[cfg(feature = "threads")]
const MIN_TASK_MACS: usize = 1 << 17;

/// How many rayon tasks to split `macs` of work into: 1 (run inline) when the pool has one
/// thread or the work is small; otherwise a few per thread for load balance.
#[cfg(feature = "threads")]
fn parallel_tasks(macs: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        return 1;
    }
    (threads * 4).min(macs / MIN_TASK_MACS).max(1)
}

fn check_row(ty: TensorType, bytes: usize, elements: usize) {
    assert!(
        ty.row_bytes(elements) == Some(bytes),
        "{ty}: {bytes} bytes do not hold exactly {elements} elements (whole {}-element blocks of {} bytes)",
        ty.block_len(),
        ty.block_bytes()
    );
}

/// Checks a `rows`x`cols` matrix of `ty` in `bytes` bytes; returns its row size in bytes.
fn check_matrix(ty: TensorType, bytes: usize, rows: usize, cols: usize) -> usize {
    let row_bytes = ty.row_bytes(cols);
    assert!(
        row_bytes.is_some() && row_bytes.and_then(|rb| rb.checked_mul(rows)) == Some(bytes),
        "{ty}: {bytes} bytes do not hold a {rows}x{cols} matrix (whole {}-element blocks of {} bytes)",
        ty.block_len(),
        ty.block_bytes()
    );
    row_bytes.unwrap_or(0)
}

/// `y`'s pointer, shared by the panel tasks; each writes only its own rows of every token.
#[derive(Copy, Clone)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint elements (see `Panels::run`), and `matmul` holds `&mut y` until
// they have all finished.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

/// One `matmul` call, cut into panels of `panel_rows` weight rows.
struct Panels<'a> {
    kernels: &'static Kernels,
    ty: TensorType,
    w: &'a [u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    x: &'a [f32],
    y: SharedOut,
}

/// Columns of a panel dequantized per step: one K-quant block, a multiple of every block length.
const PACK_COLUMNS: usize = 256;
/// Row stride of that step's buffer: padded by a cache line so that its rows do not all fall
/// into the same few L1 sets (a 1 KiB stride would).
const PACK_STRIDE: usize = PACK_COLUMNS + 16;

/// Buffers reused across the panels one task runs.
#[derive(Default)]
struct PanelScratch {
    /// `PACK_COLUMNS` columns of each of the panel's rows.
    rows: Vec<f32>,
    /// One depth block of the panel, column-major: `packed[k*R + r]` is row r, column k.
    packed: Vec<f32>,
    /// Output of a last, partial panel (`tokens x R`), copied into `y` afterwards.
    edge_out: Vec<f32>,
}

impl Panels<'_> {
    /// Computes the outputs of panel `panel` for `tokens`: dequantizes its rows once, then runs
    /// the micro-kernel over all those tokens, one depth block at a time so that the panel's
    /// block stays in L1 while the tokens stream past.
    fn run(&self, panel: usize, tokens: std::ops::Range<usize>, scratch: &mut PanelScratch) {
        let Gemm { panel_rows, depth_block, tiles, pack } = self.kernels.gemm;
        let (cols, rows) = (self.cols, self.rows);
        let first_row = panel * panel_rows;
        let panel_len = panel_rows.min(rows - first_row);

        let n_tokens = tokens.len();
        let edge = panel_len < panel_rows;
        // SAFETY (both branches): `y` has n x rows elements and this task owns rows
        // `first_row..first_row + panel_len` of tokens `tokens`.
        let (out, out_stride) = if edge {
            scratch.edge_out.resize(n_tokens * panel_rows, 0.0);
            (scratch.edge_out.as_mut_ptr(), panel_rows)
        } else {
            (unsafe { self.y.0.add(tokens.start * rows + first_row) }, rows)
        };

        // PACK_COLUMNS columns of every row of the panel are dequantized at a time (row-major,
        // so that the row kernels write contiguous runs); each depth block of them is then
        // transposed into the column-major `packed` (L1-sized) and run over all the tokens.
        debug_assert_eq!(PACK_COLUMNS % depth_block, 0);
        scratch.rows.resize(panel_rows * PACK_STRIDE, 0.0);
        scratch.packed.resize(depth_block * panel_rows, 0.0);
        let dequant = self.kernels.dequant;
        let (block_len, block_bytes) = (self.ty.block_len(), self.ty.block_bytes());
        let full_tile = tiles.len();
        for k0 in (0..cols).step_by(PACK_COLUMNS) {
            let width = PACK_COLUMNS.min(cols - k0);
            let (offset, bytes) = (k0 / block_len * block_bytes, width / block_len * block_bytes);
            for (r, dst) in scratch.rows.chunks_exact_mut(PACK_STRIDE).enumerate() {
                let dst = &mut dst[..width];
                if r < panel_len {
                    let src = &self.w[(first_row + r) * self.row_bytes + offset..][..bytes];
                    // SAFETY: the CPU was checked; `src` holds exactly `width` elements (chunks
                    // start at multiples of PACK_COLUMNS, a multiple of every block length).
                    unsafe { dequant(self.ty, src, dst) };
                } else {
                    dst.fill(0.0);
                }
            }
            for d0 in (0..width).step_by(depth_block) {
                let depth = depth_block.min(width - d0);
                // SAFETY: the CPU was checked; `rows` has `panel_rows` rows of PACK_STRIDE
                // with `d0 + depth <= width` columns filled, `packed` `depth * panel_rows`.
                unsafe { pack(scratch.rows.as_ptr().add(d0), PACK_STRIDE, depth, scratch.packed.as_mut_ptr()) };
                let mut t = 0;
                while t < n_tokens {
                    let tile = full_tile.min(n_tokens - t);
                    // SAFETY: `packed` holds `depth` columns of `panel_rows`; the x rows
                    // `tokens.start + t ..+ tile` have `cols` elements from `k0 + d0`; `out`
                    // has `tile` rows of `out_stride` from token `t`, of which the kernel
                    // touches `panel_rows` (all ours: a full panel, or the edge buffer).
                    unsafe {
                        tiles[tile - 1](
                            scratch.packed.as_ptr(),
                            depth,
                            self.x.as_ptr().add((tokens.start + t) * cols + k0 + d0),
                            cols,
                            out.add(t * out_stride),
                            out_stride,
                            k0 + d0 > 0,
                        )
                    };
                    t += tile;
                }
            }
        }
        if edge {
            for (t, out_row) in scratch.edge_out.chunks_exact(panel_rows).enumerate() {
                // SAFETY: as above; only this panel's `panel_len` rows are written.
                unsafe {
                    let dst = self.y.0.add((tokens.start + t) * rows + first_row);
                    std::ptr::copy_nonoverlapping(out_row.as_ptr(), dst, panel_len);
                }
            }
        }
    }
}

/// `PackFn` in plain code, for columns `from..depth` (the ISA kernels transpose whole
/// squares and leave the remaining columns to this).
unsafe fn pack_columns(rows: *const f32, row_stride: usize, panel_rows: usize, from: usize, depth: usize, packed: *mut f32) {
    for k in from..depth {
        for r in 0..panel_rows {
            *packed.add(k * panel_rows + r) = *rows.add(r * row_stride + k);
        }
    }
}

/// A dot through the scalar dequantizer, 256 elements (one K-quant block) at a time into a
/// stack buffer, each chunk summed by `f32_dot`. For paths and types without a fused kernel.
fn dot_via_buffer(ty: TensorType, row: &[u8], x: &[f32], f32_dot: impl Fn(&[f32], &[f32]) -> f32) -> f32 {
    const CHUNK: usize = 256;
    let chunk_bytes = CHUNK / ty.block_len() * ty.block_bytes();
    let mut buf = [0f32; CHUNK];
    let mut sum = 0.0;
    for (bytes, xs) in row.chunks(chunk_bytes).zip(x.chunks(CHUNK)) {
        let weights = &mut buf[..xs.len()];
        crate::scalar::dequantize(ty, bytes, weights);
        sum += f32_dot(weights, xs);
    }
    sum
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block (ggml's `get_scale_min_k4` for sub-blocks
/// 0..8, see `scalar::dequantize_q4_k`), one per byte: `(scales, mins)`.
fn k4_scales_mins(packed: &[u8; 12]) -> (u64, u64) {
    let [a, b, c] = words(packed);
    // Sub-blocks 0..4 keep their low 6 bits in bytes 0..8; 4..8 have their low nibbles in
    // bytes 8..12 and their top two bits in the spare bits 6..8 of bytes 0..8.
    let scales_high = (c & 0x0F0F_0F0F) | ((a >> 6) & 0x0303_0303) << 4;
    let mins_high = ((c >> 4) & 0x0F0F_0F0F) | ((b >> 6) & 0x0303_0303) << 4;
    ((a & 0x3F3F_3F3F) as u64 | (scales_high as u64) << 32, (b & 0x3F3F_3F3F) as u64 | (mins_high as u64) << 32)
}

/// The sixteen 6-bit scales of a Q3_K block (stored with a +32 offset, see
/// `scalar::dequantize_q3_k`), one per byte, as four little-endian words.
fn q3_k_scales(packed: &[u8; 12]) -> [u32; 4] {
    let [a, b, c] = words(packed);
    let low = 0x0F0F_0F0F;
    let high = |shift: u32| ((c >> shift) & 0x0303_0303) << 4;
    [(a & low) | high(0), (b & low) | high(2), ((a >> 4) & low) | high(4), ((b >> 4) & low) | high(6)]
}

fn words(packed: &[u8; 12]) -> [u32; 3] {
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    [word(0), word(1), word(2)]
}
