//! Fast kernels behind one dispatch: one module per instruction set, each providing
//! - a fused row dot (weights decoded in registers, FMA'd with f32 activations),
//! - a row dequantizer whose values equal `scalar::dequantize` bit for bit,
//! - an f32 register-tiled micro-kernel that `matmul` drives over dequantized weight panels.
//!
//! Activations stay f32 and sums are f32 on every path (no int8 activation quantization, which
//! would change greedy tokens against the float reference); paths differ only in summation
//! order.

use crate::TensorType;
use std::ops::Range;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_vnni;
mod fallback;
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128_limbs;
#[cfg(test)]
mod tests;

/// The last activations a thread split for an integer limb kernel (`avx512_vnni`,
/// `simd128_limbs`), and their split: one decode stage hands the same `x` to several matrices
/// (q, k and v; gate and up), and a split costs as much as a few hundred rows' dots. Reused
/// only for bit-identical `x` and the same key (the layout it was made for), so the result is
/// the same as splitting again.
#[allow(dead_code)] // used by the limb kernels this target has, if any
struct SplitCache<K, T> {
    key: Option<K>,
    bits: Vec<u32>,
    split: Vec<T>,
}

#[allow(dead_code)]
impl<K: Copy + PartialEq, T> SplitCache<K, T> {
    const fn new() -> Self {
        SplitCache {
            key: None,
            bits: Vec::new(),
            split: Vec::new(),
        }
    }

    /// The split of `x` for `key`: the cached one, or what `make` writes (`make` returns
    /// `false` to decline, and then so does this, with `None`).
    fn get_or_make(
        &mut self,
        key: K,
        x: &[f32],
        make: impl FnOnce(&mut Vec<T>) -> bool,
    ) -> Option<&[T]> {
        let holds = self.key == Some(key)
            && self.bits.len() == x.len()
            && self.bits.iter().zip(x).all(|(&b, v)| b == v.to_bits());
        if !holds {
            self.key = None;
            if !make(&mut self.split) {
                return None;
            }
            self.key = Some(key);
            self.bits.clear();
            self.bits.extend(x.iter().map(|v| v.to_bits()));
        }
        Some(&self.split)
    }

    /// The split last made (empty before any).
    fn held(&self) -> &[T] {
        &self.split
    }

    /// Drops the cached split (tests: a call after this sees nothing cached).
    fn forget(&mut self) {
        self.key = None;
    }
}

/// The splits of `n` activations of `cols` elements, one after another in `x`, one cache per
/// column (`splits` grows to `n`), each made by `make` when not cached for `key`: `false` when
/// `make` declines a column (multi-column kernels then decline the whole call).
#[allow(dead_code)]
fn split_columns<K: Copy + PartialEq, T>(
    splits: &mut Vec<SplitCache<K, T>>,
    key: K,
    x: &[f32],
    cols: usize,
    n: usize,
    mut make: impl FnMut(&[f32], &mut Vec<T>) -> bool,
) -> bool {
    if splits.len() < n {
        splits.resize_with(n, SplitCache::new);
    }
    splits[..n].iter_mut().enumerate().all(|(c, split)| {
        let xc = &x[c * cols..(c + 1) * cols];
        split.get_or_make(key, xc, |out| make(xc, out)).is_some()
    })
}

/// One marker type per block format; each ISA module implements its own `Decode` trait for
/// them, so the format list is written once.
#[allow(non_camel_case_types, dead_code)]
mod formats {
    pub struct F32;
    pub struct F16;
    pub struct BF16;
    pub struct Q4_0;
    pub struct Q4_1;
    pub struct Q5_0;
    pub struct Q5_1;
    pub struct Q8_0;
    pub struct Q2_K;
    pub struct Q3_K;
    pub struct Q4_K;
    pub struct Q5_K;
    pub struct Q6_K;
}

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

/// `y = a · m` in f32: for h < n, j < cols,
/// `y[h*cols + j] = sum_i a[h*depth + i] * m(i, j)` over i < depth, summed in order of i.
/// Safety: the CPU supports the ISA, `a` covers `n * depth`, `y` `n * cols`, and `m` rows
/// `0..depth` of columns `0..cols`.
type VecmatFn =
    unsafe fn(a: *const f32, n: usize, depth: usize, m: Strided, cols: usize, y: *mut f32);

/// `F32Matrix`'s layout as a pointer, for the kernels.
#[derive(Copy, Clone)]
struct Strided {
    data: *const f32,
    row_stride: usize,
    block_stride: usize,
}

impl Strided {
    /// Row 0 of columns `j..` (up to the end of `j`'s column block). Safety: `j` is a column of
    /// the matrix.
    unsafe fn column(self, j: usize) -> *const f32 {
        self.data
            .add(j / COLUMN_BLOCK * self.block_stride + j % COLUMN_BLOCK)
    }
}

/// Columns per block of an `F32Matrix`: every kernel's column tiles divide it.
pub const COLUMN_BLOCK: usize = 32;

/// A read-only f32 matrix for `vecmat`, `rows` x `cols`: element (i, j) is at
/// `data[(j / COLUMN_BLOCK) * block_stride + i * row_stride + j % COLUMN_BLOCK]`.
#[derive(Copy, Clone)]
pub struct F32Matrix<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    block_stride: usize,
}

/// The shape and layout, not the elements.
impl std::fmt::Debug for F32Matrix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("F32Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("row_stride", &self.row_stride)
            .field("block_stride", &self.block_stride)
            .field("data_len", &self.data.len())
            .finish()
    }
}

impl<'a> F32Matrix<'a> {
    /// Row-major with rows `stride` elements apart (a column range of a wider matrix when
    /// `stride > cols`).
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize, stride: usize) -> Self {
        F32Matrix {
            data,
            rows,
            cols,
            row_stride: stride,
            block_stride: COLUMN_BLOCK,
        }
    }

    /// Column-blocked: blocks of `COLUMN_BLOCK` columns one after another, each `block_rows`
    /// rows of `COLUMN_BLOCK` contiguous elements (`block_rows >= rows`: a matrix can be the
    /// top of a taller one). A run of columns then reads contiguous memory, where row-major
    /// rows far apart would read a short piece of each.
    pub fn column_blocked(data: &'a [f32], rows: usize, cols: usize, block_rows: usize) -> Self {
        F32Matrix {
            data,
            rows,
            cols,
            row_stride: COLUMN_BLOCK,
            block_stride: block_rows.saturating_mul(COLUMN_BLOCK),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Elements of `data` the layout reaches (`None` on overflow).
    fn extent(&self) -> Option<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Some(0);
        }
        let last_block = (self.cols - 1) / COLUMN_BLOCK;
        let bottom = (self.rows - 1).checked_mul(self.row_stride)?;
        // The last block may be narrower than the one before it.
        let end_of = |block: usize, width: usize| {
            block
                .checked_mul(self.block_stride)?
                .checked_add(bottom)?
                .checked_add(width)
        };
        let last = end_of(last_block, self.cols - last_block * COLUMN_BLOCK)?;
        match last_block {
            0 => Some(last),
            _ => Some(last.max(end_of(last_block - 1, COLUMN_BLOCK)?)),
        }
    }
}

/// Row dots of a matrix: `y[r] = dot(row r, x)`, rows `row_bytes` apart. Safety: as `DotFn`
/// for every row, with `w` holding exactly `y.len()` rows.
type RowsFn = unsafe fn(ty: TensorType, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]);

/// Row dots of a matrix for several activations at once (speculative decoding's verification
/// pass): `ys[c][r] = dot(row r, x[c*cols..])`, each bit for bit what `RowsFn` gives for that
/// column alone, the weights decoded once for all columns; `false` (nothing written) where the
/// path has no multi-column kernel for the type or its kernel declines the activations (the
/// caller then runs `RowsFn` per column). Safety: as `RowsFn` for every column.
type ColumnsFn = unsafe fn(
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    cols: usize,
    ys: &mut [&mut [f32]],
) -> bool;

struct Kernels {
    dot: DotFn,
    rows: RowsFn,
    /// A multi-column `rows`; without one, `rows` runs once per column.
    columns: Option<ColumnsFn>,
    dequant: DequantFn,
    vecmat: VecmatFn,
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
    /// aarch64 NEON (part of the base target).
    Neon,
    /// Portable code: the scalar dequantizers plus plain f32 loops.
    Scalar,
}

impl Isa {
    /// The path's name as `crate::isa()` reports it ("avx512", "avx2", "simd128", "neon",
    /// "scalar").
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Simd128 => "simd128",
            Isa::Neon => "neon",
            Isa::Scalar => "scalar",
        }
    }

    /// The paths that can run on this machine, fastest first (always ends with `Scalar`).
    pub fn available() -> &'static [Isa] {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(|| {
            [
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx512, avx512::supported()),
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx2, avx2::supported()),
                #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
                (Isa::Simd128, true),
                #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
                (Isa::Neon, true),
                (Isa::Scalar, true),
            ]
            .into_iter()
            .filter_map(|(isa, supported)| supported.then_some(isa))
            .collect()
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
                .and_then(|name| {
                    available
                        .iter()
                        .copied()
                        .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()))
                })
                .unwrap_or(available[0])
        })
    }

    fn kernels(self) -> &'static Kernels {
        assert!(
            Isa::available().contains(&self),
            "the {} kernels cannot run on this machine",
            self.name()
        );
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &avx512::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &avx2::KERNELS,
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Isa::Simd128 => &simd128::KERNELS,
            #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
            Isa::Neon => &neon::KERNELS,
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

    /// `crate::vecmat` on this path.
    pub fn vecmat(self, a: &[f32], n: usize, m: F32Matrix, y: &mut [f32]) {
        let kernels = self.kernels();
        let extent = m.extent();
        assert!(
            Some(a.len()) == n.checked_mul(m.rows)
                && Some(y.len()) == n.checked_mul(m.cols)
                && extent.is_some_and(|e| e <= m.data.len()),
            "vecmat: a has {} (want {n}x{}), y {} (want {n}x{}) elements; the {}x{} matrix \
             reaches {extent:?} of {} elements",
            a.len(),
            m.rows,
            y.len(),
            m.cols,
            m.rows,
            m.cols,
            m.data.len()
        );
        if n == 0 || m.cols == 0 {
            return;
        }
        let strided = Strided {
            data: m.data.as_ptr(),
            row_stride: m.row_stride,
            block_stride: m.block_stride,
        };
        // SAFETY: `kernels()` checked the CPU; the sizes were checked above.
        unsafe { (kernels.vecmat)(a.as_ptr(), n, m.rows, strided, m.cols, y.as_mut_ptr()) }
    }

    /// `crate::matvec` on this path.
    pub fn matvec(
        self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        y: &mut [f32],
    ) {
        self.matvec_maybe_parallel(ty, w, rows, cols, x, y, true)
    }

    /// `crate::matvec_serial` on this path.
    pub fn matvec_serial(
        self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        y: &mut [f32],
    ) {
        self.matvec_maybe_parallel(ty, w, rows, cols, x, y, false)
    }

    /// `crate::matvec_columns` on this path.
    pub fn matvec_columns(
        self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        ys: &mut [&mut [f32]],
    ) {
        let kernels = self.kernels();
        let row_bytes = check_matrix(ty, w.len(), rows, cols);
        assert!(
            Some(x.len()) == ys.len().checked_mul(cols) && ys.iter().all(|y| y.len() == rows),
            "matvec_columns: x has {} (want {}x{cols}) elements, ys {:?} (want {rows} each)",
            x.len(),
            ys.len(),
            ys.iter().map(|y| y.len()).collect::<Vec<_>>()
        );
        if cols == 0 {
            ys.iter_mut().for_each(|y| y.fill(0.0));
            return;
        }
        // SAFETY: the CPU was checked; `w` holds `rows` whole rows of `cols` elements, and `x`
        // one activation of `cols` per output.
        let done = ys.len() > 1
            && kernels
                .columns
                .is_some_and(|columns| unsafe { columns(ty, w, row_bytes, x, cols, ys) });
        if !done {
            for (xc, y) in x.chunks_exact(cols).zip(ys.iter_mut()) {
                // SAFETY: as above.
                unsafe { (kernels.rows)(ty, w, row_bytes, xc, y) };
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn matvec_maybe_parallel(
        self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        y: &mut [f32],
        #[allow(unused_variables)] parallel: bool,
    ) {
        let kernels = self.kernels();
        let row_bytes = check_matrix(ty, w.len(), rows, cols);
        assert!(
            x.len() == cols && y.len() == rows,
            "matvec: x has {} (want {cols}), y {} (want {rows}) elements",
            x.len(),
            y.len()
        );
        if cols == 0 {
            y.fill(0.0);
            return;
        }
        let rows_dot = |first_row: usize, ys: &mut [f32]| {
            let w = &w[first_row * row_bytes..][..ys.len() * row_bytes];
            // SAFETY: the CPU was checked; `w` holds `ys.len()` whole rows of `cols` elements.
            unsafe { (kernels.rows)(ty, w, row_bytes, x, ys) };
        };
        #[cfg(feature = "threads")]
        if parallel {
            use rayon::prelude::*;
            let tasks = parallel_tasks(rows.saturating_mul(cols));
            if tasks > 1 {
                let chunk = rows.div_ceil(tasks);
                y.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(i, ys)| rows_dot(i * chunk, ys));
                return;
            }
        }
        rows_dot(0, y)
    }

    /// `crate::matmul` on this path.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) {
        let kernels = self.kernels();
        let row_bytes = check_matrix(ty, w.len(), rows, cols);
        assert!(
            Some(x.len()) == n.checked_mul(cols) && Some(y.len()) == n.checked_mul(rows),
            "matmul: x has {} (want {n}x{cols}), y {} (want {n}x{rows}) elements",
            x.len(),
            y.len()
        );
        if rows == 0 || cols == 0 {
            y.fill(0.0);
            return;
        }
        if n < MIN_BATCHED_TOKENS {
            // Too few tokens to pay for dequantizing panels: fused dots per token.
            for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                self.matvec(ty, w, rows, cols, xt, yt);
            }
            return;
        }
        let gemm = Panels {
            kernels,
            ty,
            w,
            row_bytes,
            rows,
            cols,
            x,
            y: SharedOut(y.as_mut_ptr()),
        };
        let panels = rows.div_ceil(kernels.gemm.panel_rows);
        // Work items: a block of tokens times a group of panels. Within one, every panel
        // passes over the same PACK_COLUMNS-wide slice of the block's activations before the
        // next slice, so that slice stays in L2; each panel is dequantized once per token block.
        #[cfg(feature = "threads")]
        let tasks = parallel_tasks(rows.saturating_mul(cols).saturating_mul(n));
        #[cfg(not(feature = "threads"))]
        let tasks = 1;
        let block = if tasks > panels {
            // Few panels (small `rows`) would leave threads idle: smaller token blocks.
            TOKEN_BLOCK.min(n.div_ceil(tasks.div_ceil(panels)).max(MIN_SPLIT_TOKENS))
        } else {
            TOKEN_BLOCK
        }
        .min(n);
        let token_blocks = n.div_ceil(block);
        let group = panels.div_ceil(tasks.div_ceil(token_blocks).min(panels));
        let groups = panels.div_ceil(group);
        let run = |task: usize, scratch: &mut PanelScratch| {
            let (first_token, first_panel) = (task / groups * block, task % groups * group);
            let tokens = first_token..(first_token + block).min(n);
            gemm.run(
                first_panel..(first_panel + group).min(panels),
                tokens,
                scratch,
            );
        };
        #[cfg(feature = "threads")]
        if tasks > 1 {
            use rayon::prelude::*;
            (0..token_blocks * groups)
                .into_par_iter()
                .for_each_init(PanelScratch::default, |scratch, task| run(task, scratch));
            return;
        }
        let mut scratch = PanelScratch::default();
        for task in 0..token_blocks * groups {
            run(task, &mut scratch);
        }
    }
}

/// Tokens per work item of `matmul`: their activation slices (PACK_COLUMNS wide, 128 KiB)
/// stay in L2 while a group of panels passes over them.
const TOKEN_BLOCK: usize = 128;
/// Below this many tokens `matmul` runs fused matvecs instead of dequantizing panels.
const MIN_BATCHED_TOKENS: usize = 4;
/// A token block made smaller for parallelism keeps at least this many tokens.
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
    /// Output of the last panel when it is partial (`tokens x R`), copied into `y` at the end.
    edge_out: Vec<f32>,
}

impl Panels<'_> {
    /// Computes the outputs of `panels` for `tokens`. PACK_COLUMNS columns at a time, for each
    /// panel: dequantizes those columns of its rows (row-major, so that the row kernels write
    /// contiguous runs), then for each depth block of them transposes it into the
    /// column-major `packed` (L1-sized) and runs the micro-kernel over all the tokens.
    fn run(&self, panels: Range<usize>, tokens: Range<usize>, scratch: &mut PanelScratch) {
        let Gemm {
            panel_rows,
            depth_block,
            tiles,
            pack,
        } = self.kernels.gemm;
        let (cols, rows, n_tokens) = (self.cols, self.rows, tokens.len());
        debug_assert_eq!(PACK_COLUMNS % depth_block, 0);
        scratch.rows.resize(panel_rows * PACK_STRIDE, 0.0);
        scratch.packed.resize(depth_block * panel_rows, 0.0);
        // Only the last panel can be partial; its outputs go to `edge_out` first.
        scratch.edge_out.resize(n_tokens * panel_rows, 0.0);
        let dequant = self.kernels.dequant;
        let (block_len, block_bytes) = (self.ty.block_len(), self.ty.block_bytes());
        let full_tile = tiles.len();
        for k0 in (0..cols).step_by(PACK_COLUMNS) {
            let width = PACK_COLUMNS.min(cols - k0);
            let (offset, bytes) = (
                k0 / block_len * block_bytes,
                width / block_len * block_bytes,
            );
            for panel in panels.clone() {
                let first_row = panel * panel_rows;
                let panel_len = panel_rows.min(rows - first_row);
                let (out, out_stride) = if panel_len < panel_rows {
                    (scratch.edge_out.as_mut_ptr(), panel_rows)
                } else {
                    // SAFETY: `y` has n x rows elements; this task owns rows
                    // `first_row..first_row + panel_rows` of tokens `tokens`.
                    (
                        unsafe { self.y.0.add(tokens.start * rows + first_row) },
                        rows,
                    )
                };
                for (r, dst) in scratch.rows.chunks_exact_mut(PACK_STRIDE).enumerate() {
                    let dst = &mut dst[..width];
                    if r < panel_len {
                        let src = &self.w[(first_row + r) * self.row_bytes + offset..][..bytes];
                        // SAFETY: the CPU was checked; `src` holds exactly `width` elements
                        // (chunks start at multiples of PACK_COLUMNS, a multiple of every block
                        // length).
                        unsafe { dequant(self.ty, src, dst) };
                    } else {
                        dst.fill(0.0);
                    }
                }
                for d0 in (0..width).step_by(depth_block) {
                    let depth = depth_block.min(width - d0);
                    // SAFETY: the CPU was checked; `rows` has `panel_rows` rows of PACK_STRIDE
                    // with `d0 + depth <= width` columns filled, `packed` `depth * panel_rows`.
                    unsafe {
                        pack(
                            scratch.rows.as_ptr().add(d0),
                            PACK_STRIDE,
                            depth,
                            scratch.packed.as_mut_ptr(),
                        )
                    };
                    let mut t = 0;
                    while t < n_tokens {
                        let tile = full_tile.min(n_tokens - t);
                        // SAFETY: `packed` holds `depth` columns of `panel_rows`; the x rows
                        // `tokens.start + t ..+ tile` have `cols` elements from `k0 + d0`;
                        // `out` has `tile` rows of `out_stride` from token `t`, of which the
                        // kernel touches `panel_rows` (all ours: a full panel, or `edge_out`).
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
        }
        // `panels` is never empty, and the last panel of `y` is the only partial one.
        let last = panels.end - 1;
        let panel_len = rows - last * panel_rows;
        if panel_len < panel_rows {
            for (t, out_row) in scratch.edge_out.chunks_exact(panel_rows).enumerate() {
                // SAFETY: as above, for the last panel's `panel_len` rows.
                unsafe {
                    let dst = self.y.0.add((tokens.start + t) * rows + last * panel_rows);
                    std::ptr::copy_nonoverlapping(out_row.as_ptr(), dst, panel_len);
                }
            }
        }
    }
}

/// `PackFn` in plain code, for columns `from..depth` (the ISA kernels transpose whole
/// squares and leave the remaining columns to this). Safety: as `PackFn`.
unsafe fn pack_columns(
    rows: *const f32,
    row_stride: usize,
    panel_rows: usize,
    from: usize,
    depth: usize,
    packed: *mut f32,
) {
    for k in from..depth {
        for r in 0..panel_rows {
            *packed.add(k * panel_rows + r) = *rows.add(r * row_stride + k);
        }
    }
}

/// `RowsFn` as one `DotFn` call per row, for paths and types without a multi-row kernel.
/// Safety: as `RowsFn`.
unsafe fn rows_by_dot(
    dot: DotFn,
    ty: TensorType,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    y: &mut [f32],
) {
    for (r, (y, row)) in y.iter_mut().zip(w.chunks_exact(row_bytes)).enumerate() {
        prefetch_ahead(w, r * row_bytes..(r + 1) * row_bytes);
        *y = dot(ty, row, x);
    }
}

/// Asks for the bytes `prefetch_distance()` past `about_to_read` (a range of `w` a kernel is
/// about to read), as far as `w` goes: the next rows arrive while these are computed.
#[inline(always)]
pub(crate) fn prefetch_ahead(w: &[u8], about_to_read: Range<usize>) {
    let ahead = prefetch_distance();
    let from = (about_to_read.start + ahead).min(w.len());
    let to = (about_to_read.end + ahead).min(w.len());
    prefetch(&w[from..to]);
}

/// How far ahead of the bytes a matvec reads it asks for the next ones (`prefetch`). A decode
/// step streams every weight once from memory, and the hardware prefetchers alone left a
/// Q4_0 matvec waiting on its loads (most of its samples under `perf`) at a third of the
/// machine's streaming bandwidth (BENCHMARKS.md). `LEAN_PREFETCH` (bytes; 0 = off) overrides.
pub(crate) fn prefetch_distance() -> usize {
    static DISTANCE: OnceLock<usize> = OnceLock::new();
    *DISTANCE.get_or_init(|| {
        std::env::var("LEAN_PREFETCH")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_PREFETCH_BYTES)
    })
}

const DEFAULT_PREFETCH_BYTES: usize = 4096;

/// Asks for the cache lines of `bytes` to be loaded (a hint: nothing is read, nothing can
/// fault). A no-op where the target has no prefetch instruction in stable Rust.
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut p = bytes.as_ptr();
        let end = p.wrapping_add(bytes.len());
        while p < end {
            // SAFETY: prefetch is a hint that never faults; SSE is part of x86_64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p as *const i8,
                )
            };
            p = p.wrapping_add(64);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// A dot through the scalar dequantizer, 256 elements (one K-quant block) at a time into a
/// stack buffer, each chunk summed by `f32_dot`. For paths and types without a fused kernel.
fn dot_via_buffer(
    ty: TensorType,
    row: &[u8],
    x: &[f32],
    f32_dot: impl Fn(&[f32], &[f32]) -> f32,
) -> f32 {
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
// used by the SIMD kernels alone (not by wasm32 without simd128)
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
fn k4_scales_mins(packed: &[u8; 12]) -> (u64, u64) {
    let [a, b, c] = words(packed);
    // Sub-blocks 0..4 keep their low 6 bits in bytes 0..8; 4..8 have their low nibbles in
    // bytes 8..12 and their top two bits in the spare bits 6..8 of bytes 0..8.
    let scales_high = (c & 0x0F0F_0F0F) | ((a >> 6) & 0x0303_0303) << 4;
    let mins_high = ((c >> 4) & 0x0F0F_0F0F) | ((b >> 6) & 0x0303_0303) << 4;
    (
        (a & 0x3F3F_3F3F) as u64 | (scales_high as u64) << 32,
        (b & 0x3F3F_3F3F) as u64 | (mins_high as u64) << 32,
    )
}

/// The sixteen 6-bit scales of a Q3_K block (stored with a +32 offset, see
/// `scalar::dequantize_q3_k`), one per byte, as four little-endian words.
// used by the SIMD kernels alone (not by wasm32 without simd128)
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
fn q3_k_scales(packed: &[u8; 12]) -> [u32; 4] {
    let [a, b, c] = words(packed);
    let low = 0x0F0F_0F0F;
    let high = |shift: u32| ((c >> shift) & 0x0303_0303) << 4;
    [
        (a & low) | high(0),
        (b & low) | high(2),
        ((a >> 4) & low) | high(4),
        ((b >> 4) & low) | high(6),
    ]
}

// used by the SIMD kernels alone (not by wasm32 without simd128)
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
fn words(packed: &[u8; 12]) -> [u32; 3] {
    let word = |i: usize| {
        u32::from_le_bytes([
            packed[4 * i],
            packed[4 * i + 1],
            packed[4 * i + 2],
            packed[4 * i + 3],
        ])
    };
    [word(0), word(1), word(2)]
}
