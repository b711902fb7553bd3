//! Prefill's products: y = x·Wᵀ for a chunk of tokens (matmul.wgsl, register-tiled, with a
//! block decoder per tensor type), K split over more workgroups when the tiles are too few and
//! the slabs of partial sums added up by matmul_reduce.wgsl; a bias, SwiGLU pairs or a residual
//! add fused in on request.
use super::gated::Activation;
use super::wgsl::{self, Consts, ACTIVATION, BLOCK_TYPES, BYTES, UNITS};
use super::{check_len, pipeline, trusted_module, u32_arg, Kernels, RowField, TypedShaders};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;
use crate::weights::{GpuMatrix, Layout};
use lean_gguf::TensorType;

const MATMUL: &str = include_str!("../shaders/matmul.wgsl");
const MATMUL_REDUCE: &str = include_str!("../shaders/matmul_reduce.wgsl");

/// A matmul workgroup's tile: weight rows × tokens, and elements of K staged per step
/// (matmul.wgsl: TILE_ROWS, TILE_TOKENS, K_STEP). Each thread owns 8 rows × 4 tokens, so
/// `rows` is a multiple of 8, `tokens` of 4, and rows × tokens / 32 threads at most 256;
/// `k_step` is 8, 16 or 32 (a divisor of a unit: steps never cross a row's end).
#[derive(Clone, Copy, Debug, PartialEq)]
struct MatmulTile {
    rows: usize,
    tokens: usize,
    k_step: usize,
    /// Row quads of the threads of one 32-thread warp (the rest of the warp spans tokens).
    warp_rows: usize,
}

impl MatmulTile {
    /// The WGSL constants matmul.wgsl is built with.
    fn consts(&self) -> Consts {
        Consts::new()
            .u32("TILE_ROWS", self.rows)
            .u32("TILE_TOKENS", self.tokens)
            .u32("K_STEP", self.k_step)
            .u32("WARP_ROWS", self.warp_rows)
    }

    /// Threads of a workgroup: each owns 8 rows × 4 tokens.
    const fn threads(&self) -> usize {
        self.rows * self.tokens / 32
    }

    /// Bytes of workgroup memory of the tiles (matmul.wgsl: w_tile is k_step × rows f32,
    /// x_tile k_step × (tokens + 4)).
    const fn step_bytes(&self) -> usize {
        4 * self.k_step * (self.rows + self.tokens + 4)
    }

    /// Whether matmul.wgsl holds for this tile: the shape above; the portable limits (WebGPU's defaults: 256
    /// threads, 16 KiB of workgroup memory); every thread stages the same number of slices and
    /// activations per step (WEIGHT_ITERS, X_ITERS); and warps tile the threads (rq <
    /// ROW_THREADS, tq < TOKEN_THREADS): warp_rows divides the row threads (rows / 8), 32 /
    /// warp_rows the token threads (tokens / 4).
    const fn valid(&self) -> bool {
        let threads = self.threads();
        self.rows.is_multiple_of(8)
            && self.tokens.is_multiple_of(4)
            && (self.k_step == 8 || self.k_step == 16 || self.k_step == 32)
            && threads <= 256
            && self.step_bytes() <= 16384
            && (self.rows * self.k_step / 8).is_multiple_of(threads)
            && (self.tokens * self.k_step).is_multiple_of(threads)
            && 32 % self.warp_rows == 0
            && (self.rows / 8).is_multiple_of(self.warp_rows)
            && (self.tokens / 4).is_multiple_of(32 / self.warp_rows)
    }
}

/// The prefill matmul's tile: 256 threads, 12.25 KiB of workgroup memory. On an H200 it beat
/// 64 × 64, 128 × 32, 64 × 32 (×32), 256 × 32 (×8) and 8 × 8 outputs per thread (128 × 64,
/// 128 × 128, 64 × 64) at prefill chunks of 512 tokens; at chunks of 128, 128 × 32 was 5%
/// faster on Qwen2.5-0.5B's shape and 6-10% slower on SmolLM2-1.7B's and Qwen2.5-3B's.
///
/// A warp's 32 threads take 2 row quads × 16 token quads: its weight loads from workgroup
/// memory are then 2 addresses (broadcasts) and its activation loads 16 neighbouring vec4s. On
/// an H200 this made prefill of 512 tokens 5-7% faster than 16 row quads × 2 token quads (3B
/// Q4_0 ~5050 -> ~5400 tok/s, 1.7B ~8830 -> ~9400); 8 × 4 was the same as 16 × 2, 4 × 8 slower.
const MATMUL_TILE: MatmulTile = MatmulTile {
    rows: 128,
    tokens: 64,
    k_step: 16,
    warp_rows: 2,
};
const _: () = assert!(MATMUL_TILE.valid());

/// Workgroups a matmul dispatch should have to keep a large GPU busy (an H200 has 132
/// multiprocessors, each running two of these workgroups at once): with fewer tiles
/// than this, K is split (prefill chunks make small matrices, e.g. the K and V projections,
/// only a handful of tiles). On an H200, 264 against 512 (more splits) made prefill of 512
/// tokens ~3% faster on the 1.7B and 3B shapes (fewer partial sums to add); 396 was between.
const MATMUL_TARGET_GROUPS: usize = 264;
/// Least elements of K per split range (keeps the partial sums' traffic small; smaller ranges
/// are untried: they would give the smallest matrices, e.g. 128 × 896, more workgroups).
const MATMUL_SPLIT_MIN_LEN: usize = 256;
/// Threads per workgroup of matmul_reduce.wgsl.
const MATMUL_REDUCE_GROUP: usize = 256;

/// How a matmul of `groups` tiles splits K of `cols` elements: (ranges, elements per range, a
/// multiple of 32 so that ranges start at unit boundaries); at most `max_splits` ranges.
fn matmul_split(groups: usize, cols: usize, max_splits: usize) -> (usize, usize) {
    let most = (cols / MATMUL_SPLIT_MIN_LEN).min(max_splits).max(1);
    let wanted = MATMUL_TARGET_GROUPS.div_ceil(groups).clamp(1, most);
    let len = cols.div_ceil(wanted).next_multiple_of(32);
    // Rounding the length up may leave the last range empty: count the ranges again.
    (cols.div_ceil(len), len)
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    layout: Layout,
    rows: u32,
    cols: u32,
    first_row: u32,
    n_tokens: u32,
    out_stride: u32,
    row_tiles: u32,
    token_tiles: u32,
    accumulate: u32,
    splits: u32,
    split_len: u32,
    split_stride: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulReduceParams {
    rows: u32,
    n_tokens: u32,
    out_stride: u32,
    first_row: u32,
    splits: u32,
    accumulate: u32,
    bias: u32,
    /// 0: no pairs; 1: SiLU pairs; 2: GELU-tanh pairs (`Activation::code`).
    swiglu: u32,
}

/// What the prefill matmul fuses into its output (`Kernels::matmul_with`).
#[derive(Copy, Clone, Default)]
pub struct MatmulExtras<'a> {
    /// Plus bias[column] (bias spans the field's columns, from its offset).
    pub bias: Option<&'a wgpu::Buffer>,
    /// The rows are (gate, up) pairs, [gate_0, up_0, gate_1, ...] (a stacked gate|up matrix
    /// with its rows interleaved, stack.rs): y[t][pair] = act(gate) · up, so y's field is half
    /// as wide as the matrix has rows. No bias or accumulate with it.
    pub swiglu: bool,
    /// y += (a residual add), after the bias.
    pub accumulate: bool,
    /// The activation of `swiglu` (default SiLU).
    pub activation: Activation,
}

/// The matmul shaders, compiled without wgpu's runtime checks (clamped indices): prefill spends
/// most of its time in it, and its inner loop is workgroup-memory loads and FMAs, which the
/// clamps would nearly double. In the browser the checks stay.
///
/// Every access of matmul.wgsl and the block snippets' slice_weights is in range, from what
/// `Kernels::matmul_with` checks and `GpuMatrix` builds, for any MatmulTile as documented:
/// - weights: rows are clamped to `rows - 1`; a step's slices start at k0 / 8 with k0 < cols,
///   k0 a multiple of K_STEP (a divisor of 32) and cols at most 32 × units, so they stay below
///   `row_slices()`: the slices the matvec reads (see `matvec_module`); the step loaded
///   ahead is the next one while it starts below the range's end, else the current one;
/// - x: read at token t < n_tokens, element k < cols (both checked in the shader), and `x`
///   holds n_tokens × cols f32 (checked);
/// - K: a range starts at split × split_len (split_len a multiple of 32) and its steps run
///   while k0 < min(cols, its end);
/// - y: written at t × out_stride + first_row + r with t < n_tokens and r < rows, out_stride
///   the field's row width and first_row its offset plus the part's first row, so below
///   (n_tokens - 1) × width + offset + rows(), which `y` holds (checked); or, with K split, at
///   split × split_stride + t × rows + r for split < splits, below the splits × n_tokens × rows
///   f32 of the partial-sums buffer (`Kernels::partials`); with SWIGLU (never split) at
///   t × out_stride + (first_row + r) / 2 with first_row = 2 × offset + the part's first row
///   (even, as r and rows are), so below (n_tokens - 1) × width + offset + rows() / 2 (checked);
/// - bias (BIAS, never split): read at first_row + r, below offset + rows(), which `bias` holds
///   (checked);
/// - workgroup arrays: w_tile at (8 × slice + j) × ROW_QUADS + r / 4 for slice <
///   STEP_SLICES, j < 8, r < TILE_ROWS (a thread's staged i run below WEIGHT_ITERS ×
///   WORKGROUP = TILE_ROWS × STEP_SLICES, and below X_ITERS × WORKGROUP = TILE_TOKENS ×
///   K_STEP for x: `MatmulTile::valid`), and read at k × ROW_QUADS + (ROW_THREADS + rq),
///   rq < ROW_THREADS = ROW_QUADS / 2; x_tile at k × TOKEN_QUADS + t / 4 for t < TILE_TOKENS
///   (TOKEN_QUADS is TILE_TOKENS / 4 + 1), read at tq < TILE_TOKENS / 4; components by % 4;
/// - threads: rq = lane % WARP_ROWS + WARP_ROWS × (warp % (ROW_THREADS / WARP_ROWS)) stays below
///   ROW_THREADS and tq = lane / WARP_ROWS + (32 / WARP_ROWS) × (warp / (ROW_THREADS /
///   WARP_ROWS)) below TOKEN_THREADS, as WARP_ROWS divides ROW_THREADS and 32 / WARP_ROWS
///   TOKEN_THREADS (`MatmulTile::valid`);
/// - loops step by a positive constant toward a bound, and the divisions by variables are by
///   `row_tiles` and `token_tiles`, both at least 1 (parts and token counts are never empty).
///
/// `tests/kernels.rs` runs it on ragged tiles (rows, tokens and K not multiples of the tile's),
/// one-block rows, split parts, and F32 rows ending inside a step.
///
/// Its pipelines are keyed by the fusions (BIAS, SWIGLU and GELU bits).
pub(super) struct MatmulShaders(TypedShaders<u8>);

/// The fusions of a matmul pipeline (matmul.wgsl's overrides), as bits of its key.
const BIAS: u8 = 1;
const SWIGLU: u8 = 2;
const GELU: u8 = 4;

impl MatmulShaders {
    fn new(ctx: &GpuContext) -> Self {
        let modules = BLOCK_TYPES
            .iter()
            .map(|&(ty, block)| {
                let (label, source) = Self::source(ty, block);
                // SAFETY: every index is in range and every loop ends (see above).
                (ty, unsafe { trusted_module(ctx, &label, &source) })
            })
            .collect();
        MatmulShaders(TypedShaders::new("matmul", modules))
    }

    /// The label and source of the matmul shader of `ty` (block decoder `block`).
    fn source(ty: TensorType, block: &str) -> (String, String) {
        let parts = [BYTES, UNITS, ACTIVATION, block, MATMUL];
        let source = wgsl::assemble("", &MATMUL_TILE.consts(), &parts);
        (format!("matmul_{ty}"), source)
    }

    /// The override constants of the pipeline with `fusions`.
    fn constants(fusions: u8) -> [(&'static str, f64); 3] {
        let bit = |b: u8| (fusions & b != 0) as u8 as f64;
        [
            ("BIAS", bit(BIAS)),
            ("SWIGLU", bit(SWIGLU)),
            ("GELU", bit(GELU)),
        ]
    }

    /// The pipeline of `ty` with `bias` and/or `swiglu` (of activation `gelu`) fused in.
    fn pipeline(
        &self,
        ctx: &GpuContext,
        ty: TensorType,
        bias: bool,
        swiglu: bool,
        gelu: bool,
    ) -> Result<wgpu::ComputePipeline> {
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        let fusions = bit(bias, BIAS) | bit(swiglu, SWIGLU) | bit(gelu, GELU);
        self.0.pipeline(ctx, ty, fusions, &Self::constants(fusions))
    }
}

/// The matmul's pipelines and scratch.
pub(super) struct MatmulPipelines {
    tiles: MatmulShaders,
    reduce: wgpu::ComputePipeline,
    /// The partial sums of a matmul with K split, reused by every such dispatch (grown when
    /// one needs more): wgpu orders the dispatches that write and read it.
    partials: std::sync::Mutex<Option<wgpu::Buffer>>,
}

impl MatmulPipelines {
    pub(super) fn new(ctx: &GpuContext) -> Self {
        MatmulPipelines {
            tiles: MatmulShaders::new(ctx),
            reduce: pipeline(ctx, "matmul_reduce", &reduce_source()),
            partials: std::sync::Mutex::new(None),
        }
    }
}

/// matmul_reduce.wgsl's source.
fn reduce_source() -> String {
    let consts = Consts::new().u32("WORKGROUP", MATMUL_REDUCE_GROUP);
    wgsl::assemble("", &consts, &[ACTIVATION, MATMUL_REDUCE])
}

impl Kernels {
    /// Prefill: y = x·Wᵀ for `n_tokens` rows of x (`x`: n_tokens × cols, `y`: n_tokens × rows,
    /// the layout of lean_quant::matmul); one dispatch per part of a split matrix.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n_tokens: usize,
    ) -> Result<()> {
        let at = RowField::whole(m.rows());
        self.matmul_with(ctx, plan, m, x, (y, at), n_tokens, MatmulExtras::default())
    }

    /// Prefill into a field of wider rows: y[t × at.width + at.offset + r] = (x·Wᵀ)[t][r].
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_at(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        at: RowField,
        n_tokens: usize,
    ) -> Result<()> {
        self.matmul_with(ctx, plan, m, x, (y, at), n_tokens, MatmulExtras::default())
    }

    /// y += x·Wᵀ: matmul with the residual add fused in.
    pub fn matmul_add(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n_tokens: usize,
    ) -> Result<()> {
        let at = RowField::whole(m.rows());
        let extras = MatmulExtras {
            accumulate: true,
            ..Default::default()
        };
        self.matmul_with(ctx, plan, m, x, (y, at), n_tokens, extras)
    }

    /// Prefill with fusions (`MatmulExtras`): y[t × at.width + at.offset + c] for the columns c
    /// of the product (half the rows with SwiGLU).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_with(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        (y, at): (&wgpu::Buffer, RowField),
        n_tokens: usize,
        extras: MatmulExtras,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Err(GpuError::Shape("matmul of no tokens".into()));
        }
        let MatmulExtras {
            bias,
            swiglu,
            accumulate,
            activation,
        } = extras;
        if swiglu {
            let odd = m.rows() % 2 == 1 || m.parts().iter().any(|p| p.first_row % 2 == 1);
            if odd || bias.is_some() || accumulate {
                return Err(GpuError::Shape(format!(
                    "matmul: SwiGLU needs whole (gate, up) row pairs in every part and no bias or accumulate ({} rows)",
                    m.rows()
                )));
            }
        }
        let y_cols = if swiglu { m.rows() / 2 } else { m.rows() };
        check_len("matmul x", x, n_tokens * m.cols())?;
        check_len("matmul y", y, at.end("matmul y", n_tokens, y_cols)?)?;
        if let Some(b) = bias {
            check_len("matmul bias", b, at.end("matmul bias", 1, m.rows())?)?;
        }
        let tile = MATMUL_TILE;
        let token_tiles = n_tokens.div_ceil(tile.tokens);
        for part in m.parts() {
            let row_tiles = part.rows.div_ceil(tile.rows);
            let slab = n_tokens * part.rows;
            let max_splits = (ctx.max_binding_bytes() / 4) as usize / slab;
            let (splits, split_len) = matmul_split(row_tiles * token_tiles, m.cols(), max_splits);
            let partials = (splits > 1).then(|| self.partials(ctx, splits * slab));
            // SwiGLU's columns are (first_row + r) / 2: the field's offset counts twice.
            let first_row = match swiglu {
                true => 2 * at.offset + part.first_row,
                false => at.offset + part.first_row,
            };
            let params = MatmulParams {
                layout: m.layout(part),
                rows: u32_arg("rows", part.rows)?,
                cols: u32_arg("cols", m.cols())?,
                first_row: u32_arg("first row", first_row)?,
                n_tokens: u32_arg("tokens", n_tokens)?,
                out_stride: u32_arg("row width", at.width)?,
                row_tiles: u32_arg("row tiles", row_tiles)?,
                token_tiles: u32_arg("token tiles", token_tiles)?,
                accumulate: accumulate as u32,
                splits: splits as u32,
                split_len: split_len as u32,
                split_stride: 0,
                pad: 0,
            };
            // Split: the tiles write slabs of partial sums (n_tokens × rows each), which a second
            // dispatch adds up into y.
            let params = match &partials {
                None => params,
                Some(_) => MatmulParams {
                    first_row: 0,
                    out_stride: params.rows,
                    accumulate: 0,
                    split_stride: u32_arg("partial sums", slab)?,
                    ..params
                },
            };
            let groups = u32_arg("matmul workgroups", row_tiles * token_tiles * splits)?;
            // Split, the fusions are the second pass's.
            let (fuse_bias, fuse_swiglu) = match partials {
                None => (bias.is_some(), swiglu),
                Some(_) => (false, false),
            };
            let fuse_gelu = fuse_swiglu && activation.is_gelu();
            let pipeline =
                self.matmul
                    .tiles
                    .pipeline(ctx, m.ty(), fuse_bias, fuse_swiglu, fuse_gelu)?;
            let name = format!(
                "matmul{}{}{} {} {}x{}",
                if fuse_bias { "+bias" } else { "" },
                if fuse_swiglu { "+swiglu" } else { "" },
                if fuse_gelu { "(gelu)" } else { "" },
                m.ty(),
                part.rows,
                m.cols()
            );
            let out = partials.as_ref().unwrap_or(y);
            // Without a bias, x is bound in its place: read-only, never read as it.
            let buffers = [&part.buffer, x, out, bias.unwrap_or(x)];
            Self::dispatch(ctx, plan, name, &pipeline, &params, &buffers, groups)?;
            if let Some(partials) = &partials {
                let params = MatmulReduceParams {
                    rows: params.rows,
                    n_tokens: params.n_tokens,
                    out_stride: u32_arg("row width", at.width)?,
                    first_row: u32_arg("first row", first_row)?,
                    splits: splits as u32,
                    accumulate: accumulate as u32,
                    bias: bias.is_some() as u32,
                    swiglu: if swiglu { activation.code() } else { 0 },
                };
                let groups = u32_arg(
                    "matmul_reduce workgroups",
                    slab.div_ceil(MATMUL_REDUCE_GROUP),
                )?;
                let name = format!("matmul_reduce {}x{} /{splits}", part.rows, m.cols());
                let buffers = [partials, y, bias.unwrap_or(partials)];
                Self::dispatch(
                    ctx,
                    plan,
                    name,
                    &self.matmul.reduce,
                    &params,
                    &buffers,
                    groups,
                )?;
            }
        }
        Ok(())
    }

    /// The partial-sums buffer, at least `len` f32 (`len` is within the binding limit).
    fn partials(&self, ctx: &GpuContext, len: usize) -> wgpu::Buffer {
        // A poisoned lock only means another thread panicked while swapping the buffer.
        let mut partials = self
            .matmul
            .partials
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match &*partials {
            Some(buffer) if buffer.size() >= 4 * len as u64 => buffer.clone(),
            _ => {
                // Doubling: a few sizes until the largest split matmul fits.
                let most = (ctx.max_binding_bytes() / 4) as usize;
                let buffer =
                    ctx.storage_f32("matmul partial sums", len.next_power_of_two().min(most));
                *partials = Some(buffer.clone());
                buffer
            }
        }
    }
}

/// Every matmul shader and the pipelines made of it (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    // the fusions of unsplit dispatches (SwiGLU refuses a bias), and none when split
    let fusions = [0, BIAS, SWIGLU, SWIGLU | GELU];
    let mut variants: Vec<wgsl::Variant> = BLOCK_TYPES
        .iter()
        .map(|&(ty, block)| {
            let (label, source) = MatmulShaders::source(ty, block);
            let mut v = wgsl::Variant::main::<MatmulParams>(label, source);
            v.pipelines = fusions
                .iter()
                .map(|&f| MatmulShaders::constants(f).to_vec())
                .collect();
            v
        })
        .collect();
    variants.push(wgsl::Variant::main::<MatmulReduceParams>(
        "matmul_reduce",
        reduce_source(),
    ));
    variants
}
