//! Loading a model onto the device: its weights (stacked where stack.rs says), norms, rotary
//! tables, the KV cache and the activations of a prefill chunk.
use super::{DecodedIds, GpuSession, PREFILL_CHUNK};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::kernels::{AttentionShape, Kernels, StepBuffer};
use crate::profile::Profiler;
use crate::stack;
use crate::weights::GpuMatrix;
use lean::config::ModelConfig;
use lean::model::Matrix;
use lean::Model;
use std::sync::Arc;

/// Matrices that read the same input and write one activation row per token, `width` wide:
/// one stacked matrix, or (their types or row lengths differ) each at its offset in the row.
pub(super) struct Stack {
    /// (offset in the row, matrix).
    pub(super) matrices: Vec<(usize, GpuMatrix)>,
    pub(super) width: usize,
    /// A bias for the whole row.
    pub(super) bias: Option<wgpu::Buffer>,
    /// gate|up as one matrix of interleaved rows (stack.rs: interleaves): a decode matvec
    /// writes silu(gate) · up, a prefill matmul [gate_0, up_0, gate_1, ...] rows.
    pub(super) pairs: bool,
}

pub(super) struct LayerBuffers {
    pub(super) attn_norm: wgpu::Buffer,
    /// Rows [q | k | v].
    pub(super) qkv: Stack,
    /// Per-head RMS norms of q and k (head_dim each), after the projection's bias.
    pub(super) qk_norms: Option<(wgpu::Buffer, wgpu::Buffer)>,
    pub(super) wo: GpuMatrix,
    /// RMS norms of the attention's and the FFN's outputs before their residual adds.
    pub(super) post_attn_norm: Option<wgpu::Buffer>,
    pub(super) ffn_norm: wgpu::Buffer,
    pub(super) post_ffn_norm: Option<wgpu::Buffer>,
    /// Rows [gate | up].
    pub(super) gate_up: Stack,
    pub(super) w_down: GpuMatrix,
    /// This layer's cache: [kv_head][capacity][head_dim] each (one buffer per layer keeps every
    /// binding small).
    pub(super) keys: wgpu::Buffer,
    pub(super) values: wgpu::Buffer,
}

/// A model's weights on the device; `output` is `None` when the head is tied to the embedding.
pub struct GpuModel {
    pub(super) config: ModelConfig,
    pub(super) token_embd: GpuMatrix,
    pub(super) output_norm: wgpu::Buffer,
    pub(super) output: Option<GpuMatrix>,
}

impl GpuModel {
    pub(super) fn output(&self) -> &GpuMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

/// Activations of up to `GpuSession::chunk` tokens (the decode plan uses their first rows).
pub(super) struct Activations {
    pub(super) ids: wgpu::Buffer,
    pub(super) x: wgpu::Buffer,
    pub(super) h: wgpu::Buffer,
    /// [token][q | k | v].
    pub(super) qkv: wgpu::Buffer,
    pub(super) attn: wgpu::Buffer,
    /// Split-K attention's partial results.
    pub(super) partials: wgpu::Buffer,
    /// [token][gate | up].
    pub(super) gate_up: wgpu::Buffer,
    pub(super) act: wgpu::Buffer,
    /// Logits of the last token, or of every token of a chunk (`Logits::All`, made on demand).
    pub(super) logits: wgpu::Buffer,
    pub(super) logits_all: Option<wgpu::Buffer>,
    pub(super) argmax: wgpu::Buffer,
    /// A constrained step's allowed tokens (a bitset over the vocabulary), uploaded per step,
    /// and the masked argmax's result (then its first pass's scratch); a row of each per token
    /// of a verification pass under a constraint.
    pub(super) mask: wgpu::Buffer,
    pub(super) argmax_masked: wgpu::Buffer,
}

/// An RMS norm's weights, zero-padded to whole units (32 elements): a matvec that fuses the norm
/// in reads them a slice at a time.
fn upload_norm(ctx: &GpuContext, label: &str, weight: &[f32]) -> wgpu::Buffer {
    let mut padded = weight.to_vec();
    padded.resize(weight.len().next_multiple_of(32), 0.0);
    ctx.upload_f32(label, &padded)
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
                // The description loads both or neither (`Block::qk_norm`).
                let qk_norms = l
                    .q_norm
                    .as_ref()
                    .zip(l.k_norm.as_ref())
                    .map(|(q, k)| (ctx.upload_f32("q_norm", q), ctx.upload_f32("k_norm", k)));
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
        // Steps of fewer tokens split each head more, and a verification pass splits each
        // token as a decoded one: the scratch fits the largest.
        let partials_len = (1..=n)
            .map(|n_tokens| {
                let shape = AttentionShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    n_tokens,
                    capacity: context_length,
                    cache_offset: 0,
                    scale: c.block.attention_scale,
                    window: None,
                };
                match n_tokens <= crate::kernels::MATVEC_MAX_TOKENS {
                    true => shape.partials_len().max(shape.partials_len_per_token()),
                    false => shape.partials_len(),
                }
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
            // a row per token of a verification pass (Output::Argmaxes)
            argmax: ctx.storage_f32(
                "argmax",
                crate::kernels::MATVEC_MAX_TOKENS * crate::kernels::argmax_len(c.vocab_size),
            ),
            // a row per token of a verification pass under a constraint
            mask: ctx.storage_f32(
                "token mask",
                crate::kernels::MATVEC_MAX_TOKENS * crate::kernels::mask_words(c.vocab_size),
            ),
            argmax_masked: ctx.storage_f32(
                "masked argmax",
                crate::kernels::MATVEC_MAX_TOKENS * crate::kernels::argmax_masked_len(c.vocab_size),
            ),
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
            short_plans: Vec::new(),
            masked_plan: None,
            bytes_read: Default::default(),
            decoded: DecodedIds::new(&ctx_for_ids),
            ahead: None,
            queued: 0,
            masked_ahead: None,
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
}
