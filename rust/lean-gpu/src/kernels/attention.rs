//! Causal grouped-query attention over the KV cache: split-K for decode (attention.wgsl, then
//! attention_combine.wgsl merging the splits), tiled over blocks of tokens for prefill chunks
//! (attention_prefill.wgsl); a score scale and a sliding window per layer.
use super::rope_kv_store::{Rope, RopePairing};
use super::wgsl::{self, Consts};
use super::{check_len, pipeline_of, trusted_module, u32_arg, Kernels, RowField, StepBuffer};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;

const ATTENTION: &str = include_str!("../shaders/attention.wgsl");
const ATTENTION_COMBINE: &str = include_str!("../shaders/attention_combine.wgsl");
const ATTENTION_PREFILL: &str = include_str!("../shaders/attention_prefill.wgsl");

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
    window: u32,
    pad: [u32; 3],
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
    window: u32,
    pad: u32,
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
    window: u32,
    pad: u32,
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
    /// The scores are q·k times this (`AttentionShape::default_scale`: 1 / sqrt(head_dim);
    /// Gemma 3: query_pre_attn_scalar^-0.5).
    pub scale: f32,
    /// A sliding window: a query at position p sees only keys j with p - j < window, i.e.
    /// positions max(0, p + 1 - window) ..= p (HF's sliding_window; at least 1). None: all of
    /// 0 ..= p. Only the window is read (a decode costs the window, not the context).
    pub window: Option<usize>,
}

/// Largest head_dim of the attention kernel (the largest pipeline's MAX_HEAD_DIM).
pub const MAX_HEAD_DIM: usize = 256;
/// Positions an attention workgroup scores at once (attention.wgsl and
/// attention_combine.wgsl: CHUNK).
const ATTENTION_CHUNK: usize = 64;
/// Workgroups per head the splits of a step's tokens may use together: a decoded token spreads
/// over up to this many splits, a prefill chunk (already many workgroups) over fewer. Bounds
/// the partials buffer for long contexts (attention_combine.wgsl: MAX_SPLITS, its stats array
/// and a thread per split).
const ATTENTION_SPLITS_PER_HEAD: usize = 64;

impl AttentionShape {
    /// The scale of llama-style attention: 1 / sqrt(head_dim), in f32.
    pub fn default_scale(head_dim: usize) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }

    /// Positions a token sees at most: the window, within the capacity.
    fn visible(&self) -> usize {
        self.window.map_or(self.capacity, |w| w.min(self.capacity))
    }

    /// The window as the shaders take it (u32::MAX: none).
    fn window_param(&self) -> u32 {
        self.window
            .map_or(u32::MAX, |w| u32::try_from(w).unwrap_or(u32::MAX))
    }

    /// Splits (workgroups per token and head) of the split-K attention: as many as the
    /// positions a token sees (`visible`) have chunks, at most ATTENTION_SPLITS_PER_HEAD /
    /// n_tokens. The shaders size the splits from the positions each token sees (whole chunks,
    /// as few per split as these splits allow). A window never needs more splits than the
    /// same shape without one, so partials sized without it serve both.
    fn splits(&self) -> usize {
        let most = (ATTENTION_SPLITS_PER_HEAD / self.n_tokens.max(1)).max(1);
        self.visible().div_ceil(ATTENTION_CHUNK).clamp(1, most)
    }

    /// Splits per token of an untiled `attention_of`: a decoded token's (so each token's sums are
    /// its decode step's).
    fn splits_per_token(&self) -> usize {
        AttentionShape {
            n_tokens: 1,
            ..*self
        }
        .splits()
    }

    /// f32 elements of the partials scratch buffer `attention` needs: per (token, head,
    /// split) head_dim outputs, then per (token, head, split) a vec4 (max, sum, 0, 0).
    pub fn partials_len(&self) -> usize {
        self.partials_len_with(self.splits())
    }

    /// f32 elements of the partials scratch buffer an untiled `attention_of` needs.
    pub fn partials_len_per_token(&self) -> usize {
        self.partials_len_with(self.splits_per_token())
    }

    fn partials_len_with(&self, splits: usize) -> usize {
        self.n_tokens * self.n_heads * splits * (self.head_dim + 4)
    }

    /// Where the splits' (max, sum) start in the partials, in vec4s, for `splits` a token.
    fn stats_offset(&self, splits: usize) -> usize {
        self.n_tokens * self.n_heads * splits * self.head_dim / 4
    }
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

/// The attention pipelines.
pub(super) struct AttentionPipelines {
    /// Per ATTENTION_HEAD_DIMS: for heads up to that size.
    split: [wgpu::ComputePipeline; 3],
    combine: [wgpu::ComputePipeline; 3],
    /// attention_prefill.wgsl per (largest head_dim), those whose workgroup memory the device
    /// allows, smallest first.
    prefill: Vec<(usize, wgpu::ComputePipeline)>,
}

impl AttentionPipelines {
    pub(super) fn new(ctx: &GpuContext) -> Self {
        AttentionPipelines {
            split: ATTENTION_HEAD_DIMS.map(|d| attention_pipeline(ctx, Kind::Split, d)),
            combine: ATTENTION_HEAD_DIMS.map(|d| attention_pipeline(ctx, Kind::Combine, d)),
            prefill: PREFILL_ATTENTION_HEAD_DIMS
                .into_iter()
                .filter(|&head_dim| {
                    prefill_attention_storage(head_dim)
                        <= ctx.limits().max_compute_workgroup_storage_size as usize
                })
                .map(|d| (d, attention_pipeline(ctx, Kind::Prefill, d)))
                .collect(),
        }
    }
}

/// The three attention shaders.
#[derive(Copy, Clone, Debug)]
enum Kind {
    Split,
    Combine,
    Prefill,
}

/// The label and source of the attention shader `kind` for heads up to `max_head_dim`.
fn source(kind: Kind, max_head_dim: usize) -> (String, String) {
    let (name, consts, shader) = match kind {
        Kind::Split => (
            "attention",
            Consts::new().u32("CHUNK", ATTENTION_CHUNK),
            ATTENTION,
        ),
        Kind::Combine => (
            "attention_combine",
            Consts::new()
                .u32("CHUNK", ATTENTION_CHUNK)
                .u32("MAX_SPLITS", ATTENTION_SPLITS_PER_HEAD),
            ATTENTION_COMBINE,
        ),
        Kind::Prefill => (
            "attention_prefill",
            Consts::new()
                .u32("BQ", PREFILL_ATTENTION_TOKENS)
                .u32("BK", PREFILL_ATTENTION_STEP),
            ATTENTION_PREFILL,
        ),
    };
    let consts = consts.u32("MAX_HEAD_DIM", max_head_dim);
    let source = wgsl::assemble("", &consts, &[shader]);
    (format!("{name}_{max_head_dim}"), source)
}

/// An attention pipeline (attention.wgsl, attention_combine.wgsl or attention_prefill.wgsl)
/// for heads up to `max_head_dim` (its header's MAX_HEAD_DIM), compiled without wgpu's runtime
/// checks: its loops forced bounded and its register arrays' indices clamped, the NVIDIA
/// compiler keeps the arrays out of registers (measured on an H200: a decode step's attention
/// 25.6 -> 15.3 µs). In the browser the checks stay.
///
/// Every access is in range, from what `Kernels::attention` checks, for a head_dim of at most
/// `max_head_dim` (attention_variant picks so):
/// - a token's length is clamped to the capacity, so cache positions are below it (and at
///   least its window's start, len - min(len, window): no wrap), and the cache holds cache_offset + n_kv_heads × capacity × head_dim f32 (checked); quads run below
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
fn attention_pipeline(ctx: &GpuContext, kind: Kind, max_head_dim: usize) -> wgpu::ComputePipeline {
    let (label, source) = source(kind, max_head_dim);
    // SAFETY: every index is in range and every loop ends (see above).
    let module = unsafe { trusted_module(ctx, &label, &source) };
    pipeline_of(ctx, &label, &module, "main", &[])
}

impl Kernels {
    /// Causal attention of `n_tokens` tokens (queries: n_heads × head_dim per token at field
    /// `q_at` of `q`, positions from the step's pos0) over the cached keys and values;
    /// `out` gets n_tokens × n_heads × head_dim; `partials` is scratch of `s.partials_len()`
    /// f32. Scores are scaled by `s.scale`; with `s.window` a token sees only its window (see
    /// `AttentionShape`), and only the window is read. Two dispatches (split-K, then the
    /// combine); one for a prefill chunk without `fresh` (attention_prefill.wgsl, tiled over
    /// blocks of tokens) where a pipeline holds the head. The caller keeps pos0 + n_tokens
    /// within capacity. Without `fresh` the queries are rotated and the cache holds the step's keys
    /// and values (rope_kv_store ran); with it they are the projection's fields of the rows of
    /// `q`, unrotated, and this rotates them and stores the keys and values in the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        step: &StepBuffer,
        q: (&wgpu::Buffer, RowField),
        keys: &wgpu::Buffer,
        values: &wgpu::Buffer,
        partials: &wgpu::Buffer,
        out: &wgpu::Buffer,
        s: AttentionShape,
        fresh: Option<FreshTokens>,
    ) -> Result<()> {
        let buffers = (keys, values, partials, out);
        self.attention_of(ctx, plan, step, q, buffers, s, fresh, true)
    }

    /// As `attention`, with `tiled` false every token through decode's split-K kernels
    /// (never the tiled prefill one) split as a decoded token is: a few tokens of a
    /// verification pass, each attending as its decode step would, bit for bit (with `fresh`
    /// as a decode step: the queries and keys rotated by this kernel's own function);
    /// `partials` then holds `s.partials_len_per_token()` f32.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_of(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        step: &StepBuffer,
        (q, q_at): (&wgpu::Buffer, RowField),
        (keys, values, partials, out): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        s: AttentionShape,
        fresh: Option<FreshTokens>,
        tiled: bool,
    ) -> Result<()> {
        if s.n_kv_heads == 0
            || s.n_heads == 0
            || !s.n_heads.is_multiple_of(s.n_kv_heads)
            || s.n_tokens == 0
            || s.n_tokens > s.capacity
            || s.window == Some(0)
            || !s.scale.is_finite()
        {
            return Err(GpuError::Shape(format!(
                "attention of {} tokens, {} heads over {} kv heads, capacity {}, window {:?}, \
                 scale {}",
                s.n_tokens, s.n_heads, s.n_kv_heads, s.capacity, s.window, s.scale
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
        // A decoded token's splits for each token of a pass per token.
        let n_splits = match tiled {
            true => s.splits(),
            false => s.splits_per_token(),
        };
        check_len(
            "attention partials",
            partials,
            s.partials_len_with(n_splits),
        )?;
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
            .attention
            .prefill
            .iter()
            .find(|(most, _)| s.head_dim <= *most);
        if let (None, true, true, Some((_, pipeline))) = (&fresh, tiled, s.n_tokens > 1, prefill) {
            let query_blocks = s.n_tokens.div_ceil(PREFILL_ATTENTION_TOKENS);
            let params = PrefillAttentionParams {
                n_heads: u32_arg("heads", s.n_heads)?,
                n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
                head_dim: u32_arg("head_dim", s.head_dim)?,
                n_tokens: u32_arg("tokens", s.n_tokens)?,
                capacity: u32_arg("capacity", s.capacity)?,
                cache_offset: u32_arg("cache offset", s.cache_offset)?,
                scale: s.scale,
                query_blocks: u32_arg("query blocks", query_blocks)?,
                q: q_at.params()?,
                window: s.window_param(),
                pad: 0,
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
        let params = AttentionParams {
            n_heads: u32_arg("heads", s.n_heads)?,
            n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
            head_dim: u32_arg("head_dim", s.head_dim)?,
            n_tokens: u32_arg("tokens", s.n_tokens)?,
            capacity: u32_arg("capacity", s.capacity)?,
            cache_offset: u32_arg("cache offset", s.cache_offset)?,
            scale: s.scale,
            n_splits: u32_arg("splits", n_splits)?,
            stats_offset: u32_arg("stats offset", s.stats_offset(n_splits))?,
            q: q_at.params()?,
            fresh: fresh.is_some() as u32,
            rope_dim: u32_arg("rope_dim", fresh.map_or(0, |f| f.rope.rope_dim))?,
            neox: fresh.is_some_and(|f| f.rope.pairing == RopePairing::Neox) as u32,
            k_offset: u32_arg("k offset", fresh.map_or(0, |f| f.k.offset))?,
            v_offset: u32_arg("v offset", fresh.map_or(0, |f| f.v.offset))?,
            window: s.window_param(),
            pad: [0; 3],
        };
        // Without fresh tokens the table is never read: q stands in.
        let cos_sin = fresh.map_or(q, |f| f.cos_sin);
        let groups = u32_arg("attention workgroups", s.n_tokens * s.n_heads * n_splits)?;
        Self::dispatch(
            ctx,
            plan,
            "attention".into(),
            &self.attention.split[attention_variant(s.head_dim)],
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
            window: params.window,
            pad: 0,
        };
        let groups = u32_arg("attention workgroups", s.n_tokens * s.n_heads)?;
        Self::dispatch(
            ctx,
            plan,
            "attention_combine".into(),
            &self.attention.combine[attention_variant(s.head_dim)],
            &combine,
            &[step.buffer(), partials, out],
            groups,
        )
    }
}

/// Every attention shader (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    let split = ATTENTION_HEAD_DIMS.map(|d| (Kind::Split, d));
    let combine = ATTENTION_HEAD_DIMS.map(|d| (Kind::Combine, d));
    let prefill = PREFILL_ATTENTION_HEAD_DIMS.map(|d| (Kind::Prefill, d));
    let params = |kind| match kind {
        Kind::Split => std::mem::size_of::<AttentionParams>(),
        Kind::Combine => std::mem::size_of::<CombineParams>(),
        Kind::Prefill => std::mem::size_of::<PrefillAttentionParams>(),
    };
    split
        .into_iter()
        .chain(combine)
        .chain(prefill)
        .map(|(kind, d)| {
            let (label, source) = source(kind, d);
            let mut v = wgsl::Variant::main::<()>(label, source).with_step(1);
            v.uniforms[0].1 = params(kind);
            v
        })
        .collect()
}
