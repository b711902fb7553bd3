//! The GPU backend's session: the model's weights on the device (packed as in the GGUF), a KV
//! cache, activations, and recorded plans of the forward pass.
//!
//! A step (a prefill chunk or one decoded token) is one command buffer and one submit: the
//! token ids and the position are written into small buffers, the recorded plan replays, and
//! only what the caller needs comes back: the argmax id (4 bytes) for greedy decoding, else the
//! logits. The decode plan (one token) is recorded once; prefill plans per chunk size.
//!
//! A layer's dispatches when decoding one token: one matvec of the stacked q|k|v matrix with
//! the attention RMS norm and the bias fused in, writing the row [q | k | v]; attention (which
//! rotates q and k and stores k and v in the cache itself; rope_kv_store first for prefill and
//! where the rotation's pairs do not fall in whole quads) and its combine; the output projection with the residual add fused in; one matvec
//! of the stacked gate|up matrix (rows interleaved, stack.rs) with the FFN norm fused in,
//! writing silu(gate) · up; the down projection adding the residual — 6. Prefill runs the
//! norms as their own dispatches before the matmuls, which fuse the same bias, SwiGLU and
//! residual adds. Where the members of a stack differ in type (Q4_K_M files mix them), each
//! writes its rows at its offset in the same activation row ([gate | up], then silu_mul): only
//! the number of dispatches differs (stack.rs).
//!
//! The plan records the model's description (`lean::config`), never an architecture's name:
//! per-head q/k norms run in place on the q|k|v row after the projection, each layer reads
//! its rotary table and sliding window, post-norms send an output through `act.h` and
//! `rms_norm_add` instead of fusing the residual add, and the gate's activation (SiLU or
//! GELU-tanh) is a parameter of the fused kernels.
use crate::context::{GpuContext, MapRequest};
use crate::error::{GpuError, Result};
use crate::kernels::{
    fresh_rope_supported, Activation, AttentionShape, FreshTokens, Kernels, MatmulExtras,
    MatvecExtras, Rope, RopePairing, RowField, StepBuffer,
};
use crate::plan::Plan;
use crate::profile::Profiler;
use crate::stack;
use crate::weights::GpuMatrix;
use lean::config::{ModelConfig, RopeStyle};
use lean::model::Matrix;
use lean::session::LocalFuture;
use lean::{LeanError, Logits, Model, Session};
use std::collections::VecDeque;
use std::sync::Arc;

/// Tokens per prefill submit (at most the context): bounds the activations. Long chunks keep a
/// large GPU's matmul tiles busy (on an H200, 512 prefilled 1.3-1.8x faster than 128).
pub const PREFILL_CHUNK: usize = 512;
/// Tokens per submit when every token's logits come back (`Logits::All`): bounds that buffer
/// (128 × a 152k vocabulary = 78 MB, inside a browser's 128 MiB binding).
pub const LOGITS_CHUNK: usize = 128;

/// Matrices that read the same input and write one activation row per token, `width` wide:
/// one stacked matrix, or (their types or row lengths differ) each at its offset in the row.
struct Stack {
    /// (offset in the row, matrix).
    matrices: Vec<(usize, GpuMatrix)>,
    width: usize,
    /// A bias for the whole row.
    bias: Option<wgpu::Buffer>,
    /// gate|up as one matrix of interleaved rows (stack.rs: interleaves): a decode matvec
    /// writes silu(gate) · up, a prefill matmul [gate_0, up_0, gate_1, ...] rows.
    pairs: bool,
}

struct LayerBuffers {
    attn_norm: wgpu::Buffer,
    /// Rows [q | k | v].
    qkv: Stack,
    /// Per-head RMS norms of q and k (head_dim each), after the projection's bias.
    qk_norms: Option<(wgpu::Buffer, wgpu::Buffer)>,
    wo: GpuMatrix,
    /// RMS norms of the attention's and the FFN's outputs before their residual adds.
    post_attn_norm: Option<wgpu::Buffer>,
    ffn_norm: wgpu::Buffer,
    post_ffn_norm: Option<wgpu::Buffer>,
    /// Rows [gate | up].
    gate_up: Stack,
    w_down: GpuMatrix,
    /// This layer's cache: [kv_head][capacity][head_dim] each (one buffer per layer keeps every
    /// binding small).
    keys: wgpu::Buffer,
    values: wgpu::Buffer,
}

/// A model's weights on the device; `output` is `None` when the head is tied to the embedding.
pub struct GpuModel {
    config: ModelConfig,
    token_embd: GpuMatrix,
    output_norm: wgpu::Buffer,
    output: Option<GpuMatrix>,
}

impl GpuModel {
    fn output(&self) -> &GpuMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

/// Activations of up to `GpuSession::chunk` tokens (the decode plan uses their first rows).
struct Activations {
    ids: wgpu::Buffer,
    x: wgpu::Buffer,
    h: wgpu::Buffer,
    /// [token][q | k | v].
    qkv: wgpu::Buffer,
    attn: wgpu::Buffer,
    /// Split-K attention's partial results.
    partials: wgpu::Buffer,
    /// [token][gate | up].
    gate_up: wgpu::Buffer,
    act: wgpu::Buffer,
    /// Logits of the last token, or of every token of a chunk (`Logits::All`, made on demand).
    logits: wgpu::Buffer,
    logits_all: Option<wgpu::Buffer>,
    argmax: wgpu::Buffer,
}

/// Which logits a recorded step produces.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Output {
    /// None (a prefill chunk before the last).
    Nothing,
    /// The last token's logits and their argmax.
    Last,
    /// Every token's logits.
    All,
}

pub struct GpuSession {
    ctx: Arc<GpuContext>,
    kernels: Arc<Kernels>,
    model: GpuModel,
    layers: Vec<LayerBuffers>,
    /// cos/sin of each of the description's rotary tables (`ModelConfig::ropes`).
    rope_tables: Vec<wgpu::Buffer>,
    step: StepBuffer,
    act: Activations,
    capacity: usize,
    /// Tokens per prefill submit: PREFILL_CHUNK, or the whole context when it is shorter.
    chunk: usize,
    /// Positions written to the KV cache, the queued pass of `ahead` included.
    pos: usize,
    decode_plan: Option<Plan>,
    decoded: DecodedIds,
    /// Set while a decode pass queued ahead (`decode_argmax` with `queue_next`) runs this id,
    /// read back by the previous call: its result is the last entry of `decoded.pending`.
    ahead: Option<u32>,
    /// LEAN_GPU_PROFILE: GPU time per dispatch, printed when the session ends.
    profiler: Option<Profiler>,
}

impl Drop for GpuSession {
    fn drop(&mut self) {
        if let Some(p) = &self.profiler {
            eprint!("{}", p.report());
        }
    }
}

/// The ids that greedy decode passes produce, on their way back: each pass copies its argmax
/// into one of two staging buffers in its own command buffer and asks for the map right after
/// its submit, so an id costs no extra submit and a next pass can be queued before it is read.
struct DecodedIds {
    staging: [wgpu::Buffer; 2],
    /// Passes whose id is still to be read, oldest first.
    pending: VecDeque<PendingId>,
}

struct PendingId {
    slot: usize,
    submission: wgpu::SubmissionIndex,
    map: MapRequest,
}

impl DecodedIds {
    fn new(ctx: &GpuContext) -> Self {
        let staging = || {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("decoded id"),
                size: 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        DecodedIds {
            staging: [staging(), staging()],
            pending: VecDeque::new(),
        }
    }
}

/// LEAN_GPU_TRACE=1 prints the time of each decode step's phases to stderr (natively: a
/// browser has neither the variable nor std's clock).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| {
        !cfg!(target_arch = "wasm32") && std::env::var_os("LEAN_GPU_TRACE").is_some()
    })
}

/// An RMS norm's weights, zero-padded to whole units (32 elements): a matvec that fuses the norm
/// in reads them a slice at a time.
fn upload_norm(ctx: &GpuContext, label: &str, weight: &[f32]) -> wgpu::Buffer {
    let mut padded = weight.to_vec();
    padded.resize(weight.len().next_multiple_of(32), 0.0);
    ctx.upload_f32(label, &padded)
}

fn to_lean(e: GpuError) -> LeanError {
    LeanError::Backend(format!("GPU: {e}"))
}

impl GpuSession {
    /// Uploads the model's weights and allocates a KV cache of `context_length` positions,
    /// blocking until the device has them (natively; a browser uses `load`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(
        ctx: Arc<GpuContext>,
        kernels: Arc<Kernels>,
        model: &Model,
        context_length: usize,
    ) -> Result<Self> {
        Self::with_binding_limit(ctx, kernels, model, context_length, None)
    }

    /// As `new`, splitting every weight matrix into parts of at most `max_part_bytes` (tests
    /// force a small limit so that the split path runs on small models).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_binding_limit(
        ctx: Arc<GpuContext>,
        kernels: Arc<Kernels>,
        model: &Model,
        context_length: usize,
        max_part_bytes: Option<u64>,
    ) -> Result<Self> {
        pollster::block_on(Self::load(
            ctx,
            kernels,
            model,
            context_length,
            max_part_bytes,
        ))
    }

    /// Uploads the model's weights (matrices split into parts of at most `max_part_bytes`, by
    /// default the device's binding limit) and allocates a KV cache of `context_length`
    /// positions. Fails with a clear error when a tensor type has no GPU kernel, a head is too
    /// large, or the device runs out of memory.
    pub async fn load(
        ctx: Arc<GpuContext>,
        kernels: Arc<Kernels>,
        model: &Model,
        context_length: usize,
        max_part_bytes: Option<u64>,
    ) -> Result<Self> {
        let limit = max_part_bytes.unwrap_or_else(|| ctx.max_binding_bytes());
        let device = ctx.clone();
        Self::load_with(
            ctx,
            kernels,
            model,
            context_length,
            |members: &[&Matrix]| {
                let first = members[0];
                let rows = members.iter().map(|m| m.rows).sum();
                let data = match members {
                    [m] => std::borrow::Cow::Borrowed(model.data(m)),
                    _ => {
                        let parts: Vec<&[u8]> = members.iter().map(|m| model.data(m)).collect();
                        let names: Vec<&str> = members.iter().map(|m| &m.name[..]).collect();
                        let interleave =
                            stack::interleaves(&names).then(|| parts[0].len() / first.rows.max(1));
                        std::borrow::Cow::Owned(stack::stacked_bytes(&parts, interleave))
                    }
                };
                GpuMatrix::upload_split(&device, first.ty, rows, first.cols, &data, limit).map_err(
                    |e| match e {
                        GpuError::UnsupportedType(_) | GpuError::TooLarge(_) => {
                            GpuError::Shape(format!("tensor '{}': {e}", first.name))
                        }
                        other => other,
                    },
                )
            },
        )
        .await
    }

    /// As `load`, with each weight matrix from `matrix`, which gets the matrices to stack by
    /// rows into one (stack.rs decides which; mostly one alone) and returns them on the device
    /// (already there when the model streamed into it: `StreamedModel`).
    pub async fn load_with(
        ctx: Arc<GpuContext>,
        kernels: Arc<Kernels>,
        model: &Model,
        context_length: usize,
        mut matrix: impl FnMut(&[&Matrix]) -> Result<GpuMatrix>,
    ) -> Result<Self> {
        let c = model.config.clone();
        if c.head_dim > crate::kernels::MAX_HEAD_DIM || !c.head_dim.is_multiple_of(4) {
            return Err(GpuError::Shape(format!(
                "head_dim {} is not what the attention kernel takes (a multiple of 4, at most {})",
                c.head_dim,
                crate::kernels::MAX_HEAD_DIM
            )));
        }
        if context_length == 0 {
            return Err(GpuError::Shape("a context of no positions".into()));
        }
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let w = &model.weights;
        for m in std::iter::once(&w.token_embd)
            .chain(std::iter::once(&w.output))
            .chain(
                w.layers
                    .iter()
                    .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]),
            )
        {
            if !crate::kernels::matvec_supports(m.ty) {
                return Err(GpuError::UnsupportedType(m.ty));
            }
        }
        let cache_len = c.n_kv_heads * context_length * c.head_dim;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                let qkv_bias = match (&l.bq, &l.bk, &l.bv) {
                    (Some(q), Some(k), Some(v)) => {
                        Some(ctx.upload_f32("qkv bias", &[&q[..], k, v].concat()))
                    }
                    (None, None, None) => None,
                    _ => {
                        return Err(GpuError::Shape(format!(
                            "tensor '{}': biases of only some of q, k, v",
                            l.wq.name
                        )))
                    }
                };
                let qk_norms = match (&l.q_norm, &l.k_norm) {
                    (Some(q), Some(k)) => {
                        Some((ctx.upload_f32("q_norm", q), ctx.upload_f32("k_norm", k)))
                    }
                    (None, None) => None,
                    _ => {
                        return Err(GpuError::Shape(format!(
                            "tensor '{}': a norm of only one of q, k",
                            l.wq.name
                        )))
                    }
                };
                let norm =
                    |label, w: &Option<Vec<f32>>| w.as_ref().map(|w| upload_norm(&ctx, label, w));
                Ok(LayerBuffers {
                    attn_norm: upload_norm(&ctx, "attn_norm", &l.attn_norm),
                    qkv: Self::load_stack(&[&l.wq, &l.wk, &l.wv], qkv_bias, &mut matrix)?,
                    qk_norms,
                    wo: matrix(&[&l.wo])?,
                    post_attn_norm: norm("post_attn_norm", &l.post_attn_norm),
                    ffn_norm: upload_norm(&ctx, "ffn_norm", &l.ffn_norm),
                    post_ffn_norm: norm("post_ffn_norm", &l.post_ffn_norm),
                    gate_up: Self::load_stack(&[&l.w_gate, &l.w_up], None, &mut matrix)?,
                    w_down: matrix(&[&l.w_down])?,
                    keys: ctx.storage_f32("keys", cache_len),
                    values: ctx.storage_f32("values", cache_len),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let gpu_model = GpuModel {
            token_embd: matrix(&[&w.token_embd])?,
            output_norm: upload_norm(&ctx, "output_norm", &w.output_norm),
            output: if w.tied_output {
                None
            } else {
                Some(matrix(&[&w.output])?)
            },
            config: c.clone(),
        };
        let rope_tables = c
            .ropes
            .iter()
            .map(|rope| {
                let table = lean::cpu::ops::RopeTable::new(rope, context_length);
                ctx.upload_f32("rope cos/sin", table.cos_sin_pairs().as_flattened())
            })
            .collect();
        let n = PREFILL_CHUNK.min(context_length);
        // Steps of fewer tokens split each head more: the scratch fits the largest.
        let partials_len = (1..=n)
            .map(|n_tokens| {
                AttentionShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    n_tokens,
                    capacity: context_length,
                    cache_offset: 0,
                    scale: c.block.attention_scale,
                    window: None,
                }
                .partials_len()
            })
            .max()
            .unwrap_or(0);
        let act = Activations {
            ids: ctx.storage_f32("ids", n),
            x: ctx.storage_f32("x", n * c.n_embd),
            h: ctx.storage_f32("h", n * c.n_embd),
            qkv: ctx.storage_f32("qkv", n * (c.q_dim() + 2 * c.kv_dim())),
            attn: ctx.storage_f32("attn", n * c.q_dim()),
            partials: ctx.storage_f32("attention partials", partials_len),
            // Only layers whose gate and up are not one interleaved matrix write [gate | up]
            // (the others fuse silu(gate) · up); a matvec fusing silu · up reads up a slice
            // (8 elements) at a time.
            gate_up: match layers.iter().all(|l| l.gate_up.pairs) {
                true => ctx.storage_f32("gate_up", 8),
                false => ctx.storage_f32("gate_up", n * 2 * c.n_ff + 8),
            },
            act: ctx.storage_f32("act", n * c.n_ff),
            logits: ctx.storage_f32("logits", c.vocab_size),
            logits_all: None,
            argmax: ctx.storage_f32("argmax", crate::kernels::argmax_len(c.vocab_size)),
        };
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Device(format!(
                "out of memory loading the model: {e}"
            )));
        }
        ctx.take_error()?;
        let ctx_for_ids = ctx.clone();
        Ok(GpuSession {
            step: StepBuffer::new(&ctx),
            ctx,
            kernels,
            model: gpu_model,
            layers,
            rope_tables,
            act,
            capacity: context_length,
            chunk: n,
            pos: 0,
            decode_plan: None,
            decoded: DecodedIds::new(&ctx_for_ids),
            ahead: None,
            profiler: Profiler::from_env(&ctx_for_ids),
        })
    }

    /// The matrices `members` (reading the same input) on the device, stacked into as few as
    /// stack.rs allows, each at its offset in the row; `bias` spans all their rows.
    fn load_stack(
        members: &[&Matrix],
        bias: Option<wgpu::Buffer>,
        matrix: &mut impl FnMut(&[&Matrix]) -> Result<GpuMatrix>,
    ) -> Result<Stack> {
        let shapes: Vec<_> = members.iter().map(|m| (m.ty, m.cols)).collect();
        let mut matrices = Vec::new();
        for run in stack::runs(&shapes) {
            let offset = members[..run.start].iter().map(|m| m.rows).sum();
            matrices.push((offset, matrix(&members[run])?));
        }
        let names: Vec<&str> = members.iter().map(|m| &m.name[..]).collect();
        let pairs = matrices.len() == 1
            && stack::interleaves(&names)
            && members.iter().all(|m| m.rows == members[0].rows);
        Ok(Stack {
            matrices,
            width: members.iter().map(|m| m.rows).sum(),
            bias,
            pairs,
        })
    }

    /// Prefills at most `tokens` tokens per submit (at least 1; never more than the session
    /// allocated for): tests make short prompts run in several chunks with it.
    pub fn limit_prefill_chunk(&mut self, tokens: usize) {
        self.chunk = tokens.clamp(1, self.chunk);
    }

    /// y = x · Wᵀ for n rows of x (y += x · Wᵀ with `accumulate`: the residual add fused in):
    /// matvec for one token, the tiled matmul for several.
    fn linear(
        &self,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (ctx, k) = (&*self.ctx, &*self.kernels);
        match (n, accumulate) {
            (1, false) => k.matvec(ctx, plan, m, x, y),
            (1, true) => k.matvec_add(ctx, plan, m, x, y),
            (_, false) => k.matmul(ctx, plan, m, x, y, n),
            (_, true) => k.matmul_add(ctx, plan, m, x, y, n),
        }
    }

    /// The residual stream `act.x` += x · Wᵀ for `n` rows (the add fused into the matvec or
    /// matmul), or += rms_norm(x · Wᵀ) · `post_norm` where the block norms its outputs (the
    /// product goes through `act.h`, free at this point of a layer).
    fn residual(
        &self,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        post_norm: Option<&wgpu::Buffer>,
        n: usize,
    ) -> Result<()> {
        let a = &self.act;
        let Some(weight) = post_norm else {
            return self.linear(plan, m, x, &a.x, n, true);
        };
        self.linear(plan, m, x, &a.h, n, false)?;
        let (e, eps) = (self.model.config.n_embd, self.model.config.rms_eps);
        self.kernels
            .rms_norm_add(&self.ctx, plan, &a.h, weight, &a.x, e, n, eps)
    }

    /// y = x · Wᵀ (+ bias) for each matrix of `s`, into its field of y's rows (`s.width` wide),
    /// the bias fused in: for one token a matvec with the RMS norm by `norm` fused in too (x is
    /// the raw residual stream), for several the matmuls (x already normalized).
    fn project(
        &self,
        plan: &mut Plan,
        s: &Stack,
        x: &wgpu::Buffer,
        norm: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        n: usize,
    ) -> Result<()> {
        let (ctx, k) = (&*self.ctx, &*self.kernels);
        let eps = self.model.config.rms_eps;
        for (offset, m) in &s.matrices {
            let at = RowField {
                width: s.width,
                offset: *offset,
            };
            match n {
                1 => {
                    let extras = MatvecExtras {
                        norm: norm.map(|weight| (weight, eps)),
                        bias: s.bias.as_ref(),
                        ..Default::default()
                    };
                    k.matvec_with(ctx, plan, m, x, (y, at), extras)?
                }
                _ => {
                    let extras = MatmulExtras {
                        bias: s.bias.as_ref(),
                        ..Default::default()
                    };
                    k.matmul_with(ctx, plan, m, x, (y, at), n, extras)?
                }
            }
        }
        Ok(())
    }

    /// Records the forward pass of `n` tokens (ids in `act.ids`, first position in the step
    /// buffer) through every layer, then the output head per `output`.
    fn record(&self, n: usize, output: Output) -> Result<Plan> {
        let (ctx, k, a) = (&*self.ctx, &*self.kernels, &self.act);
        let c = &self.model.config;
        let (e, qd, kvd, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
        let qkv_field = |offset| RowField {
            width: qd + 2 * kvd,
            offset,
        };
        let qkv_fields = [qkv_field(0), qkv_field(qd), qkv_field(qd + kvd)];
        let gate_up_field = |offset| RowField {
            width: 2 * ff,
            offset,
        };
        // Each rotary table as the kernels take it; a layer uses one (`Layer::rope`).
        let ropes: Vec<Rope> = c
            .ropes
            .iter()
            .map(|r| Rope {
                rope_dim: r.dim,
                positions: self.capacity,
                pairing: match r.style {
                    RopeStyle::Interleaved => RopePairing::Interleaved,
                    RopeStyle::Neox => RopePairing::Neox,
                },
            })
            .collect();
        let activation = match c.block.activation {
            lean::config::Activation::Silu => Activation::Silu,
            lean::config::Activation::GeluTanh => Activation::GeluTanh,
        };
        let mut p = Plan::new();
        let embedding_scale = c.block.embedding_scale.unwrap_or(1.0);
        k.embed_scaled(
            ctx,
            &mut p,
            &self.model.token_embd,
            &a.ids,
            &a.x,
            n,
            embedding_scale,
        )?;
        let eps = c.rms_eps;
        for (l, layer) in self.layers.iter().zip(&c.layers) {
            // One token: the norms are fused into the matvecs that read them.
            if n == 1 {
                self.project(&mut p, &l.qkv, &a.x, Some(&l.attn_norm), &a.qkv, 1)?;
            } else {
                k.rms_norm(ctx, &mut p, &a.x, &l.attn_norm, &a.h, e, n, eps)?;
                self.project(&mut p, &l.qkv, &a.h, None, &a.qkv, n)?;
            }
            if let Some((q_norm, k_norm)) = &l.qk_norms {
                let (nh, nkv) = (c.n_heads, c.n_kv_heads);
                k.head_rms_norm(ctx, &mut p, &a.qkv, qkv_fields[0], nh, hd, q_norm, eps, n)?;
                k.head_rms_norm(ctx, &mut p, &a.qkv, qkv_fields[1], nkv, hd, k_norm, eps, n)?;
            }
            let (rope, cos_sin) = (ropes[layer.rope], &self.rope_tables[layer.rope]);
            let attention = AttentionShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                n_tokens: n,
                capacity: self.capacity,
                cache_offset: 0,
                scale: c.block.attention_scale,
                window: layer.window,
            };
            // Decoding, the attention rotates and caches the token's key itself where it can
            // (a prefill chunk's attention would rotate every key of the chunk in each of its
            // workgroups: 5% slower on an H200 than rope_kv_store first).
            let fresh = (n == 1 && fresh_rope_supported(&rope, hd)).then_some(FreshTokens {
                k: qkv_fields[1],
                v: qkv_fields[2],
                cos_sin,
                rope,
            });
            if fresh.is_none() {
                k.rope_kv_store(
                    ctx,
                    &mut p,
                    &self.step,
                    &a.qkv,
                    qkv_fields,
                    (&l.keys, &l.values),
                    (cos_sin, rope),
                    attention,
                )?;
            }
            k.attention(
                ctx,
                &mut p,
                &self.step,
                (&a.qkv, qkv_fields[0]),
                &l.keys,
                &l.values,
                &a.partials,
                &a.attn,
                attention,
                fresh,
            )?;
            self.residual(&mut p, &l.wo, &a.attn, l.post_attn_norm.as_ref(), n)?;
            if l.gate_up.pairs {
                // act(gate) · up straight out of the gate|up matvec or matmul
                let (gate_up, act) = (&l.gate_up.matrices[0].1, (&a.act, RowField::whole(ff)));
                if n == 1 {
                    let extras = MatvecExtras {
                        norm: Some((&l.ffn_norm, eps)),
                        swiglu: true,
                        activation,
                        ..Default::default()
                    };
                    k.matvec_with(ctx, &mut p, gate_up, &a.x, act, extras)?;
                } else {
                    k.rms_norm(ctx, &mut p, &a.x, &l.ffn_norm, &a.h, e, n, eps)?;
                    let extras = MatmulExtras {
                        swiglu: true,
                        activation,
                        ..Default::default()
                    };
                    k.matmul_with(ctx, &mut p, gate_up, &a.h, act, n, extras)?;
                }
                self.residual(&mut p, &l.w_down, &a.act, l.post_ffn_norm.as_ref(), n)?;
                continue;
            }
            if n == 1 {
                self.project(&mut p, &l.gate_up, &a.x, Some(&l.ffn_norm), &a.gate_up, 1)?;
            } else {
                k.rms_norm(ctx, &mut p, &a.x, &l.ffn_norm, &a.h, e, n, eps)?;
                self.project(&mut p, &l.gate_up, &a.h, None, &a.gate_up, n)?;
            }
            if n == 1 && ff.is_multiple_of(4) {
                // act(gate) · up read straight from [gate | up]; the residual added in unless
                // a post-norm comes first
                let post_norm = l.post_ffn_norm.as_ref();
                let extras = MatvecExtras {
                    silu_up: Some((&a.gate_up, ff)),
                    accumulate: post_norm.is_none(),
                    activation,
                    ..Default::default()
                };
                let whole = RowField::whole(e);
                let out = if post_norm.is_some() { &a.h } else { &a.x };
                k.matvec_with(ctx, &mut p, &l.w_down, &a.gate_up, (out, whole), extras)?;
                if let Some(weight) = post_norm {
                    k.rms_norm_add(ctx, &mut p, &a.h, weight, &a.x, e, n, eps)?;
                }
            } else {
                let (gate, up) = (gate_up_field(0), gate_up_field(ff));
                k.gated_mul(
                    ctx,
                    &mut p,
                    &a.gate_up,
                    (gate, up),
                    &a.act,
                    ff,
                    n,
                    activation,
                )?;
                self.residual(&mut p, &l.w_down, &a.act, l.post_ffn_norm.as_ref(), n)?;
            }
        }
        let head = self.model.output();
        match output {
            Output::Nothing => {}
            Output::Last => {
                // Only the last row goes through the final norm (fused into the head's
                // matvec) and the head (a copy when there are several rows: it would split the
                // compute pass for nothing).
                let last_row = if n == 1 {
                    &a.x
                } else {
                    let row = (e * 4) as u64;
                    p.copy(&a.x, (n - 1) as u64 * row, &a.h, 0, row);
                    &a.h
                };
                let extras = MatvecExtras {
                    norm: Some((&self.model.output_norm, eps)),
                    ..Default::default()
                };
                let logits = (&a.logits, RowField::whole(c.vocab_size));
                k.matvec_with(ctx, &mut p, head, last_row, logits, extras)?;
                k.argmax(ctx, &mut p, &a.logits, &a.argmax, c.vocab_size)?;
            }
            Output::All => {
                let logits = a
                    .logits_all
                    .as_ref()
                    .ok_or_else(|| GpuError::Shape("no logits buffer for every token".into()))?;
                k.rms_norm(ctx, &mut p, &a.x, &self.model.output_norm, &a.h, e, n, eps)?;
                self.linear(&mut p, head, &a.h, logits, n, false)?;
            }
        }
        Ok(p)
    }

    /// Runs one chunk (at most `self.chunk` tokens; LOGITS_CHUNK for `Output::All`) at the
    /// current position.
    fn run_chunk(&mut self, tokens: &[u32], output: Output) -> Result<()> {
        let n = tokens.len();
        self.ctx
            .queue
            .write_buffer(&self.act.ids, 0, bytemuck::cast_slice(tokens));
        self.step.set(&self.ctx, self.pos)?;
        if n == 1 && output == Output::Last {
            if self.decode_plan.is_none() {
                self.decode_plan = Some(self.record(1, Output::Last)?);
            }
            let plan = self.decode_plan.as_ref().expect("recorded above");
            if trace() {
                // Where a decode step's time goes: encoding (CPU), submit, GPU + readback.
                let t = std::time::Instant::now();
                let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
                plan.encode(&mut encoder);
                let buffer = encoder.finish();
                let encoded = t.elapsed();
                self.ctx.queue.submit([buffer]);
                let submitted = t.elapsed();
                self.ctx
                    .device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| GpuError::Device(e.to_string()))?;
                eprintln!(
                    "lean-gpu trace: {} dispatches · encode {:?} · submit {:?} · gpu wait {:?}",
                    plan.len(),
                    encoded,
                    submitted - encoded,
                    t.elapsed() - submitted
                );
            } else {
                Self::submit_plan(&self.ctx, &mut self.profiler, plan, "decode");
            }
        } else {
            if output == Output::All && self.act.logits_all.is_none() {
                self.act.logits_all = Some(
                    self.ctx
                        .storage_f32("logits (all)", LOGITS_CHUNK * self.model.config.vocab_size),
                );
            }
            let plan = self.record(n, output)?;
            let phase = format!("prefill chunk of {n}");
            Self::submit_plan(&self.ctx, &mut self.profiler, &plan, &phase);
        }
        self.ctx.take_error()?;
        self.pos += n;
        Ok(())
    }

    /// Submits `plan` in a command buffer of its own (profiled, and then waited for, when the
    /// session profiles).
    fn submit_plan(ctx: &GpuContext, profiler: &mut Option<Profiler>, plan: &Plan, phase: &str) {
        let Some(profiler) = profiler else {
            plan.submit(ctx);
            return;
        };
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let profiled = profiler.encode(plan, &mut encoder);
        ctx.queue.submit([encoder.finish()]);
        if let Some(n) = profiled {
            profiler.collect(ctx, phase, plan, n);
        }
    }

    /// Waits for the submitted work and resolves a readback, blocking this thread (natively).
    #[cfg(not(target_arch = "wasm32"))]
    fn wait<T>(&self, future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let value = pollster::block_on(future)?;
        self.ctx.take_error()?;
        Ok(value)
    }

    /// A browser cannot block: its readbacks complete on the event loop, so the synchronous
    /// entry points refuse and name the asynchronous ones.
    #[cfg(target_arch = "wasm32")]
    fn wait<T>(&self, _future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        Err(GpuError::Readback(
            "WebGPU results arrive asynchronously: use Engine::begin_async / step_async".into(),
        ))
    }

    /// Awaits a readback of the submitted work (never blocks).
    async fn settle<T>(&self, future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let value = future.await?;
        self.ctx.take_error()?;
        Ok(value)
    }

    /// Forgets a pass queued ahead: the next pass overwrites its cache position.
    fn discard_ahead(&mut self) {
        if self.ahead.take().is_some() {
            self.pos -= 1;
        }
    }

    /// Greedy decoding of `token` (see `Session::decode_argmax`): its pass is queued (unless it
    /// already is, ahead), then with `queue_next` the pass of its result, chained on the device
    /// (the previous pass copied its argmax into the ids buffer), and only then is the id read.
    async fn decode(&mut self, token: u32, queue_next: bool) -> Result<u32> {
        let t = trace().then(std::time::Instant::now);
        match self.ahead.take() {
            Some(queued) if queued == token => {}
            other => {
                if other.is_some() {
                    self.pos -= 1;
                }
                self.drain().await?;
                self.submit_decode(Some(token)).await?;
            }
        }
        let queued = queue_next && self.pos < self.capacity;
        if queued {
            self.submit_decode(None).await?;
        }
        let submitted = t.map(|t| t.elapsed());
        let id = self.read_oldest().await?;
        if let (Some(t), Some(submitted)) = (t, submitted) {
            eprintln!(
                "lean-gpu trace: decode · encode + submit {submitted:?} · wait for the id {:?}",
                t.elapsed() - submitted
            );
        }
        if queued {
            self.ahead = Some(id);
        }
        Ok(id)
    }

    /// Queues the decode pass of one token at `self.pos`: `token`, or with `None` the argmax of
    /// the pass before (copied into the ids buffer by that pass).
    async fn submit_decode(&mut self, token: Option<u32>) -> Result<()> {
        // Both staging slots busy: only with passes whose ids nobody wants any more.
        while self.decoded.pending.len() >= 2 {
            self.read_oldest().await?;
        }
        let slot = match self.decoded.pending.front() {
            Some(p) => 1 - p.slot,
            None => 0,
        };
        if let Some(token) = token {
            self.ctx
                .queue
                .write_buffer(&self.act.ids, 0, bytemuck::bytes_of(&token));
        }
        self.step.set(&self.ctx, self.pos)?;
        if self.decode_plan.is_none() {
            self.decode_plan = Some(self.record(1, Output::Last)?);
        }
        let plan = self.decode_plan.as_ref().expect("recorded above");
        let mut encoder = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("lean decode"),
            });
        let profiled = match &self.profiler {
            Some(profiler) => profiler.encode(plan, &mut encoder),
            None => {
                plan.encode(&mut encoder);
                None
            }
        };
        encoder.copy_buffer_to_buffer(&self.act.argmax, 0, &self.act.ids, 0, 4);
        encoder.copy_buffer_to_buffer(&self.act.argmax, 0, &self.decoded.staging[slot], 0, 4);
        let submission = self.ctx.queue.submit([encoder.finish()]);
        if let (Some(profiler), Some(n)) = (self.profiler.as_mut(), profiled) {
            profiler.collect(&self.ctx, "decode", plan, n);
        }
        let map = self.ctx.request_map(&self.decoded.staging[slot]);
        self.decoded.pending.push_back(PendingId {
            slot,
            submission,
            map,
        });
        self.ctx.take_error()?;
        self.pos += 1;
        Ok(())
    }

    /// The id of the oldest pending decode pass. Natively this blocks until that submission is
    /// done (passes queued after it keep running); in a browser the poll is a no-op and the map
    /// callback arrives through the event loop.
    async fn read_oldest(&mut self) -> Result<u32> {
        let p = self
            .decoded
            .pending
            .pop_front()
            .ok_or_else(|| GpuError::Readback("no decode pass to read".into()))?;
        self.ctx
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(p.submission),
                timeout: None,
            })
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let bytes = self
            .ctx
            .read_mapped(&p.map, &self.decoded.staging[p.slot], 4)
            .await?;
        self.ctx.take_error()?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Reads (and drops) the ids of passes nobody waits for any more, freeing their slots.
    async fn drain(&mut self) -> Result<()> {
        while !self.decoded.pending.is_empty() {
            self.read_oldest().await?;
        }
        Ok(())
    }

    fn check(&self, tokens: &[u32]) -> lean::Result<()> {
        let vocab = self.model.config.vocab_size;
        if tokens.is_empty() {
            return Err(LeanError::InvalidArgument("no tokens to run".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(LeanError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({vocab})"
            )));
        }
        // A pass queued ahead for this very token is not counted twice.
        let pos = self.pos - usize::from(self.ahead.is_some());
        if pos + tokens.len() > self.capacity {
            return Err(LeanError::PromptTooLong {
                prompt_tokens: pos + tokens.len(),
                context_length: self.capacity,
            });
        }
        Ok(())
    }

    /// Runs all chunks but the last without output; returns the last chunk.
    fn run_prefix<'t>(&mut self, tokens: &'t [u32]) -> Result<&'t [u32]> {
        let last_start = (tokens.len() - 1) / self.chunk * self.chunk;
        for chunk in tokens[..last_start].chunks(self.chunk) {
            self.run_chunk(chunk, Output::Nothing)?;
        }
        Ok(&tokens[last_start..])
    }
}

impl Session for GpuSession {
    fn describe(&self) -> String {
        format!("gpu ({})", self.ctx.describe())
    }

    fn context_length(&self) -> usize {
        self.capacity
    }

    fn position(&self) -> usize {
        self.pos - usize::from(self.ahead.is_some())
    }

    fn kv_bytes(&self) -> usize {
        let c = &self.model.config;
        2 * c.n_layers * c.n_kv_heads * self.capacity * c.head_dim * 4
    }

    fn truncate(&mut self, pos: usize) {
        self.discard_ahead();
        self.pos = self.pos.min(pos);
    }

    fn forward(
        &mut self,
        _model: &Model,
        tokens: &[u32],
        want: Logits,
        on_logits: &mut (dyn FnMut(usize, &[f32]) + Send),
    ) -> lean::Result<()> {
        self.discard_ahead();
        self.check(tokens)?;
        let vocab = self.model.config.vocab_size;
        match want {
            Logits::Last => {
                let last = self.run_prefix(tokens).map_err(to_lean)?;
                self.run_chunk(last, Output::Last).map_err(to_lean)?;
                let logits = self
                    .wait(self.ctx.read_f32(&self.act.logits, vocab))
                    .map_err(to_lean)?;
                on_logits(tokens.len() - 1, &logits);
            }
            Logits::All => {
                let rows = LOGITS_CHUNK.min(self.chunk);
                for (i, chunk) in tokens.chunks(rows).enumerate() {
                    self.run_chunk(chunk, Output::All).map_err(to_lean)?;
                    let buffer = self.act.logits_all.as_ref().expect("made by run_chunk");
                    let logits = self
                        .wait(self.ctx.read_f32(buffer, chunk.len() * vocab))
                        .map_err(to_lean)?;
                    for (r, row) in logits.chunks_exact(vocab).enumerate() {
                        on_logits(i * rows + r, row);
                    }
                }
            }
        }
        Ok(())
    }

    fn forward_argmax(&mut self, _model: &Model, tokens: &[u32]) -> lean::Result<u32> {
        self.discard_ahead();
        self.check(tokens)?;
        let last = self.run_prefix(tokens).map_err(to_lean)?;
        self.run_chunk(last, Output::Last).map_err(to_lean)?;
        let id = self
            .wait(self.ctx.read_u32(&self.act.argmax, 1))
            .map_err(to_lean)?;
        Ok(id[0])
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn decode_argmax(&mut self, _model: &Model, token: u32, queue_next: bool) -> lean::Result<u32> {
        self.check(&[token])?;
        pollster::block_on(self.decode(token, queue_next)).map_err(to_lean)
    }

    fn decode_argmax_async<'a>(
        &'a mut self,
        _model: &'a Model,
        token: u32,
        queue_next: bool,
    ) -> LocalFuture<'a, lean::Result<u32>> {
        Box::pin(async move {
            self.check(&[token])?;
            self.decode(token, queue_next).await.map_err(to_lean)
        })
    }

    fn forward_last_async<'a>(
        &'a mut self,
        _model: &'a Model,
        tokens: &'a [u32],
        argmax_only: bool,
        logits: &'a mut [f32],
    ) -> LocalFuture<'a, lean::Result<u32>> {
        Box::pin(async move {
            self.discard_ahead();
            self.check(tokens)?;
            let last = self.run_prefix(tokens).map_err(to_lean)?;
            self.run_chunk(last, Output::Last).map_err(to_lean)?;
            if argmax_only {
                let id = self.settle(self.ctx.read_u32(&self.act.argmax, 1)).await;
                return Ok(id.map_err(to_lean)?[0]);
            }
            let vocab = self.model.config.vocab_size;
            let row = self
                .settle(self.ctx.read_f32(&self.act.logits, vocab))
                .await;
            logits.copy_from_slice(&row.map_err(to_lean)?);
            Ok(0)
        })
    }
}
