//! The GPU backend's session: the model's weights on the device (packed as in the GGUF), a KV
//! cache, activations, and recorded plans of the forward pass.
//!
//! A step (a prefill chunk or one decoded token) is one command buffer and one submit: the
//! token ids and the position are written into small buffers, the recorded plan replays, and
//! only what the caller needs comes back: the argmax id (4 bytes) for greedy decoding (under a
//! constraint too: the mask goes up, the masked argmax id comes back), else the logits. The decode plan (one token) is recorded once; prefill plans per chunk size.
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
//!
//! The session is split by what each part does: `load.rs` puts the weights on the device and
//! allocates the cache and activations, `graph.rs` records a step's plan from the model's
//! description, `decode.rs` submits plans and brings the results back (prefill chunks, greedy
//! decode passes queued ahead, readback).
mod decode;
mod graph;
mod load;
#[cfg(test)]
mod tests;

use decode::DecodedIds;
use graph::Output;
pub use load::GpuModel;
use load::{Activations, LayerBuffers};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::kernels::{Kernels, StepBuffer};
use crate::plan::Plan;
use crate::profile::Profiler;
use lean::session::LocalFuture;
use lean::{LeanError, Logits, Model, Session, TokenMask};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Tokens per prefill submit (at most the context): bounds the activations. Long chunks keep a
/// large GPU's matmul tiles busy (on an H200, 512 prefilled 1.3-1.8x faster than 128).
pub const PREFILL_CHUNK: usize = 512;
/// Tokens per submit when every token's logits come back (`Logits::All`): bounds that buffer
/// (128 × a 152k vocabulary = 78 MB, inside a browser's 128 MiB binding).
pub const LOGITS_CHUNK: usize = 128;

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
    /// Positions written to the KV cache, the passes queued ahead included.
    pos: usize,
    decode_plan: Option<Plan>,
    /// Plans of short passes with every row's logits, by token count (speculative decoding's
    /// verification passes): recording one makes a bind group per dispatch, which cost ten
    /// decode steps' time on an H200.
    short_plans: Vec<(usize, Output, Plan)>,
    /// The masked argmax over the last token's logits (`forward_argmax_masked`), recorded on
    /// first use.
    masked_plan: Option<Plan>,
    /// Bytes read back from the device (`Session::bytes_read`).
    bytes_read: AtomicU64,
    decoded: DecodedIds,
    /// Set while decode passes are queued ahead (`decode_argmax` with `ahead`): the id the
    /// first of them runs, read back by the previous call.
    ahead: Option<u32>,
    /// How many decode passes are queued ahead: the last entries of `decoded.pending`, the
    /// first running `ahead`, each later one the argmax of the one before; or (with `ahead`
    /// unset) the one pass queued behind a masked argmax, running its id.
    queued: usize,
    /// The id the pass queued behind the last masked argmax runs, once read back
    /// (`argmax_masked`): the next call for that token finds its pass done or under way.
    masked_ahead: Option<u32>,
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

/// A GPU error as the engine sees it: the device's loss as `LeanError::DeviceLost` (the engine
/// may continue on the CPU), anything else as `LeanError::Backend`.
pub fn to_lean(e: GpuError) -> LeanError {
    match e {
        GpuError::DeviceLost(why) => LeanError::DeviceLost(why),
        e => LeanError::Backend(format!("GPU: {e}")),
    }
}

impl GpuSession {
    /// Prefills at most `tokens` tokens per submit (at least 1; never more than the session
    /// allocated for): tests make short prompts run in several chunks with it.
    pub fn limit_prefill_chunk(&mut self, tokens: usize) {
        self.chunk = tokens.clamp(1, self.chunk);
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
        self.pos - self.queued
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
        let ctx = self.ctx.clone();
        self.discard_ahead();
        self.check(tokens)?;
        let vocab = self.model.config.vocab_size;
        match want {
            Logits::Last => {
                let last = self
                    .run_prefix(tokens)
                    .map_err(|e| to_lean(ctx.classify(e)))?;
                self.run_chunk(last, Output::Last)
                    .map_err(|e| to_lean(ctx.classify(e)))?;
                let logits = self
                    .wait(self.ctx.read_f32(&self.act.logits, vocab))
                    .map_err(|e| to_lean(ctx.classify(e)))?;
                on_logits(tokens.len() - 1, &logits);
            }
            Logits::All => {
                let rows = LOGITS_CHUNK.min(self.chunk);
                for (i, chunk) in tokens.chunks(rows).enumerate() {
                    self.run_chunk(chunk, Output::All)
                        .map_err(|e| to_lean(ctx.classify(e)))?;
                    let buffer = self.act.logits_all.as_ref().expect("made by run_chunk");
                    let logits = self
                        .wait(self.ctx.read_f32(buffer, chunk.len() * vocab))
                        .map_err(|e| to_lean(ctx.classify(e)))?;
                    for (r, row) in logits.chunks_exact(vocab).enumerate() {
                        on_logits(i * rows + r, row);
                    }
                }
            }
        }
        Ok(())
    }

    fn forward_argmax(&mut self, _model: &Model, tokens: &[u32]) -> lean::Result<u32> {
        let ctx = self.ctx.clone();
        self.discard_ahead();
        self.check(tokens)?;
        let last = self
            .run_prefix(tokens)
            .map_err(|e| to_lean(ctx.classify(e)))?;
        self.run_chunk(last, Output::Last)
            .map_err(|e| to_lean(ctx.classify(e)))?;
        let id = self
            .wait(self.ctx.read_u32(&self.act.argmax, 1))
            .map_err(|e| to_lean(ctx.classify(e)))?;
        Ok(id[0])
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn forward_argmax_masked(
        &mut self,
        _model: &Model,
        tokens: &[u32],
        mask: &mut dyn TokenMask,
    ) -> lean::Result<Option<u32>> {
        pollster::block_on(self.argmax_masked(tokens, mask))
    }

    fn forward_argmax_masked_async<'a>(
        &'a mut self,
        _model: &'a Model,
        tokens: &'a [u32],
        mask: &'a mut dyn TokenMask,
    ) -> LocalFuture<'a, lean::Result<Option<u32>>> {
        Box::pin(self.argmax_masked(tokens, mask))
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn decode_argmax(&mut self, _model: &Model, token: u32, ahead: usize) -> lean::Result<u32> {
        let ctx = self.ctx.clone();
        self.check(&[token])?;
        pollster::block_on(self.decode(token, ahead)).map_err(|e| to_lean(ctx.classify(e)))
    }

    fn decode_argmax_async<'a>(
        &'a mut self,
        _model: &'a Model,
        token: u32,
        ahead: usize,
    ) -> LocalFuture<'a, lean::Result<u32>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            self.check(&[token])?;
            self.decode(token, ahead)
                .await
                .map_err(|e| to_lean(ctx.classify(e)))
        })
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn forward_argmax_all_masked(
        &mut self,
        model: &Model,
        tokens: &[u32],
        masks: &[u32],
    ) -> lean::Result<Vec<Option<u32>>> {
        pollster::block_on(self.forward_argmax_all_masked_async(model, tokens, masks))
    }

    fn forward_argmax_all_masked_async<'a>(
        &'a mut self,
        _model: &'a Model,
        tokens: &'a [u32],
        masks: &'a [u32],
    ) -> LocalFuture<'a, lean::Result<Vec<Option<u32>>>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            self.check(tokens)?;
            let words = crate::kernels::mask_words(self.model.config.vocab_size);
            lean::session::check_masks(masks.len(), tokens.len(), words)?;
            self.masked_argmaxes(tokens, masks)
                .await
                .map_err(|e| to_lean(ctx.classify(e)))
        })
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn forward_logits_all(
        &mut self,
        model: &Model,
        tokens: &[u32],
        rows: &mut Vec<f32>,
    ) -> lean::Result<()> {
        pollster::block_on(self.forward_logits_all_async(model, tokens, rows))
    }

    fn forward_logits_all_async<'a>(
        &'a mut self,
        _model: &'a Model,
        tokens: &'a [u32],
        rows: &'a mut Vec<f32>,
    ) -> LocalFuture<'a, lean::Result<()>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            self.check(tokens)?;
            self.logit_rows(tokens, rows)
                .await
                .map_err(|e| to_lean(ctx.classify(e)))
        })
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn forward_argmax_all(&mut self, model: &Model, tokens: &[u32]) -> lean::Result<Vec<u32>> {
        pollster::block_on(self.forward_argmax_all_async(model, tokens))
    }

    fn forward_argmax_all_async<'a>(
        &'a mut self,
        _model: &'a Model,
        tokens: &'a [u32],
    ) -> LocalFuture<'a, lean::Result<Vec<u32>>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            self.check(tokens)?;
            self.argmaxes(tokens)
                .await
                .map_err(|e| to_lean(ctx.classify(e)))
        })
    }

    fn forward_last_async<'a>(
        &'a mut self,
        _model: &'a Model,
        tokens: &'a [u32],
        argmax_only: bool,
        logits: &'a mut [f32],
    ) -> LocalFuture<'a, lean::Result<u32>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            self.discard_ahead();
            self.check(tokens)?;
            let last = self
                .run_prefix(tokens)
                .map_err(|e| to_lean(ctx.classify(e)))?;
            self.run_chunk(last, Output::Last)
                .map_err(|e| to_lean(ctx.classify(e)))?;
            if argmax_only {
                let id = self.settle(self.ctx.read_u32(&self.act.argmax, 1)).await;
                return Ok(id.map_err(|e| to_lean(ctx.classify(e)))?[0]);
            }
            let vocab = self.model.config.vocab_size;
            let row = self
                .settle(self.ctx.read_f32(&self.act.logits, vocab))
                .await;
            logits.copy_from_slice(&row.map_err(|e| to_lean(ctx.classify(e)))?);
            Ok(0)
        })
    }
}
