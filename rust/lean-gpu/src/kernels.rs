//! Compute pipelines of the WGSL kernels and functions that record one dispatch each into a
//! command encoder. Sizes are checked here (wgpu would clamp out-of-bounds accesses silently).
//!
//! The matvec, matmul and embed kernels are one shader per tensor type, assembled at pipeline
//! creation as `bytes.wgsl + units.wgsl + quant_<type>.wgsl + <skeleton>.wgsl`: WGSL has no
//! includes, and override constants cannot swap the block decoder, so each skeleton (rows,
//! tiles, reductions) is written once and each type contributes only its block layout
//! (`slice_x`/`slice_dot` for matvec, `slice_weights` for matmul's tiles, `weight_at` for
//! embed).
//!
//! Decode is one matvec per weight matrix (a layer's q|k|v and gate|up are one matrix each
//! where they stack, see stack.rs; a matrix may write its rows as a field of wider rows,
//! `RowField`, so separate ones fill the same rows), bound by memory bandwidth: weights of the
//! common types are repacked at upload into planes of a word per 8-element slice (weights.rs);
//! neighbouring threads take neighbouring slices, so their loads of weights and activations
//! are contiguous, and each thread dots its slice of x with the workgroup's 4 rows. The threads
//! sum their partial dots in workgroup memory (matvec_workgroup.wgsl), or, when asked for, with
//! subgroupAdd (matvec_subgroup.wgsl).
//!
//! Prefill is one matmul per weight matrix, bound by f32 FMAs: register-tiled (matmul.wgsl),
//! with K split over more workgroups when a matrix has too few tiles to fill the device, the
//! partial sums added up by a second pass (matmul_reduce.wgsl).
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;
use crate::weights::{packs_row_quads, GpuMatrix, Layout, ROW_QUAD};
use lean_gguf::TensorType;

const BYTES: &str = include_str!("shaders/bytes.wgsl");
const UNITS: &str = include_str!("shaders/units.wgsl");
const MATVEC: &str = include_str!("shaders/matvec.wgsl");
const MATVEC_WORKGROUP: &str = include_str!("shaders/matvec_workgroup.wgsl");
const MATVEC_SUBGROUP: &str = include_str!("shaders/matvec_subgroup.wgsl");
const MATVEC_ROW_BY_ROW: &str = include_str!("shaders/matvec_row_by_row.wgsl");
const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const MATMUL_REDUCE: &str = include_str!("shaders/matmul_reduce.wgsl");
const EMBED: &str = include_str!("shaders/embed.wgsl");
const ARGMAX: &str = include_str!("shaders/argmax.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const ATTENTION_COMBINE: &str = include_str!("shaders/attention_combine.wgsl");
const ATTENTION_PREFILL: &str = include_str!("shaders/attention_prefill.wgsl");
/// Browsers' WGSL wants subgroups enabled in the shader; naga (native) has no such directive.
const SUBGROUPS_DIRECTIVE: &str = if cfg!(target_arch = "wasm32") {
    "enable subgroups;\n"
} else {
    ""
};
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
    fn wgsl_constants(&self) -> String {
        format!(
            "const TILE_ROWS: u32 = {}u;\nconst TILE_TOKENS: u32 = {}u;\nconst K_STEP: u32 = {}u;\n\
             const WARP_ROWS: u32 = {}u;\n",
            self.rows, self.tokens, self.k_step, self.warp_rows
        )
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

/// Rows each matvec thread dots its slices with, and so rows per workgroup (matvec.wgsl:
/// ROWS_PER_THREAD). On an H200, 4 against 2 made decode 7% faster (x and a fused norm's
/// weights are read once per 4 rows), given 512-thread workgroups for long rows (with at most
/// 256 the 2048 × 11008 down projection took 16.2 instead of 12.6 µs); 8 was 8% slower than 2.
const MATVEC_ROWS_PER_THREAD: usize = 4;
// matvec.wgsl keeps the rows in quads (vec4 sums, quad_dot), which start where the row-quad
// types' quads do.
const _: () = assert!(MATVEC_ROWS_PER_THREAD.is_multiple_of(ROW_QUAD) && ROW_QUAD == 4);
/// Threads per workgroup of the element-wise kernels (rope_kv_store, silu_mul, add).
const ELEMENTWISE_GROUP: u32 = 64;

/// The tensor types with matvec and matmul kernels, and their block decoders.
const MATVEC_TYPES: [(TensorType, &str); 7] = [
    (TensorType::F32, include_str!("shaders/quant_f32.wgsl")),
    (TensorType::Q4_0, include_str!("shaders/quant_q4_0.wgsl")),
    (TensorType::Q4_1, include_str!("shaders/quant_q4_1.wgsl")),
    (TensorType::Q5_0, include_str!("shaders/quant_q5_0.wgsl")),
    (TensorType::Q8_0, include_str!("shaders/quant_q8_0.wgsl")),
    (TensorType::Q4_K, include_str!("shaders/quant_q4_k.wgsl")),
    (TensorType::Q6_K, include_str!("shaders/quant_q6_k.wgsl")),
];

/// Whether `matvec` and `matmul` support weights of type `ty`.
pub fn matvec_supports(ty: TensorType) -> bool {
    MATVEC_TYPES.iter().any(|(t, _)| *t == ty)
}

/// Threads of a matvec dispatch that keep the device busy (about a thousand per multiprocessor
/// of a large GPU): below this, a workgroup's rows get more threads.
const MATVEC_TARGET_THREADS: usize = 1 << 17;
/// The matvec workgroup sizes (matvec.wgsl: WORKGROUP), one pipeline each. 512 only with the
/// subgroup reduction (matvec_workgroup.wgsl's tree arrays hold 256) on devices that allow it.
const MATVEC_WORKGROUP_SIZES: [usize; 4] = [64, 128, 256, 512];
/// The largest workgroup of the tree reduction (matvec_workgroup.wgsl's arrays).
const MATVEC_TREE_MAX_WORKGROUP: usize = 256;
/// Entries of matvec_subgroup.wgsl's array, one per subgroup: enough for the largest workgroup
/// in subgroups of wgpu's smallest size.
const MATVEC_SUBGROUP_SLOTS: usize = 128;
const _: () = assert!(
    MATVEC_WORKGROUP_SIZES[MATVEC_WORKGROUP_SIZES.len() - 1]
        <= MATVEC_SUBGROUP_SLOTS * wgpu::MINIMUM_SUBGROUP_MIN_SIZE as usize
);

/// The constants matvec.wgsl and its reductions take from here, as WGSL (prepended).
fn matvec_constants() -> String {
    format!(
        "const ROWS_PER_THREAD: u32 = {MATVEC_ROWS_PER_THREAD}u;\n\
         const TREE_SLOTS: u32 = {MATVEC_TREE_MAX_WORKGROUP}u;\n\
         const SUBGROUP_SLOTS: u32 = {MATVEC_SUBGROUP_SLOTS}u;\n"
    )
}

/// Index in MATVEC_WORKGROUP_SIZES (below `sizes`) of the threads that split a row's `slices`
/// among them in a matvec of `workgroups` workgroups: enough for about 4 slices each (each
/// thread pays for the reduction once), more while the device is short of threads, at most
/// one per slice.
fn matvec_size_index(slices: usize, workgroups: usize, sizes: usize) -> usize {
    let most = slices.next_power_of_two();
    let mut i = MATVEC_WORKGROUP_SIZES[..sizes]
        .iter()
        .position(|&n| n >= slices / 4)
        .unwrap_or(sizes - 1);
    while i + 1 < sizes
        && MATVEC_WORKGROUP_SIZES[i] < most
        && workgroups * MATVEC_WORKGROUP_SIZES[i] < MATVEC_TARGET_THREADS
    {
        i += 1;
    }
    i
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    layout: Layout,
    rows: u32,
    cols: u32,
    first_row: u32,
    accumulate: u32,
    bias: u32,
    eps: f32,
    up_offset: u32,
    pad: [u32; 5],
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
    swiglu: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct RmsNormParams {
    n: u32,
    n_rows: u32,
    eps: f32,
    pad: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeKvStoreParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    neox: u32,
    capacity: u32,
    cache_offset: u32,
    /// (row width, offset) of q, k and v in the qkv buffer.
    q: [u32; 2],
    k: [u32; 2],
    v: [u32; 2],
    pad: [u32; 2],
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    capacity: u32,
    cache_offset: u32,
    scale: f32,
    n_splits: u32,
    stats_offset: u32,
    /// (row width, offset) of q.
    q: [u32; 2],
    fresh: u32,
    rope_dim: u32,
    neox: u32,
    k_offset: u32,
    v_offset: u32,
    pad: [u32; 4],
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct PrefillAttentionParams {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    capacity: u32,
    cache_offset: u32,
    scale: f32,
    query_blocks: u32,
    /// (row width, offset) of q.
    q: [u32; 2],
    pad: [u32; 2],
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct CombineParams {
    n_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    n_splits: u32,
    stats_offset: u32,
    capacity: u32,
    pad: [u32; 2],
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedParams {
    layout: Layout,
    n_tokens: u32,
    cols: u32,
    first_row: u32,
    rows: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct SiluMulParams {
    n: u32,
    n_rows: u32,
    /// (row width, offset) of gate and up.
    gate: [u32; 2],
    up: [u32; 2],
    /// Elements between a field's consecutive elements.
    pitch: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct CountParams {
    n: u32,
    extra: u32,
    pad: [u32; 2],
}

/// Which elements of a head rotate together (see lean's `RopeStyle`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// (2i, 2i + 1): llama GGUFs.
    Interleaved,
    /// (i, i + rope_dim / 2): qwen2 GGUFs.
    Neox,
}

/// The step's tokens as the q|k|v projection left them, for an attention that rotates and
/// caches them itself (`Kernels::attention`): the k and v fields of the rows that hold q, and
/// the rotary embedding (`fresh_rope_supported`).
#[derive(Copy, Clone)]
pub struct FreshTokens<'a> {
    pub k: RowField,
    pub v: RowField,
    pub cos_sin: &'a wgpu::Buffer,
    pub rope: Rope,
}

/// Whether `attention` can take the step's tokens unrotated (`FreshTokens`): its quads pair
/// whole (rope_dim a multiple of 8 for NeoX's halves, of 4 for interleaved pairs); else
/// rope_kv_store runs first.
pub fn fresh_rope_supported(rope: &Rope, head_dim: usize) -> bool {
    let quads = match rope.pairing {
        RopePairing::Neox => 8,
        RopePairing::Interleaved => 4,
    };
    rope.rope_dim <= head_dim && rope.rope_dim.is_multiple_of(quads)
}

/// The rotary embedding: the leading `rope_dim` elements of each head rotate, by a table of
/// (cos, sin) from `rope_cos_sin` for `positions` positions.
#[derive(Copy, Clone, Debug)]
pub struct Rope {
    pub rope_dim: usize,
    pub positions: usize,
    pub pairing: RopePairing,
}

/// What a matvec fuses in besides y = W·x (`Kernels::matvec_with`).
#[derive(Copy, Clone, Default)]
pub struct MatvecExtras<'a> {
    /// x is RMS-normalized (LlamaRMSNorm; the dot is scaled, not each x): the norm's weights,
    /// zero-padded to a multiple of 8 elements, and its eps.
    pub norm: Option<(&'a wgpu::Buffer, f32)>,
    /// x is a gate and the activations silu(x) · up, up starting at the given element (a
    /// multiple of 4) of its buffer, which holds 8 × `GpuMatrix::slices()` f32 from there.
    pub silu_up: Option<(&'a wgpu::Buffer, usize)>,
    /// The rows are (gate, up) pairs, [gate_0, up_0, gate_1, ...] (a stacked gate|up matrix
    /// with its rows interleaved, stack.rs): y[pair] = silu(gate) · up, so y's field is half
    /// as wide as the matrix has rows. No bias or accumulate with it.
    pub swiglu: bool,
    /// Plus bias[row].
    pub bias: Option<&'a wgpu::Buffer>,
    /// y += (a residual add), after the bias.
    pub accumulate: bool,
}

/// What the prefill matmul fuses into its output (`Kernels::matmul_with`).
#[derive(Copy, Clone, Default)]
pub struct MatmulExtras<'a> {
    /// Plus bias[column] (bias spans the field's columns, from its offset).
    pub bias: Option<&'a wgpu::Buffer>,
    /// The rows are (gate, up) pairs, [gate_0, up_0, gate_1, ...] (a stacked gate|up matrix
    /// with its rows interleaved, stack.rs): y[t][pair] = silu(gate) · up, so y's field is half
    /// as wide as the matrix has rows. No bias or accumulate with it.
    pub swiglu: bool,
    /// y += (a residual add), after the bias.
    pub accumulate: bool,
}

/// Shape of one causal attention of `n_tokens` new tokens (their positions start at the step
/// buffer's pos0): the cache holds `capacity` positions per kv head; this layer's keys/values
/// start at element `cache_offset`.
#[derive(Copy, Clone, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_tokens: usize,
    pub capacity: usize,
    pub cache_offset: usize,
}

/// Where a field lies in an activation buffer of a row per token: rows of `width` f32, the
/// field's elements from `offset`. The layer's projections write one buffer of [token][q | k |
/// v] (and [token][gate | up]) so that a stacked matrix fills it in one dispatch; the kernels
/// that read such fields take their place this way.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RowField {
    pub width: usize,
    pub offset: usize,
}

impl RowField {
    /// Rows that are all field: `width` elements from offset 0.
    pub fn whole(width: usize) -> Self {
        RowField { width, offset: 0 }
    }

    /// The f32 a buffer needs for `n_rows` rows holding this field of `len` elements; an error
    /// naming `what` when the field does not fit in a row.
    fn end(&self, what: &str, n_rows: usize, len: usize) -> Result<usize> {
        if self
            .offset
            .checked_add(len)
            .is_none_or(|end| end > self.width)
            || n_rows == 0
        {
            return Err(GpuError::Shape(format!(
                "{what}: {n_rows} rows of a field of {len} at {} in rows of {}",
                self.offset, self.width
            )));
        }
        Ok((n_rows - 1) * self.width + self.offset + len)
    }

    /// (width, offset) as shader parameters.
    fn params(&self) -> Result<[u32; 2]> {
        Ok([
            u32_arg("row width", self.width)?,
            u32_arg("field offset", self.offset)?,
        ])
    }
}

/// Largest head_dim of the attention kernel (attention.wgsl: MAX_HEAD_DIM).
pub const MAX_HEAD_DIM: usize = 256;
/// Positions an attention workgroup scores at once (attention.wgsl: CHUNK).
const ATTENTION_CHUNK: usize = 64;
/// Workgroups per head the splits of a step's tokens may use together: a decoded token spreads
/// over up to this many splits, a prefill chunk (already many workgroups) over fewer. Bounds
/// the partials buffer for long contexts; at most attention_combine.wgsl's MAX_SPLITS (64).
const ATTENTION_SPLITS_PER_HEAD: usize = 64;

impl AttentionShape {
    /// Splits (workgroups per token and head) of the split-K attention: as many as the cache
    /// has chunks, at most ATTENTION_SPLITS_PER_HEAD / n_tokens. The shaders size the splits
    /// from each token's length (whole chunks, as few per split as these splits allow).
    fn splits(&self) -> usize {
        let most = (ATTENTION_SPLITS_PER_HEAD / self.n_tokens.max(1)).max(1);
        self.capacity.div_ceil(ATTENTION_CHUNK).clamp(1, most)
    }

    /// f32 elements of the partials scratch buffer `attention` needs: per (token, head,
    /// split) head_dim outputs, then per (token, head, split) a vec4 (max, sum, 0, 0).
    pub fn partials_len(&self) -> usize {
        self.n_tokens * self.n_heads * self.splits() * (self.head_dim + 4)
    }

    /// Where the splits' (max, sum) start in the partials, in vec4s.
    fn stats_offset(&self) -> usize {
        self.n_tokens * self.n_heads * self.splits() * self.head_dim / 4
    }
}

/// The per-step values of a replayed plan: the position of the first token of the step.
#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct StepValues {
    pos0: u32,
    pad: [u32; 3],
}

/// A uniform buffer with the step values (position of the step's first token), read by
/// rope_kv_store and attention; rewritten with `set` before each submit of a plan.
pub struct StepBuffer {
    buffer: wgpu::Buffer,
}

impl StepBuffer {
    pub fn new(ctx: &GpuContext) -> Self {
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step"),
            size: std::mem::size_of::<StepValues>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        StepBuffer { buffer }
    }

    /// Queues the write; it lands before any later submit.
    pub fn set(&self, ctx: &GpuContext, pos0: usize) -> Result<()> {
        let values = StepValues {
            pos0: u32_arg("position", pos0)?,
            pad: [0; 3],
        };
        ctx.queue
            .write_buffer(&self.buffer, 0, bytemuck::bytes_of(&values));
        Ok(())
    }

    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

/// cos/sin for positions 0..positions and frequencies 0..rope_dim/2, as (cos, sin) pairs,
/// computed exactly as lean's CPU `RopeTable` (HF's float32 inv_freq and angles).
pub fn rope_cos_sin(
    rope_dim: usize,
    base: f32,
    linear_factor: f32,
    positions: usize,
) -> Vec<[f32; 2]> {
    let half = rope_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / rope_dim as f32) / linear_factor)
        .collect();
    let mut table = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in &inv_freq {
            let angle = p as f32 * f;
            table.push([angle.cos(), angle.sin()]);
        }
    }
    table
}

/// A shader module per tensor type and its pipelines per `K` (a choice of override constants),
/// each made on first use: a model uses a few of them.
struct TypedShaders<K> {
    label: &'static str,
    modules: Vec<(TensorType, wgpu::ShaderModule)>,
    pipelines: std::sync::Mutex<std::collections::HashMap<(TensorType, K), wgpu::ComputePipeline>>,
}

impl<K: Copy + Eq + std::hash::Hash> TypedShaders<K> {
    fn new(label: &'static str, modules: Vec<(TensorType, wgpu::ShaderModule)>) -> Self {
        TypedShaders {
            label,
            modules,
            pipelines: Default::default(),
        }
    }

    /// The pipeline of `ty` for `key`, built with `constants` the first time.
    fn pipeline(
        &self,
        ctx: &GpuContext,
        ty: TensorType,
        key: K,
        constants: &[(&str, f64)],
    ) -> Result<wgpu::ComputePipeline> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&(ty, key)) {
            return Ok(p.clone());
        }
        let (_, module) = self
            .modules
            .iter()
            .find(|(t, _)| *t == ty)
            .ok_or(GpuError::UnsupportedType(ty))?;
        let label = format!("{}_{ty}", self.label);
        let pipeline = pipeline_of(ctx, &label, module, "main", constants);
        pipelines.insert((ty, key), pipeline.clone());
        Ok(pipeline)
    }
}

/// The matvec shader of each type; its pipelines, one per workgroup size and fusion (override
/// constants), are created on first use: of the 12 per type a model uses a few.
struct MatvecShaders {
    /// Keyed by (index in MATVEC_WORKGROUP_SIZES, fusions: matvec.wgsl's NORM, SILU and SWIGLU
    /// as bits 0, 1, 2).
    shaders: TypedShaders<(usize, u8)>,
    /// How many of MATVEC_WORKGROUP_SIZES the pipelines may use.
    sizes: usize,
}

impl MatvecShaders {
    /// The shaders of every type, with workgroups of at most `largest` threads (and at most
    /// what the device allows).
    fn new(ctx: &GpuContext, name: &str, largest: usize, source: impl Fn(&str) -> String) -> Self {
        // quad_dot: the row-quad types' snippets define it, the others get it per row.
        let block_of = |ty: TensorType, block: &str| {
            if packs_row_quads(ty) {
                block.to_string()
            } else {
                format!("{block}\n{MATVEC_ROW_BY_ROW}")
            }
        };
        let largest = largest.min(ctx.limits().max_compute_invocations_per_workgroup as usize);
        // WebGPU guarantees 256 invocations, so at least the smallest size fits.
        let sizes = MATVEC_WORKGROUP_SIZES
            .iter()
            .filter(|&&n| n <= largest)
            .count()
            .max(1);
        let modules = MATVEC_TYPES
            .iter()
            .map(|&(ty, block)| {
                let label = format!("{name}_{ty}");
                // SAFETY: every index is in range and every loop ends (see matvec_module).
                (ty, unsafe {
                    matvec_module(ctx, &label, &source(&block_of(ty, block)))
                })
            })
            .collect();
        MatvecShaders {
            shaders: TypedShaders::new("matvec", modules),
            sizes,
        }
    }

    /// The pipeline of `ty` with workgroup size MATVEC_WORKGROUP_SIZES[size] and `fusions`
    /// (bits: NORM 1, SILU 2, SWIGLU 4).
    fn pipeline(
        &self,
        ctx: &GpuContext,
        ty: TensorType,
        size: usize,
        fusions: u8,
    ) -> Result<wgpu::ComputePipeline> {
        let constants = [
            ("WORKGROUP", MATVEC_WORKGROUP_SIZES[size] as f64),
            ("NORM", (fusions & 1) as f64),
            ("SILU", ((fusions >> 1) & 1) as f64),
            ("SWIGLU", ((fusions >> 2) & 1) as f64),
        ];
        self.shaders.pipeline(ctx, ty, (size, fusions), &constants)
    }
}

/// All compiled pipelines.
pub struct Kernels {
    /// Matvecs reducing in workgroup memory, and with subgroupAdd (`with_subgroup_matvec`).
    matvec: MatvecShaders,
    matvec_subgroup: Option<MatvecShaders>,
    matmul: MatmulShaders,
    matmul_reduce: wgpu::ComputePipeline,
    /// The partial sums of a matmul with K split, reused by every such dispatch (grown when
    /// one needs more): wgpu orders the dispatches that write and read it.
    matmul_partials: std::sync::Mutex<Option<wgpu::Buffer>>,
    embed: Vec<(TensorType, wgpu::ComputePipeline)>,
    rms_norm: wgpu::ComputePipeline,
    rope_kv_store: wgpu::ComputePipeline,
    /// Per ATTENTION_HEAD_DIMS: for heads up to that size.
    attention: [wgpu::ComputePipeline; 3],
    attention_combine: [wgpu::ComputePipeline; 3],
    /// attention_prefill.wgsl per (largest head_dim), those whose workgroup memory the device
    /// allows, smallest first.
    attention_prefill: Vec<(usize, wgpu::ComputePipeline)>,
    silu_mul: wgpu::ComputePipeline,
    /// argmax.wgsl's two passes: the first maximum per span, then of the spans.
    argmax_spans: wgpu::ComputePipeline,
    argmax: wgpu::ComputePipeline,
}

/// Values per workgroup of argmax's first pass (argmax.wgsl: SPAN).
const ARGMAX_SPAN: usize = 1024;

/// u32 of the buffer `Kernels::argmax` writes for n values: the index, then a (value, index)
/// pair per span of ARGMAX_SPAN values.
pub fn argmax_len(n: usize) -> usize {
    1 + 2 * n.div_ceil(ARGMAX_SPAN)
}

fn pipeline(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ComputePipeline {
    pipeline_at(ctx, label, source, "main")
}

/// The pipeline of entry point `entry` of the WGSL `source`.
fn pipeline_at(ctx: &GpuContext, label: &str, source: &str, entry: &str) -> wgpu::ComputePipeline {
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
    pipeline_of(ctx, label, &module, entry, &[])
}

/// A shader module compiled without wgpu's runtime bounds checks (browsers keep theirs).
///
/// # Safety
/// Every index of `source` must be in range and every loop must end, for every dispatch the
/// caller records (the callers document why).
unsafe fn trusted_module(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ShaderModule {
    let descriptor = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    // SAFETY: the caller's contract.
    unsafe {
        ctx.device
            .create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
    }
}

/// A matvec shader, compiled without wgpu's runtime checks (clamped indices, loop counters,
/// guarded divisions): decode reads every weight through it, and the checks cost it 5-15% on
/// an H200. In the browser the checks stay (create_shader_module_trusted is the plain one).
///
/// Every access of matvec.wgsl, its reductions and the block snippets' slice_x/slice_dot is in
/// range, from what `Kernels::matvec_into` checks and `GpuMatrix` builds:
/// - weights: slices run below `row_slices()`; rows are clamped to `rows - 1`
///   (matvec_row_by_row.wgsl) or, for the row-quad types, read by quads below
///   ceil(rows / 4), which weights.rs pads the part to (a workgroup's first row is a
///   multiple of ROWS_PER_THREAD, itself of ROW_QUAD = 4); so a slice's index is below the part's slices,
///   and weights.rs sizes each plane of a repacked part for all of them (its tests check the
///   sizes and where each element lands), and GGUF-layout parts hold whole rows of whole
///   blocks, padded to 16 bytes, which covers load_u32's second word at a block's end;
/// - x: slices cover `cols` elements (block types: whole units, read as vec4 below cols / 4;
///   F32 reads clamp to cols - 1), and `x` holds at least `cols` f32 (checked);
/// - y: stores go to `first_row + r` for part rows r (first_row: the field's offset plus the
///   part's first row), below the field's offset + `rows()`, which `y` holds (checked), and a
///   bias is read at the same index only when bound (checked to hold as many; x stands in
///   otherwise and is never read as one);
/// - a norm's weights are read as vec4 2s and 2s + 1 for slices s below `row_slices()`, so
///   below 8 × slices f32, which the bound buffer holds (checked; the weight part stands in
///   when there is no norm, and is never read as one); up likewise from up_offset (checked);
/// - the tree reduction's arrays (TREE_SLOTS = MATVEC_TREE_MAX_WORKGROUP entries) are indexed
///   below WORKGROUP, at most that for this reduction; the subgroup reduction's
///   (SUBGROUP_SLOTS = MATVEC_SUBGROUP_SLOTS) by subgroup, below num_subgroups: a subgroup has
///   at least wgpu's MINIMUM_SUBGROUP_MIN_SIZE invocations, and the const assert above makes
///   the slots enough for the largest WORKGROUP;
/// - a Partial's quads are indexed below QUADS = ROWS_PER_THREAD / 4 (loops over k < QUADS,
///   rows i < ROWS_PER_THREAD at i / 4, pairs k < ROWS_PER_THREAD / 2 at k / 2);
/// - every loop steps by at least 1 toward a fixed bound, and the only divisions are by
///   constants.
///
/// `tests/kernels.rs` runs its pipelines on awkward sizes (one-block rows, rows not a
/// multiple of the workgroup's, split parts, F32 rows ending inside a slice).
///
/// # Safety
/// `source` is matvec.wgsl with one of its reductions and a block snippet of MATVEC_TYPES.
unsafe fn matvec_module(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ShaderModule {
    // SAFETY: every index is in range and every loop ends (see above).
    unsafe { trusted_module(ctx, label, source) }
}

/// The largest head of each attention pipeline (attention.wgsl's MAX_HEAD_DIM): the shaders
/// keep a chunk's keys and values in register arrays sized for it, and a head smaller than its
/// pipeline's leaves fewer workgroups room on an SM (on an H200 a head_dim-64 model's
/// attention took ~25% longer in the 128 pipeline).
const ATTENTION_HEAD_DIMS: [usize; 3] = [64, 128, MAX_HEAD_DIM];

/// Index into ATTENTION_HEAD_DIMS of the smallest pipeline that holds `head_dim` (at most
/// MAX_HEAD_DIM, checked by the caller).
fn attention_variant(head_dim: usize) -> usize {
    ATTENTION_HEAD_DIMS
        .iter()
        .position(|&most| head_dim <= most)
        .unwrap_or(ATTENTION_HEAD_DIMS.len() - 1)
}

/// Tokens per workgroup and positions per step of attention_prefill.wgsl (BQ, BK).
const PREFILL_ATTENTION_TOKENS: usize = 32;
const PREFILL_ATTENTION_STEP: usize = 16;
/// The largest head of each attention_prefill pipeline: its workgroup memory holds the block's
/// queries and a step's keys (or values) for heads of that size.
const PREFILL_ATTENTION_HEAD_DIMS: [usize; 2] = [64, 128];

/// Bytes of workgroup memory of attention_prefill.wgsl for heads up to `max_head_dim`:
/// queries, a step's rows, scores and probabilities (64: 16 KiB, WebGPU's default limit).
const fn prefill_attention_storage(max_head_dim: usize) -> usize {
    4 * (PREFILL_ATTENTION_TOKENS + PREFILL_ATTENTION_STEP) * max_head_dim
        + 2 * 4 * PREFILL_ATTENTION_TOKENS * PREFILL_ATTENTION_STEP
}
const _: () = assert!(prefill_attention_storage(PREFILL_ATTENTION_HEAD_DIMS[0]) <= 16384);

/// An attention pipeline (attention.wgsl, attention_combine.wgsl or attention_prefill.wgsl) for heads up to
/// `max_head_dim`, compiled without wgpu's runtime checks: its loops forced bounded and its
/// register arrays' indices clamped, the NVIDIA compiler keeps the arrays out of registers
/// (measured on an H200: a decode step's attention 25.6 -> 15.3 µs). In the browser the checks
/// stay.
///
/// Every access is in range, from what `Kernels::attention` checks, for a head_dim of at most
/// `max_head_dim` (attention_variant picks so):
/// - a token's length is clamped to the capacity, so cache positions are below it, and the
///   cache holds cache_offset + n_kv_heads × capacity × head_dim f32 (checked); quads run below
///   head_dim / 4;
/// - queries and (fresh) k and v are read at token t < n_tokens in the checked fields; a
///   rotation's other quad lies in the same head (NeoX: half / 4 quads away within rope_dim),
///   and the table is read at position × rope_dim / 2 + i for i below rope_dim / 2, positions
///   below the capacity, which the table covers (checked);
/// - partials and stats at (token × n_heads + head) × n_splits + split (+ stats_offset), below
///   `partials_len` (checked); the splits a token uses are at most n_splits (split_length makes
///   the splits long enough), and n_splits at most MAX_SPLITS (64);
/// - workgroup arrays: q_head below head_dim / 4; lanes and scores below CHUNK (value
///   positions are guarded by j < CHUNK); outs and sums below WORKGROUP (value groups ×
///   head_dim / 4); stats below MAX_SPLITS; register arrays by loops of their fixed length;
/// - loops run to fixed bounds or to the split's end by CHUNK, and the divisions are by
///   n_splits, n_heads and the GQA group, all at least 1 (checked), or by constants.
///
/// attention_prefill.wgsl: token blocks of BQ, the last clamped to n_tokens - 1 for its
/// lengths and stored only below n_tokens; cache positions below `end` ≤ the capacity (clamped)
/// and quads below head_dim / 4 ≤ QUADS (the pipeline holds the head); `queries` at
/// token × QUADS + d < BQ × QUADS, `rows` at j × QUADS + (d ^ (j % 8)) with j < BK and QUADS a
/// power of two ≥ 8, so the swizzled quad stays below QUADS; `scores` and `probs` at
/// token × BK + j, j < BK (threads per token ≤ BK); out at (t × n_heads + h) × head_dim / 4 + d
/// below n_tokens × n_heads × head_dim / 4 (checked); output quads by a loop of OUT_QUADS.
///
/// `tests/kernels.rs` runs them on head_dims 32 to 256 (80: value groups that do not divide
/// the workgroup), GQA groups, prefill chunks (both attention kernels), multi-chunk splits and
/// fresh tokens.
fn attention_pipeline(
    ctx: &GpuContext,
    name: &str,
    source: &str,
    max_head_dim: usize,
) -> wgpu::ComputePipeline {
    const DECLARED: &str = "const MAX_HEAD_DIM: u32 = ";
    let declared = source
        .lines()
        .find(|line| line.starts_with(DECLARED))
        .unwrap_or_else(|| panic!("{name} declares no MAX_HEAD_DIM"));
    let source = source.replace(declared, &format!("{DECLARED}{max_head_dim}u;"));
    let label = format!("{name}_{max_head_dim}");
    // SAFETY: every index is in range and every loop ends (see above).
    let module = unsafe { trusted_module(ctx, &label, &source) };
    pipeline_of(ctx, &label, &module, "main", &[])
}

/// The matmul shaders, compiled without wgpu's runtime checks (clamped indices): prefill spends
/// most of its time in it, and its inner loop is workgroup-memory loads and FMAs, which the
/// clamps would nearly double. In the browser the checks stay.
///
/// Every access of matmul.wgsl and the block snippets' slice_weights is in range, from what
/// `Kernels::matmul_with` checks and `GpuMatrix` builds, for any MatmulTile as documented:
/// - weights: rows are clamped to `rows - 1`; a step's slices start at k0 / 8 with k0 < cols,
///   k0 a multiple of K_STEP (a divisor of 32) and cols at most 32 × units, so they stay below
///   `row_slices()`: the slices the matvec reads (see `matvec_pipelines`); the step loaded
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
/// Its pipelines are keyed by the fusions: matmul.wgsl's BIAS and SWIGLU as bits 0 and 1.
struct MatmulShaders(TypedShaders<u8>);

impl MatmulShaders {
    fn new(ctx: &GpuContext, source: impl Fn(&str) -> String) -> Self {
        let modules = MATVEC_TYPES
            .iter()
            .map(|&(ty, block)| {
                let label = format!("matmul_{ty}");
                // SAFETY: every index is in range and every loop ends (see above).
                (ty, unsafe { trusted_module(ctx, &label, &source(block)) })
            })
            .collect();
        MatmulShaders(TypedShaders::new("matmul", modules))
    }

    /// The pipeline of `ty` with `bias` and/or `swiglu` fused in.
    fn pipeline(
        &self,
        ctx: &GpuContext,
        ty: TensorType,
        bias: bool,
        swiglu: bool,
    ) -> Result<wgpu::ComputePipeline> {
        let fusions = bias as u8 | (swiglu as u8) << 1;
        let constants = [("BIAS", bias as u8 as f64), ("SWIGLU", swiglu as u8 as f64)];
        self.0.pipeline(ctx, ty, fusions, &constants)
    }
}

/// The compute pipeline of `module`'s `entry` point, with override `constants`.
fn pipeline_of(
    ctx: &GpuContext,
    label: &str,
    module: &wgpu::ShaderModule,
    entry: &str,
    constants: &[(&str, f64)],
) -> wgpu::ComputePipeline {
    ctx.device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants,
                ..Default::default()
            },
            cache: None,
        })
}

fn for_type(
    pipelines: &[(TensorType, wgpu::ComputePipeline)],
    ty: TensorType,
) -> Result<&wgpu::ComputePipeline> {
    pipelines
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, p)| p)
        .ok_or(GpuError::UnsupportedType(ty))
}

fn u32_arg(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::TooLarge(format!("{what} = {v} exceeds u32")))
}

/// Checks that `buffer` holds at least `len` f32.
fn check_len(what: &str, buffer: &wgpu::Buffer, len: usize) -> Result<()> {
    if (buffer.size() / 4) < len as u64 {
        return Err(GpuError::Shape(format!(
            "{what} holds {} f32, needs {len}",
            buffer.size() / 4
        )));
    }
    Ok(())
}

impl Kernels {
    /// Compiles every kernel, in core WGSL (what every adapter and browser runs). A shader the
    /// device rejects is reported as `GpuError::Shader` (a bug of this crate or of the driver),
    /// not a panic.
    pub async fn new(ctx: &GpuContext) -> Result<Self> {
        Self::build(ctx, false).await
    }

    /// As `new`, with matvecs that sum their threads' partial dots with subgroupAdd instead of
    /// a tree in workgroup memory; `GpuError::MissingFeatures` unless the device has
    /// wgpu::Features::SUBGROUP. lean-cli uses it natively where the adapter has subgroups (on
    /// an H200, decode 1-3% faster in whole models); the browser build keeps `new` until this
    /// path is tested on browsers' WebGPU.
    pub async fn with_subgroup_matvec(ctx: &GpuContext) -> Result<Self> {
        if !ctx.features().contains(wgpu::Features::SUBGROUP) {
            return Err(GpuError::MissingFeatures("SUBGROUP".into()));
        }
        Self::build(ctx, true).await
    }

    /// Whether matvecs reduce with subgroup operations.
    pub fn uses_subgroups(&self) -> bool {
        self.matvec_subgroup.is_some()
    }

    async fn build(ctx: &GpuContext, subgroups: bool) -> Result<Self> {
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let source = |header: &str, block: &str, skeleton: &str| {
            format!("{header}{BYTES}\n{UNITS}\n{block}\n{skeleton}")
        };
        let per_type = |name: &str, skeleton: &str| {
            MATVEC_TYPES
                .iter()
                .map(|&(ty, block)| {
                    let label = format!("{name}_{ty}");
                    (ty, pipeline(ctx, &label, &source("", block, skeleton)))
                })
                .collect::<Vec<_>>()
        };
        let matvec_per_type = |name: &str, header: &str, reduction: &str, largest: usize| {
            let skeleton = format!("{}{MATVEC}\n{reduction}", matvec_constants());
            MatvecShaders::new(ctx, name, largest, |block| source(header, block, &skeleton))
        };
        let matvec = matvec_per_type("matvec", "", MATVEC_WORKGROUP, MATVEC_TREE_MAX_WORKGROUP);
        let matvec_subgroup = subgroups.then(|| {
            matvec_per_type(
                "matvec_subgroup",
                SUBGROUPS_DIRECTIVE,
                MATVEC_SUBGROUP,
                usize::MAX,
            )
        });
        let kernels = Kernels {
            matvec,
            matvec_subgroup,
            matmul: MatmulShaders::new(ctx, |block| {
                let skeleton = format!("{}{MATMUL}", MATMUL_TILE.wgsl_constants());
                source("", block, &skeleton)
            }),
            matmul_reduce: pipeline(ctx, "matmul_reduce", MATMUL_REDUCE),
            matmul_partials: std::sync::Mutex::new(None),
            embed: per_type("embed", EMBED),
            rms_norm: pipeline(ctx, "rms_norm", include_str!("shaders/rms_norm.wgsl")),
            rope_kv_store: pipeline(
                ctx,
                "rope_kv_store",
                include_str!("shaders/rope_kv_store.wgsl"),
            ),
            attention: ATTENTION_HEAD_DIMS
                .map(|head_dim| attention_pipeline(ctx, "attention", ATTENTION, head_dim)),
            attention_combine: ATTENTION_HEAD_DIMS.map(|head_dim| {
                attention_pipeline(ctx, "attention_combine", ATTENTION_COMBINE, head_dim)
            }),
            attention_prefill: PREFILL_ATTENTION_HEAD_DIMS
                .into_iter()
                .filter(|&head_dim| {
                    prefill_attention_storage(head_dim)
                        <= ctx.limits().max_compute_workgroup_storage_size as usize
                })
                .map(|head_dim| {
                    let pipeline =
                        attention_pipeline(ctx, "attention_prefill", ATTENTION_PREFILL, head_dim);
                    (head_dim, pipeline)
                })
                .collect(),
            silu_mul: pipeline(ctx, "silu_mul", include_str!("shaders/silu_mul.wgsl")),
            argmax_spans: pipeline_at(ctx, "argmax_spans", ARGMAX, "spans"),
            argmax: pipeline(ctx, "argmax", ARGMAX),
        };
        match scope.pop().await {
            Some(e) => Err(GpuError::Shader(e.to_string())),
            None => Ok(kernels),
        }
    }

    /// Records one dispatch of `groups` workgroups, spread over two dimensions when it exceeds
    /// the per-dimension limit; binding i of group 0 is `buffers[i]`, binding 0 the params.
    fn dispatch<P: bytemuck::Pod>(
        ctx: &GpuContext,
        plan: &mut Plan,
        name: String,
        pipeline: &wgpu::ComputePipeline,
        params: &P,
        buffers: &[&wgpu::Buffer],
        groups: u32,
    ) -> Result<()> {
        let max_dim = ctx.limits().max_compute_workgroups_per_dimension.max(1);
        // Rows (y) of equal length, as few as fit: only groups past `groups` in the last row
        // are extra, and the kernels return from those at once.
        let y = groups.div_ceil(max_dim);
        let x = groups.div_ceil(y.max(1));
        if y > max_dim {
            return Err(GpuError::TooLarge(format!(
                "{groups} workgroups exceed the dispatch limit"
            )));
        }
        let uniform = ctx.uniform("params", params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        entries.extend(
            buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32 + 1,
                    resource: b.as_entire_binding(),
                }),
        );
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        plan.push_dispatch(name, pipeline, bind_group, uniform, (x, y));
        Ok(())
    }

    /// y = W·x for a weight matrix on the device (`x`: cols f32, `y`: rows f32); one dispatch
    /// per part of a split matrix.
    pub fn matvec(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let whole = RowField::whole(m.rows());
        self.matvec_with(ctx, plan, m, x, (y, whole), MatvecExtras::default())
    }

    /// y[at.offset + r] = (W·x)[r] (+ bias[at.offset + r]): a matvec writing its rows as a field
    /// of a wider row (`bias` as wide as that row), with a bias add fused in (the same f32
    /// rounding as a separate add). Stacked matrices and matrices writing side by side at their
    /// offsets compute the same values.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_at(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        at: RowField,
        bias: Option<&wgpu::Buffer>,
    ) -> Result<()> {
        let extras = MatvecExtras {
            bias,
            ..Default::default()
        };
        self.matvec_with(ctx, plan, m, x, (y, at), extras)
    }

    /// y += W·x: matvec with the residual add fused in (the same f32 rounding as a separate add).
    pub fn matvec_add(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let extras = MatvecExtras {
            accumulate: true,
            ..Default::default()
        };
        let whole = RowField::whole(m.rows());
        self.matvec_with(ctx, plan, m, x, (y, whole), extras)
    }

    /// y = W·x with what `extras` fuses in (an RMS norm of x, silu · up, a bias, a residual
    /// add), written as the field `at` of y's row (`RowField::whole(m.rows())`: all of y).
    pub fn matvec_with(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        (y, at): (&wgpu::Buffer, RowField),
        extras: MatvecExtras,
    ) -> Result<()> {
        check_len("matvec x", x, m.cols())?;
        if extras.swiglu {
            let odd = m.rows() % 2 == 1 || m.parts().iter().any(|p| p.first_row % 2 == 1);
            if odd || extras.bias.is_some() || extras.accumulate || extras.silu_up.is_some() {
                return Err(GpuError::Shape(format!(
                    "matvec: SwiGLU needs whole (gate, up) row pairs in every part and no bias, accumulate or silu · up ({} rows)",
                    m.rows()
                )));
            }
        }
        let y_rows = if extras.swiglu {
            m.rows() / 2
        } else {
            m.rows()
        };
        let y_end = at.end("matvec y", 1, y_rows)?;
        check_len("matvec y", y, y_end)?;
        if let Some(b) = extras.bias {
            check_len("matvec bias", b, y_end)?;
        }
        if let Some((weight, _)) = extras.norm {
            // read a slice (8 elements) at a time
            check_len("matvec norm weight", weight, m.slices() * 8)?;
        }
        if let Some((up, offset)) = extras.silu_up {
            if !offset.is_multiple_of(4) {
                return Err(GpuError::Shape(format!(
                    "matvec: up starts at element {offset}, not a multiple of 4"
                )));
            }
            check_len("matvec up", up, offset + m.slices() * 8)?;
        }
        // Workgroups of the first part, the largest: parts are dispatched one after another.
        let workgroups = m.parts()[0].rows.div_ceil(MATVEC_ROWS_PER_THREAD);
        let shaders = self.matvec_subgroup.as_ref().unwrap_or(&self.matvec);
        let size = matvec_size_index(m.slices(), workgroups, shaders.sizes);
        let fusions = extras.norm.is_some() as u8
            | (extras.silu_up.is_some() as u8) << 1
            | (extras.swiglu as u8) << 2;
        let pipeline = &shaders.pipeline(ctx, m.ty(), size, fusions)?;
        for part in m.parts() {
            let params = MatvecParams {
                layout: m.layout(part),
                rows: u32_arg("rows", part.rows)?,
                cols: u32_arg("cols", m.cols())?,
                first_row: u32_arg("first row", at.offset + part.first_row)?,
                accumulate: extras.accumulate as u32,
                bias: extras.bias.is_some() as u32,
                eps: extras.norm.map_or(0.0, |(_, eps)| eps),
                up_offset: u32_arg("up offset", extras.silu_up.map_or(0, |(_, o)| o / 4))?,
                pad: [0; 5],
            };
            let groups = u32_arg(
                "matvec workgroups",
                part.rows.div_ceil(MATVEC_ROWS_PER_THREAD),
            )?;
            let name = format!(
                "matvec{}{} {} {}x{}",
                if extras.norm.is_some() { "+norm" } else { "" },
                if extras.silu_up.is_some() {
                    "+silu"
                } else if extras.swiglu {
                    "+swiglu"
                } else {
                    ""
                },
                m.ty(),
                part.rows,
                m.cols()
            );
            // Without a bias, x is bound in its place, and without a norm the weights (at
            // least a vec4): read-only, never read as them.
            let bias = extras.bias.unwrap_or(x);
            let norm = extras.norm.map_or(&part.buffer, |(weight, _)| weight);
            let up = extras.silu_up.map_or(&part.buffer, |(up, _)| up);
            let buffers = [&part.buffer, x, y, bias, norm, up];
            Self::dispatch(ctx, plan, name, pipeline, &params, &buffers, groups)?;
        }
        Ok(())
    }

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
            let pipeline = self.matmul.pipeline(ctx, m.ty(), fuse_bias, fuse_swiglu)?;
            let name = format!(
                "matmul{}{} {} {}x{}",
                if fuse_bias { "+bias" } else { "" },
                if fuse_swiglu { "+swiglu" } else { "" },
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
                    swiglu: swiglu as u32,
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
                    &self.matmul_reduce,
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
            .matmul_partials
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

    /// out = rms_norm(x) · weight for `n_rows` rows of `weight.len()` (= n) elements.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
        eps: f32,
    ) -> Result<()> {
        check_len("rms_norm x", x, n * n_rows)?;
        check_len("rms_norm weight", weight, n)?;
        check_len("rms_norm out", out, n * n_rows)?;
        let params = RmsNormParams {
            n: u32_arg("n", n)?,
            n_rows: u32_arg("rows", n_rows)?,
            eps,
            pad: 0,
        };
        Self::dispatch(
            ctx,
            plan,
            "rms_norm".into(),
            &self.rms_norm,
            &params,
            &[x, weight, out],
            params.n_rows,
        )
    }

    /// The step's tokens enter attention: rotates the queries in place (per token n_heads ×
    /// head_dim at field `q` of `qkv`, the first token at the step's position) and writes the
    /// keys (rotated) and values (n_kv_heads × head_dim at fields `k`, `v`) into the cache
    /// buffers at the step's position; the layer starts at `s.cache_offset`. `cos_sin` is the
    /// table of `rope`. The caller keeps the positions within both the table and the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_store(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        step: &StepBuffer,
        qkv: &wgpu::Buffer,
        [q, k, v]: [RowField; 3],
        (keys, values): (&wgpu::Buffer, &wgpu::Buffer),
        (cos_sin, rope): (&wgpu::Buffer, Rope),
        s: AttentionShape,
    ) -> Result<()> {
        if !rope.rope_dim.is_multiple_of(2) || rope.rope_dim > s.head_dim {
            return Err(GpuError::Shape(format!(
                "rope_dim {} must be even and at most head_dim {}",
                rope.rope_dim, s.head_dim
            )));
        }
        let kv_dim = s.n_kv_heads * s.head_dim;
        let cache_end = s.cache_offset + kv_dim * s.capacity;
        let q_dim = s.n_heads * s.head_dim;
        check_len("rope q", qkv, q.end("rope q", s.n_tokens, q_dim)?)?;
        check_len("kv_store k", qkv, k.end("kv_store k", s.n_tokens, kv_dim)?)?;
        check_len("kv_store v", qkv, v.end("kv_store v", s.n_tokens, kv_dim)?)?;
        check_len("kv_store keys", keys, cache_end)?;
        check_len("kv_store values", values, cache_end)?;
        check_len("rope table", cos_sin, rope.positions * rope.rope_dim)?;
        let params = RopeKvStoreParams {
            n_tokens: u32_arg("tokens", s.n_tokens)?,
            n_heads: u32_arg("heads", s.n_heads)?,
            n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
            head_dim: u32_arg("head_dim", s.head_dim)?,
            rope_dim: u32_arg("rope_dim", rope.rope_dim)?,
            neox: (rope.pairing == RopePairing::Neox) as u32,
            capacity: u32_arg("capacity", s.capacity)?,
            cache_offset: u32_arg("cache offset", s.cache_offset)?,
            q: q.params()?,
            k: k.params()?,
            v: v.params()?,
            pad: [0; 2],
        };
        let per_token = s.n_heads * rope.rope_dim / 2 + 2 * kv_dim;
        let groups = u32_arg(
            "rope_kv_store workgroups",
            (s.n_tokens * per_token).div_ceil(ELEMENTWISE_GROUP as usize),
        )?;
        Self::dispatch(
            ctx,
            plan,
            "rope_kv_store".into(),
            &self.rope_kv_store,
            &params,
            &[step.buffer(), qkv, keys, values, cos_sin],
            groups,
        )
    }

    /// Causal attention of `n_tokens` tokens (queries: n_heads × head_dim per token at field
    /// `q_at` of `q`, positions from the step's pos0) over the cached keys and values;
    /// `out` gets n_tokens × n_heads × head_dim; `partials` is scratch of `s.partials_len()`
    /// f32. Two dispatches (split-K, then the combine); one for a prefill chunk without `fresh`
    /// (attention_prefill.wgsl, tiled over blocks of tokens) where a pipeline holds the head. The caller keeps pos0 + n_tokens within
    /// capacity. Without `fresh` the queries are rotated and the cache holds the step's keys
    /// and values (rope_kv_store ran); with it they are the projection's fields of the rows of
    /// `q`, unrotated, and this rotates them and stores the keys and values in the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        step: &StepBuffer,
        (q, q_at): (&wgpu::Buffer, RowField),
        keys: &wgpu::Buffer,
        values: &wgpu::Buffer,
        partials: &wgpu::Buffer,
        out: &wgpu::Buffer,
        s: AttentionShape,
        fresh: Option<FreshTokens>,
    ) -> Result<()> {
        if s.n_kv_heads == 0
            || s.n_heads == 0
            || !s.n_heads.is_multiple_of(s.n_kv_heads)
            || s.n_tokens == 0
            || s.n_tokens > s.capacity
        {
            return Err(GpuError::Shape(format!(
                "attention of {} tokens, {} heads over {} kv heads, capacity {}",
                s.n_tokens, s.n_heads, s.n_kv_heads, s.capacity
            )));
        }
        // vec4 loads: heads, q's rows and the layer's cache start at multiples of 4 elements
        if s.head_dim == 0
            || s.head_dim > MAX_HEAD_DIM
            || !s.head_dim.is_multiple_of(4)
            || !s.cache_offset.is_multiple_of(4)
            || !q_at.width.is_multiple_of(4)
            || !q_at.offset.is_multiple_of(4)
        {
            return Err(GpuError::Shape(format!(
                "attention needs head_dim in 4..={MAX_HEAD_DIM}, a multiple of 4 (got {}), and \
                 a cache offset and q's row width and offset that are multiples of 4 (got {}, \
                 {}, {})",
                s.head_dim, s.cache_offset, q_at.width, q_at.offset
            )));
        }
        let cache_end = s.cache_offset + s.n_kv_heads * s.capacity * s.head_dim;
        let q_dim = s.n_heads * s.head_dim;
        check_len(
            "attention q",
            q,
            q_at.end("attention q", s.n_tokens, q_dim)?,
        )?;
        check_len("attention keys", keys, cache_end)?;
        check_len("attention values", values, cache_end)?;
        check_len("attention out", out, s.n_tokens * s.n_heads * s.head_dim)?;
        check_len("attention partials", partials, s.partials_len())?;
        let kv_dim = s.n_kv_heads * s.head_dim;
        if let Some(f) = &fresh {
            if !fresh_rope_supported(&f.rope, s.head_dim)
                || f.k.width != q_at.width
                || f.v.width != q_at.width
                || !f.k.offset.is_multiple_of(4)
                || !f.v.offset.is_multiple_of(4)
            {
                return Err(GpuError::Shape(format!(
                    "attention of fresh tokens: rope_dim {} ({:?}) for head_dim {}, k and v \
                     at {} and {} in rows of {} (q's: {})",
                    f.rope.rope_dim,
                    f.rope.pairing,
                    s.head_dim,
                    f.k.offset,
                    f.v.offset,
                    f.k.width,
                    q_at.width
                )));
            }
            check_len(
                "attention k",
                q,
                f.k.end("attention k", s.n_tokens, kv_dim)?,
            )?;
            check_len(
                "attention v",
                q,
                f.v.end("attention v", s.n_tokens, kv_dim)?,
            )?;
            check_len("rope table", f.cos_sin, s.capacity * f.rope.rope_dim)?;
        }
        // A prefill chunk (queries rotated, keys cached): the tiled kernel, where it holds the head.
        let prefill = self
            .attention_prefill
            .iter()
            .find(|(most, _)| s.head_dim <= *most);
        if let (None, true, Some((_, pipeline))) = (&fresh, s.n_tokens > 1, prefill) {
            let query_blocks = s.n_tokens.div_ceil(PREFILL_ATTENTION_TOKENS);
            let params = PrefillAttentionParams {
                n_heads: u32_arg("heads", s.n_heads)?,
                n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
                head_dim: u32_arg("head_dim", s.head_dim)?,
                n_tokens: u32_arg("tokens", s.n_tokens)?,
                capacity: u32_arg("capacity", s.capacity)?,
                cache_offset: u32_arg("cache offset", s.cache_offset)?,
                scale: 1.0 / (s.head_dim as f32).sqrt(),
                query_blocks: u32_arg("query blocks", query_blocks)?,
                q: q_at.params()?,
                pad: [0; 2],
            };
            let groups = u32_arg("attention workgroups", query_blocks * s.n_heads)?;
            return Self::dispatch(
                ctx,
                plan,
                "attention_prefill".into(),
                pipeline,
                &params,
                &[step.buffer(), q, keys, values, out],
                groups,
            );
        }
        let n_splits = s.splits();
        let params = AttentionParams {
            n_heads: u32_arg("heads", s.n_heads)?,
            n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
            head_dim: u32_arg("head_dim", s.head_dim)?,
            n_tokens: u32_arg("tokens", s.n_tokens)?,
            capacity: u32_arg("capacity", s.capacity)?,
            cache_offset: u32_arg("cache offset", s.cache_offset)?,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            n_splits: u32_arg("splits", n_splits)?,
            stats_offset: u32_arg("stats offset", s.stats_offset())?,
            q: q_at.params()?,
            fresh: fresh.is_some() as u32,
            rope_dim: u32_arg("rope_dim", fresh.map_or(0, |f| f.rope.rope_dim))?,
            neox: fresh.is_some_and(|f| f.rope.pairing == RopePairing::Neox) as u32,
            k_offset: u32_arg("k offset", fresh.map_or(0, |f| f.k.offset))?,
            v_offset: u32_arg("v offset", fresh.map_or(0, |f| f.v.offset))?,
            pad: [0; 4],
        };
        // Without fresh tokens the table is never read: q stands in.
        let cos_sin = fresh.map_or(q, |f| f.cos_sin);
        let groups = u32_arg("attention workgroups", s.n_tokens * s.n_heads * n_splits)?;
        Self::dispatch(
            ctx,
            plan,
            "attention".into(),
            &self.attention[attention_variant(s.head_dim)],
            &params,
            &[step.buffer(), q, keys, values, partials, cos_sin],
            groups,
        )?;
        let combine = CombineParams {
            n_heads: params.n_heads,
            head_dim: params.head_dim,
            n_tokens: params.n_tokens,
            n_splits: params.n_splits,
            stats_offset: params.stats_offset,
            capacity: params.capacity,
            pad: [0; 2],
        };
        let groups = u32_arg("attention workgroups", s.n_tokens * s.n_heads)?;
        Self::dispatch(
            ctx,
            plan,
            "attention_combine".into(),
            &self.attention_combine[attention_variant(s.head_dim)],
            &combine,
            &[step.buffer(), partials, out],
            groups,
        )
    }

    /// out = rows `ids[t]` of the embedding matrix `m`, dequantized (`ids`: n_tokens u32 on the
    /// device; `out`: n_tokens × cols). Ids must be below m.rows() (the caller checks them).
    pub fn embed(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: usize,
    ) -> Result<()> {
        let pipeline = for_type(&self.embed, m.ty())?;
        if (ids.size() / 4) < n_tokens as u64 {
            return Err(GpuError::Shape(format!(
                "embed ids hold {} ids, needs {n_tokens}",
                ids.size() / 4
            )));
        }
        check_len("embed out", out, n_tokens * m.cols())?;
        for part in m.parts() {
            let params = EmbedParams {
                layout: m.layout(part),
                n_tokens: u32_arg("tokens", n_tokens)?,
                cols: u32_arg("cols", m.cols())?,
                first_row: u32_arg("first row", part.first_row)?,
                rows: u32_arg("rows", part.rows)?,
            };
            let groups = u32_arg(
                "embed workgroups",
                (n_tokens * m.cols()).div_ceil(ELEMENTWISE_GROUP as usize),
            )?;
            Self::dispatch(
                ctx,
                plan,
                format!("embed {}", m.ty()),
                pipeline,
                &params,
                &[&part.buffer, ids, out],
                groups,
            )?;
        }
        Ok(())
    }

    /// out = silu(gate) · up element-wise, for `n_rows` rows of `n` elements: gate and up are
    /// fields of the rows of `gate_up`, out is n_rows × n.
    #[allow(clippy::too_many_arguments)]
    pub fn silu_mul(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        (gate, up): (RowField, RowField),
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<()> {
        check_len(
            "silu_mul gate",
            gate_up,
            gate.end("silu_mul gate", n_rows, n)?,
        )?;
        check_len("silu_mul up", gate_up, up.end("silu_mul up", n_rows, n)?)?;
        self.silu_mul_pitched(ctx, plan, gate_up, (gate, up, 1), out, n, n_rows)
    }

    /// out = silu(gate) · up element-wise, for `n_rows` rows of `gate_up` of `2 n` elements
    /// [gate_0, up_0, gate_1, up_1, ...] (a matmul of a stacked gate|up matrix whose rows are
    /// interleaved, stack.rs); out is n_rows × n.
    pub fn silu_mul_pairs(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<()> {
        let rows = RowField::whole(2 * n);
        check_len(
            "silu_mul gate|up",
            gate_up,
            rows.end("silu_mul", n_rows, 2 * n)?,
        )?;
        let up = RowField {
            width: 2 * n,
            offset: 1,
        };
        self.silu_mul_pitched(ctx, plan, gate_up, (rows, up, 2), out, n, n_rows)
    }

    /// silu_mul.wgsl with fields whose elements are `pitch` apart (the caller checked them).
    #[allow(clippy::too_many_arguments)]
    fn silu_mul_pitched(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        (gate, up, pitch): (RowField, RowField, u32),
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<()> {
        check_len("silu_mul out", out, n * n_rows)?;
        let params = SiluMulParams {
            n: u32_arg("n", n)?,
            n_rows: u32_arg("rows", n_rows)?,
            gate: gate.params()?,
            up: up.params()?,
            pitch,
            pad: 0,
        };
        let groups = u32_arg("silu_mul elements", n * n_rows)?.div_ceil(ELEMENTWISE_GROUP);
        Self::dispatch(
            ctx,
            plan,
            "silu_mul".into(),
            &self.silu_mul,
            &params,
            &[gate_up, out],
            groups,
        )
    }

    /// result[0] = index of the largest of the first n values (the first on ties); `result`
    /// holds `argmax_len(n)` u32 (the rest is the first pass's scratch).
    pub fn argmax(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        values: &wgpu::Buffer,
        result: &wgpu::Buffer,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Err(GpuError::Shape("argmax of no values".into()));
        }
        check_len("argmax values", values, n)?;
        check_len("argmax result", result, argmax_len(n))?;
        let spans = n.div_ceil(ARGMAX_SPAN);
        let params = CountParams {
            n: u32_arg("n", n)?,
            extra: u32_arg("spans", spans)?,
            pad: [0; 2],
        };
        let name = "argmax spans".into();
        let groups = u32_arg("argmax spans", spans)?;
        Self::dispatch(
            ctx,
            plan,
            name,
            &self.argmax_spans,
            &params,
            &[values, result],
            groups,
        )?;
        Self::dispatch(
            ctx,
            plan,
            "argmax".into(),
            &self.argmax,
            &params,
            &[result],
            1,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_workgroups_grow_with_rows_and_stop_at_the_allowed_size() {
        let size = |slices, rows: usize, sizes| {
            let i = matvec_size_index(slices, rows.div_ceil(MATVEC_ROWS_PER_THREAD), sizes);
            MATVEC_WORKGROUP_SIZES[i]
        };
        // 2048 columns (256 slices), 11008 rows: many workgroups, 4 slices a thread
        assert_eq!(size(256, 11008, 4), 64);
        // the down projection, 2048 rows of 11008 columns: few workgroups, long rows
        assert_eq!(size(1376, 2048, 4), 512);
        assert_eq!(size(1376, 2048, 3), 256);
        // never more threads than slices (a 32-column matrix has 4)
        assert_eq!(size(4, 1, 4), 64);
    }
}
