//! Running recorded plans: prefill chunks, greedy decode passes (up to DECODE_AHEAD queued
//! ahead, their ids read back through a ring of staging buffers), constrained greedy steps (the
//! mask uploaded while the pass runs, the masked argmax's id read back), waiting for and reading
//! back results.
use super::{to_lean, GpuSession, Output, LOGITS_CHUNK};
use crate::context::{GpuContext, MapRequest};
use crate::error::{GpuError, Result};
use crate::kernels::{argmax_len, argmax_masked_len, mask_words, MATVEC_MAX_TOKENS, NO_TOKEN};
use crate::plan::Plan;
use crate::profile::Profiler;
use lean::{LeanError, TokenMask};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// What a readback brought to the host, counted in `GpuSession::bytes_read`.
pub(super) trait HostBytes {
    fn host_bytes(&self) -> usize;
}

impl<T: bytemuck::Pod> HostBytes for Vec<T> {
    fn host_bytes(&self) -> usize {
        std::mem::size_of_val(self.as_slice())
    }
}

/// Greedy decode passes queued beyond the one whose id is awaited. Chromium on an H200 answered
/// a decode pass's readback about 3 ms after its submit however short the pass (BENCHMARKS.md,
/// "WebGPU in a real browser"): with one pass queued, every other step waited that long. With
/// more, each wait brings several ids; natively the GPU stays busy either way, and a stop
/// token leaves at most this many passes computed for nothing.
pub(super) const DECODE_AHEAD: usize = 4;

/// The ids that greedy decode passes produce, on their way back: each pass copies its argmax
/// into a staging buffer of a ring (one per pass in flight) in its own command buffer and asks
/// for the map right after its submit, so an id costs no extra submit and later passes can be
/// queued before it is read.
pub(super) struct DecodedIds {
    staging: Vec<wgpu::Buffer>,
    /// The ring's slot the next pass copies its id into.
    next_slot: usize,
    /// Passes whose id is still to be read, oldest first.
    pending: VecDeque<PendingId>,
}

struct PendingId {
    slot: usize,
    submission: wgpu::SubmissionIndex,
    map: MapRequest,
}

impl DecodedIds {
    pub(super) fn new(ctx: &GpuContext) -> Self {
        let staging = || {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("decoded id"),
                size: 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        DecodedIds {
            staging: (0..=DECODE_AHEAD).map(|_| staging()).collect(),
            next_slot: 0,
            pending: VecDeque::new(),
        }
    }
}

/// Passes with every row's logits of up to this many tokens keep their recorded plan
/// (`GpuSession::short_plans`): the verification passes of speculative decoding (guesses of up
/// to 16 tokens, and the last token).
const SHORT_PLAN_TOKENS: usize = 17;

/// LEAN_GPU_VERIFY_MATMUL=1 verifies guesses with the prefill-shaped pass (every row's logits
/// read back), as before the decode-shaped one: to measure one against the other.
fn verify_by_matmul() -> bool {
    static MATMUL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MATMUL.get_or_init(|| {
        !cfg!(target_arch = "wasm32")
            && std::env::var("LEAN_GPU_VERIFY_MATMUL").is_ok_and(|v| v == "1")
    })
}

/// LEAN_GPU_TRACE=1 prints the time of each decode step's phases to stderr (natively: a
/// browser has neither the variable nor std's clock).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| {
        !cfg!(target_arch = "wasm32") && std::env::var_os("LEAN_GPU_TRACE").is_some()
    })
}

impl GpuSession {
    /// Runs one chunk (at most `self.chunk` tokens; LOGITS_CHUNK for `Output::All`) at the
    /// current position.
    pub(super) fn run_chunk(&mut self, tokens: &[u32], output: Output) -> Result<()> {
        let n = tokens.len();
        self.ctx.before_pass();
        // A lost device records nothing more (its plans and buffers would be invalid).
        if let Some(why) = self.ctx.lost_already() {
            return Err(GpuError::DeviceLost(why));
        }
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
            let rows_out = matches!(output, Output::All | Output::Argmaxes);
            if rows_out && self.act.logits_all.is_none() {
                self.act.logits_all = Some(
                    self.ctx
                        .storage_f32("logits (all)", LOGITS_CHUNK * self.model.config.vocab_size),
                );
            }
            let phase = format!("prefill chunk of {n}");
            if n <= SHORT_PLAN_TOKENS && rows_out {
                let i = match self
                    .short_plans
                    .iter()
                    .position(|p| (p.0, p.1) == (n, output))
                {
                    Some(i) => i,
                    None => {
                        let plan = self.record(n, output)?;
                        self.short_plans.push((n, output, plan));
                        self.short_plans.len() - 1
                    }
                };
                let plan = &self.short_plans[i].2;
                Self::submit_plan(&self.ctx, &mut self.profiler, plan, &phase);
            } else {
                let plan = self.record(n, output)?;
                Self::submit_plan(&self.ctx, &mut self.profiler, &plan, &phase);
            }
        }
        self.ctx.take_error()?;
        self.pos += n;
        Ok(())
    }

    /// Runs `tokens` (the last generated token and the guesses after it) and returns each one's
    /// argmax: speculative decoding's verification pass. Up to MATVEC_MAX_TOKENS tokens are one
    /// decode-shaped pass (`Output::Argmaxes`) whose ids alone come back; more, or with
    /// LEAN_GPU_VERIFY_MATMUL=1 (natively: the prefill-shaped pass, to compare), passes with
    /// every row's logits read back. The caller has checked the tokens.
    pub(super) async fn argmaxes(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        let n = tokens.len();
        self.discard_ahead();
        if n == 1 {
            self.run_chunk(tokens, Output::Last)?;
            return self.settle(self.ctx.read_u32(&self.act.argmax, 1)).await;
        }
        if n <= MATVEC_MAX_TOKENS.min(self.chunk) && !verify_by_matmul() {
            self.run_chunk(tokens, Output::Argmaxes)?;
            let len = argmax_len(self.model.config.vocab_size);
            let rows = self
                .settle(self.ctx.read_u32(&self.act.argmax, n * len))
                .await?;
            return Ok(rows.iter().step_by(len).copied().collect());
        }
        let mut rows = Vec::new();
        self.prefill_rows(tokens, &mut rows).await?;
        let vocab = self.model.config.vocab_size;
        Ok(rows
            .chunks_exact(vocab)
            .map(lean::sampling::argmax)
            .collect())
    }

    /// Runs `tokens` (the last generated token and the guesses after it) and leaves every one's
    /// logits in `rows`: the verification pass of speculative sampling, and of greedy decoding
    /// under a constraint (each row's masked argmax is taken on the host). Up to
    /// MATVEC_MAX_TOKENS tokens are one decode-shaped pass, so each row is its decode step's,
    /// bit for bit, as in `argmaxes`; more are prefill-shaped chunks. The caller has checked
    /// the tokens.
    pub(super) async fn logit_rows(&mut self, tokens: &[u32], rows: &mut Vec<f32>) -> Result<()> {
        let n = tokens.len();
        let vocab = self.model.config.vocab_size;
        self.discard_ahead();
        rows.clear();
        if 1 < n && n <= MATVEC_MAX_TOKENS.min(self.chunk) && !verify_by_matmul() {
            self.run_chunk(tokens, Output::Argmaxes)?;
            let buffer = self.act.logits_all.as_ref().expect("made by run_chunk");
            let logits = self.settle(self.ctx.read_f32(buffer, n * vocab)).await?;
            rows.extend_from_slice(&logits);
            return Ok(());
        }
        self.prefill_rows(tokens, rows).await
    }

    /// Runs `tokens` (the last generated token and the guesses after it) and returns each one's
    /// argmax among the tokens its mask allows (`masks`: a row of `mask_words(vocab)` words per
    /// token; `None` where none is allowed): the verification pass of greedy decoding under a
    /// constraint. Up to MATVEC_MAX_TOKENS tokens are the decode-shaped pass of `argmaxes`, the
    /// masks uploaded and each row's masked argmax taken on the device (argmax_masked.wgsl, a
    /// row per token), so only the ids come back; more take every row's logits to the host. The
    /// caller has checked the tokens and the masks' length (`lean::session::check_masks`).
    pub(super) async fn masked_argmaxes(
        &mut self,
        tokens: &[u32],
        masks: &[u32],
    ) -> Result<Vec<Option<u32>>> {
        let n = tokens.len();
        let vocab = self.model.config.vocab_size;
        let words = mask_words(vocab);
        if n == 1 || n > MATVEC_MAX_TOKENS.min(self.chunk) || verify_by_matmul() {
            let mut rows = Vec::new();
            self.logit_rows(tokens, &mut rows).await?;
            let rows = rows.chunks_exact(vocab).zip(masks.chunks_exact(words));
            return Ok(rows
                .map(|(row, mask)| lean::sampling::argmax_masked(row, mask))
                .collect());
        }
        self.discard_ahead();
        self.run_chunk(tokens, Output::Argmaxes)?;
        self.ctx
            .queue
            .write_buffer(&self.act.mask, 0, bytemuck::cast_slice(masks));
        let mut plan = Plan::new();
        let logits = self.act.logits_all.as_ref().expect("made by run_chunk");
        let (mask, result) = (&self.act.mask, &self.act.argmax_masked);
        self.kernels
            .argmax_masked_rows(&self.ctx, &mut plan, logits, mask, result, vocab, n)?;
        Self::submit_plan(&self.ctx, &mut self.profiler, &plan, "masked argmaxes");
        let len = argmax_masked_len(vocab);
        let rows = self.settle(self.ctx.read_u32(result, n * len)).await?;
        Ok(rows
            .iter()
            .step_by(len)
            .map(|&id| (id != NO_TOKEN).then_some(id))
            .collect())
    }

    /// Every token's logits from prefill-shaped chunks (the matmuls), appended to `rows`.
    async fn prefill_rows(&mut self, tokens: &[u32], rows: &mut Vec<f32>) -> Result<()> {
        let vocab = self.model.config.vocab_size;
        for chunk in tokens.chunks(LOGITS_CHUNK.min(self.chunk)) {
            self.run_chunk(chunk, Output::All)?;
            let buffer = self.act.logits_all.as_ref().expect("made by run_chunk");
            let logits = self
                .settle(self.ctx.read_f32(buffer, chunk.len() * vocab))
                .await?;
            rows.extend_from_slice(&logits);
        }
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
    pub(super) fn wait<T: HostBytes>(
        &self,
        future: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let value = pollster::block_on(future)?;
        self.ctx.take_error()?;
        self.count_read(value.host_bytes());
        Ok(value)
    }

    /// Books `bytes` read back (`Session::bytes_read`).
    fn count_read(&self, bytes: usize) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A browser cannot block: its readbacks complete on the event loop, so the synchronous
    /// entry points refuse and name the asynchronous ones.
    #[cfg(target_arch = "wasm32")]
    pub(super) fn wait<T: HostBytes>(
        &self,
        _future: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        Err(GpuError::Readback(
            "WebGPU results arrive asynchronously: use Engine::begin_async / step_async".into(),
        ))
    }

    /// Awaits a readback of the submitted work (never blocks).
    pub(super) async fn settle<T: HostBytes>(
        &self,
        future: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let value = future.await?;
        self.ctx.take_error()?;
        self.count_read(value.host_bytes());
        Ok(value)
    }

    /// Forgets the passes queued ahead: the next passes overwrite their cache positions (their
    /// ids are read and dropped before the next decode pass is queued).
    pub(super) fn discard_ahead(&mut self) {
        self.ahead = None;
        self.masked_ahead = None;
        self.pos -= self.queued;
        self.queued = 0;
    }

    /// Greedy decoding of `token` (see `Session::decode_argmax`): its pass is queued (unless it
    /// already is, ahead), then up to `ahead` (at most DECODE_AHEAD) passes after it, each
    /// chained on the device (the pass before copied its argmax into the ids buffer), and only
    /// then is the id read.
    pub(super) async fn decode(&mut self, token: u32, ahead: usize) -> Result<u32> {
        let t = trace().then(std::time::Instant::now);
        if self.ahead.take() != Some(token) {
            self.discard_ahead();
            self.drain().await?;
            self.submit_decode(Some(token)).await?;
            self.queued = 1;
        }
        // This token's pass is the oldest pending one; top the queue up behind it.
        while self.queued <= ahead.min(DECODE_AHEAD) && self.pos < self.capacity {
            self.submit_decode(None).await?;
            self.queued += 1;
        }
        let submitted = t.map(|t| t.elapsed());
        let id = self.read_oldest().await?;
        self.queued -= 1;
        if let (Some(t), Some(submitted)) = (t, submitted) {
            eprintln!(
                "lean-gpu trace: decode · encode + submit {submitted:?} · wait for the id {:?}",
                t.elapsed() - submitted
            );
        }
        if self.queued > 0 {
            self.ahead = Some(id);
        }
        Ok(id)
    }

    /// Submits the decode pass at `self.pos` (its plan recorded on first use) of `token`, or of
    /// the id already in (or copied by `before` into) the ids buffer, in one command buffer
    /// between `before` and `after` (copies out of its results); a lost device submits nothing.
    fn submit_decode_pass(
        &mut self,
        label: &str,
        token: Option<u32>,
        before: impl FnOnce(&mut wgpu::CommandEncoder),
        after: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<wgpu::SubmissionIndex> {
        self.ctx.before_pass();
        if let Some(why) = self.ctx.lost_already() {
            return Err(GpuError::DeviceLost(why));
        }
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
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        before(&mut encoder);
        let profiled = match &self.profiler {
            Some(profiler) => profiler.encode(plan, &mut encoder),
            None => {
                plan.encode(&mut encoder);
                None
            }
        };
        after(&mut encoder);
        let submission = self.ctx.queue.submit([encoder.finish()]);
        if let (Some(profiler), Some(n)) = (self.profiler.as_mut(), profiled) {
            profiler.collect(&self.ctx, "decode", plan, n);
        }
        Ok(submission)
    }

    /// Queues the decode pass of one token at `self.pos`: `token`, or with `None` the argmax of
    /// the pass before (copied into the ids buffer by that pass).
    async fn submit_decode(&mut self, token: Option<u32>) -> Result<()> {
        // Every staging slot busy: only with passes whose ids nobody wants any more (`decode`
        // keeps at most DECODE_AHEAD + 1 wanted passes in flight).
        while self.decoded.pending.len() >= self.decoded.staging.len() {
            self.read_oldest().await?;
        }
        // Pending passes hold the slots just before this one, in order: this one is free.
        let slot = self.decoded.next_slot;
        self.decoded.next_slot = (slot + 1) % self.decoded.staging.len();
        // Handles (wgpu buffers are reference-counted): the pass borrows the session mutably.
        let (argmax, ids) = (self.act.argmax.clone(), self.act.ids.clone());
        let staging = self.decoded.staging[slot].clone();
        let submission = self.submit_decode_pass(
            "lean decode",
            token,
            |_| {},
            |encoder| {
                encoder.copy_buffer_to_buffer(&argmax, 0, &ids, 0, 4);
                encoder.copy_buffer_to_buffer(&argmax, 0, &staging, 0, 4);
            },
        )?;
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
        self.count_read(bytes.len());
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Reads (and drops) the ids of passes nobody waits for any more, freeing their slots.
    async fn drain(&mut self) -> Result<()> {
        while !self.decoded.pending.is_empty() {
            self.read_oldest().await?;
        }
        Ok(())
    }

    /// Greedy decoding under a constraint (`Session::forward_argmax_masked`): submits the pass
    /// of `tokens`, asks `mask` for the allowed tokens while the device runs it (the constraint's
    /// work on the CPU overlaps the forward pass), uploads them, and takes the masked argmax on
    /// the device: its id (4 bytes) is all that comes back. The next token's pass is queued
    /// behind it, fed that id on the device, before the id is read: the device is not idle
    /// while the id comes back and the constraint takes it, and a call for that id (the next
    /// step's) only adds the masked argmax.
    pub(super) async fn argmax_masked(
        &mut self,
        tokens: &[u32],
        mask: &mut dyn TokenMask,
    ) -> lean::Result<Option<u32>> {
        let queued_ahead = tokens.len() == 1 && self.masked_ahead == Some(tokens[0]);
        if queued_ahead {
            // That pass is this one: it holds its position already.
            self.masked_ahead = None;
            self.queued = 0;
        } else {
            self.discard_ahead();
            self.check(tokens)?;
            let last = self.run_prefix(tokens).map_err(to_lean)?;
            self.run_chunk(last, Output::Last).map_err(to_lean)?;
        }
        let allowed = mask.allowed()?;
        let id = self.submit_masked_argmax(allowed).await.map_err(to_lean)?;
        Ok((id != NO_TOKEN).then_some(id))
    }

    /// Queues the decode pass of the masked argmax's id (copied on the device into the ids
    /// buffer) at `self.pos`, counted in `queued`. An id of NO_TOKEN embeds nothing (embed.wgsl
    /// skips ids outside its rows): that pass's output is garbage, and dropped.
    fn submit_masked_ahead(&mut self) -> Result<()> {
        let (masked, ids) = (self.act.argmax_masked.clone(), self.act.ids.clone());
        self.submit_decode_pass(
            "lean decode behind a masked argmax",
            None,
            |encoder| encoder.copy_buffer_to_buffer(&masked, 0, &ids, 0, 4),
            |_| {},
        )?;
        self.ctx.take_error()?;
        self.pos += 1;
        self.queued = 1;
        Ok(())
    }

    /// Uploads `allowed` (ids past its end disallowed) and runs the masked argmax over the
    /// logits of the pass submitted last, queues the next pass behind it (room permitting);
    /// returns its id, or NO_TOKEN.
    async fn submit_masked_argmax(&mut self, allowed: &[u32]) -> Result<u32> {
        let vocab = self.model.config.vocab_size;
        let words = mask_words(vocab);
        let padded;
        let upload = if allowed.len() >= words {
            &allowed[..words]
        } else {
            padded = [allowed, &vec![0; words - allowed.len()]].concat();
            &padded
        };
        self.ctx
            .queue
            .write_buffer(&self.act.mask, 0, bytemuck::cast_slice(upload));
        if self.masked_plan.is_none() {
            let mut plan = Plan::new();
            let a = &self.act;
            let mask = &a.mask;
            self.kernels.argmax_masked(
                &self.ctx,
                &mut plan,
                &a.logits,
                mask,
                &a.argmax_masked,
                vocab,
            )?;
            self.masked_plan = Some(plan);
        }
        let plan = self.masked_plan.as_ref().expect("recorded above");
        // A staging buffer per call (4 bytes): a future dropped before its map resolves leaves
        // nothing mapped behind it.
        let staging = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("masked argmax id"),
            size: 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("lean masked argmax"),
            });
        let profiled = match &self.profiler {
            Some(profiler) => profiler.encode(plan, &mut encoder),
            None => {
                plan.encode(&mut encoder);
                None
            }
        };
        encoder.copy_buffer_to_buffer(&self.act.argmax_masked, 0, &staging, 0, 4);
        let submission = self.ctx.queue.submit([encoder.finish()]);
        if let (Some(profiler), Some(n)) = (self.profiler.as_mut(), profiled) {
            profiler.collect(&self.ctx, "masked argmax", plan, n);
        }
        let map = self.ctx.request_map(&staging);
        self.ctx.take_error()?;
        if self.pos < self.capacity {
            self.submit_masked_ahead()?;
        }
        self.ctx
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: None,
            })
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let bytes = self.ctx.read_mapped(&map, &staging, 4).await?;
        self.ctx.take_error()?;
        self.count_read(bytes.len());
        let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if self.queued == 1 {
            self.masked_ahead = Some(id);
        }
        Ok(id)
    }

    pub(super) fn check(&self, tokens: &[u32]) -> lean::Result<()> {
        let vocab = self.model.config.vocab_size;
        if tokens.is_empty() {
            return Err(LeanError::InvalidArgument("no tokens to run".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(LeanError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({vocab})"
            )));
        }
        // Passes queued ahead are not counted: a new pass discards them.
        let pos = self.pos - self.queued;
        if pos + tokens.len() > self.capacity {
            return Err(LeanError::PromptTooLong {
                prompt_tokens: pos + tokens.len(),
                context_length: self.capacity,
            });
        }
        Ok(())
    }

    /// Runs all chunks but the last without output; returns the last chunk.
    pub(super) fn run_prefix<'t>(&mut self, tokens: &'t [u32]) -> Result<&'t [u32]> {
        let last_start = (tokens.len() - 1) / self.chunk * self.chunk;
        for chunk in tokens[..last_start].chunks(self.chunk) {
            self.run_chunk(chunk, Output::Nothing)?;
        }
        Ok(&tokens[last_start..])
    }
}
