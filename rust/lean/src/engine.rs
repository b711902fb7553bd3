//! The engine: a model, its tokenizer and a backend session, and the generation loop
//! (prefill the prompt as one batch, then decode token by token until a stop condition). The
//! loop is resumable: `begin` / `step` / `finish` run it one token per call, for callers that must
//! return to an event loop between tokens (the WebAssembly bindings); `generate` loops over them.
//!
//! The session's KV cache outlives a generation: the engine remembers the ids whose keys and
//! values it holds, and a prompt that starts with them (the next turn of a chat) prefills only
//! the rest. A prompt that diverges keeps the common prefix. Rolling back is a length change.
//!
//! With speculative decoding ([`GenerateOptions::speculation`]) a step may run the
//! last token together with guessed next tokens in one batched pass; the guesses the model
//! confirms come out of the following steps without a forward pass (see [`crate::speculative`]).
use crate::clock::{now, since};
use crate::cpu::CpuSession;
use crate::error::{LeanError, Result};
use crate::model::Model;
use crate::sampling::{Sampler, SamplingParams};
use crate::session::{Logits, Session, TokenMask};
use crate::speculative::{accepted_prefix, DraftModel, Drafter, Speculation, SpeculationStats};
use lean_constraint::{Constraint, ConstraintSpec, Vocabulary};
use lean_tokenizer::{ChatMessage, StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What to generate from.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Plain completion of a text (tokenized with the tokenizer's special-token rules).
    Raw(String),
    /// A conversation rendered with the model's chat template, ending with the assistant's turn.
    Chat(Vec<ChatMessage>),
    /// Token ids as they are.
    Ids(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after any of these ids (the stop token is reported, its text is not).
    /// `None` means the tokenizer's end-of-sequence ids.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Constrained decoding: each step samples only among the tokens that keep the output
    /// inside the constraint (a JSON schema, regex, grammar); the generation stops when the
    /// output is complete. `None`: free text, and no mask work at all.
    pub constraint: Option<ConstraintSpec>,
    /// Speculative decoding: guessed tokens verified in one batched pass. Greedy output is the
    /// plain greedy output; sampled output has the same distribution (speculative sampling's
    /// rejection rule, other random draws). Under a constraint, guesses are cut where it refuses
    /// them and each row is verified against its own mask. `None`: one pass per token.
    pub speculation: Option<Speculation>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_token_ids: None,
            constraint: None,
            speculation: None,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The context window is full.
    ContextFull,
    /// The caller asked to stop.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// One generated token as it streams out.
#[derive(Clone, Debug)]
pub struct TokenEvent {
    pub id: u32,
    /// Text that became complete with this token (may be empty: a character split across tokens).
    pub text: String,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys/values came from the cache (not run again); the prefill ran
    /// `prompt_tokens - cached_tokens`.
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    /// Time spent in `step` and `finish`: not the caller's time between steps (nor `generate`'s
    /// callbacks).
    pub decode_seconds: f64,
    /// Speculative decoding's passes and guesses (all zero without it).
    pub speculation: SpeculationStats,
}

impl Timings {
    /// Over the prompt tokens the prefill ran (cached ones excluded).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / self.prefill_seconds.max(1e-9)
    }
    /// Decode rate over the tokens after the first (the first comes out of the prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_seconds.max(1e-9)
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
    /// Set when the device was lost during this generation and it continued on the CPU.
    pub backend_change: Option<BackendChange>,
}

/// The engine's session moved to another backend: its GPU device was lost (driver reset, the
/// browser reclaimed it, an out-of-memory it did not survive), and the engine continued on the
/// CPU with the same tokens (every backend gives the same greedy ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendChange {
    /// `Engine::backend()` before and after.
    pub from: String,
    pub to: String,
    /// Why: the loss as the device reported it.
    pub reason: String,
    /// Tokens the generation had produced when the device was lost (0: during its prefill).
    pub generated_tokens: usize,
    /// Positions the CPU session prefilled again (the cached prompt and tokens so far) before
    /// the failed pass ran again.
    pub replayed_tokens: usize,
}

/// Called when the engine changes backends (`Engine::on_backend_change`).
#[cfg(not(target_arch = "wasm32"))]
pub type BackendChangeHook = Box<dyn FnMut(&BackendChange) + Send>;
#[cfg(target_arch = "wasm32")]
pub type BackendChangeHook = Box<dyn FnMut(&BackendChange)>;

pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    session: Box<dyn Session>,
    /// The generation whose KV cache the session holds (see [`ActiveGeneration`]).
    session_owner: u64,
    /// The ids whose keys/values the session holds, position by position (its `position()`
    /// of them): what a later prompt may reuse.
    cached: Vec<u32>,
    /// The vocabulary as the constraint library sees it (token bytes, trie), made on the first
    /// constrained generation, with the stop ids it was made for.
    constraint_vocab: Option<Arc<Vocabulary>>,
    /// The model that guesses for `Speculation::DraftModel`.
    draft: Option<DraftModel>,
    /// Continue on a CPU session when the device is lost (default: true; possible only while
    /// the model's weights are in memory).
    device_loss_fallback: bool,
    on_backend_change: Option<BackendChangeHook>,
}

impl Engine {
    /// Checks that the tokenizer belongs to the model and sizes the KV cache for
    /// `context_length` positions (capped at the model's training context), on the CPU.
    pub fn new(model: Model, tokenizer: Tokenizer, context_length: usize) -> Result<Self> {
        Self::with_backend(model, tokenizer, context_length, |model, ctx| {
            Ok(Box::new(CpuSession::new(model, ctx)))
        })
    }

    /// As `new`, with the session made by `new_session(model, context_length)` (e.g. a GPU
    /// session from `lean-gpu`).
    pub fn with_backend(
        model: Model,
        tokenizer: Tokenizer,
        context_length: usize,
        new_session: impl FnOnce(&Model, usize) -> Result<Box<dyn Session>>,
    ) -> Result<Self> {
        tokenizer.check_vocab(&model.vocabulary()?)?;
        let ctx = Self::capped_context(&model, context_length)?;
        let session = new_session(&model, ctx)?;
        Ok(Engine {
            model,
            tokenizer,
            session,
            session_owner: NO_SESSION_OWNER,
            // One id per cache position, allocated once: tokens never grow it.
            cached: Vec::with_capacity(ctx),
            constraint_vocab: None,
            draft: None,
            device_loss_fallback: true,
            on_backend_change: None,
        })
    }

    /// Gives the engine a draft model for `Speculation::DraftModel`: a smaller model with the
    /// same vocabulary (else an `InvalidArgument` naming the difference), its session made by
    /// `new_session(model, context_length)` with this engine's context length (capped at the
    /// draft model's). Replaces an earlier one.
    pub fn set_draft_model(
        &mut self,
        model: Model,
        new_session: impl FnOnce(&Model, usize) -> Result<Box<dyn Session>>,
    ) -> Result<()> {
        let ctx = Self::capped_context(&model, self.context_length())?;
        let session = new_session(&model, ctx)?;
        self.draft = Some(DraftModel::new(model, session, &self.model.vocabulary()?)?);
        Ok(())
    }

    /// The draft model and its backend, in one line, when there is one.
    pub fn draft_model(&self) -> Option<String> {
        self.draft.as_ref().map(DraftModel::describe)
    }

    /// The context length a session gets: the requested one, capped at the model's.
    pub fn capped_context(model: &Model, context_length: usize) -> Result<usize> {
        if context_length == 0 {
            return Err(LeanError::InvalidArgument(
                "the context length must be at least 1".into(),
            ));
        }
        Ok(context_length.min(model.config.train_context_length.max(1)))
    }

    /// Which backend runs, in one line.
    pub fn backend(&self) -> String {
        self.session.describe()
    }

    /// Bytes the backend has read back from its device so far (`Session::bytes_read`; 0 on
    /// the CPU).
    pub fn bytes_read(&self) -> u64 {
        self.session.bytes_read()
    }

    /// Whether a generation whose device is lost continues on the CPU (the default): the engine
    /// makes a CPU session, prefills it with the ids the lost one cached and runs the failed
    /// pass again, so the tokens are the ones the GPU would have given (greedy ids are the same
    /// on every backend). Only the device's loss falls back: other backend errors (validation,
    /// an out-of-memory error the device survives) fail the step as before. Needs the model's
    /// weights in memory (natively the GGUF is memory-mapped; a model streamed straight into a
    /// browser's GPU has none: there the error reaches the caller, `LeanError::DeviceLost`).
    pub fn set_device_loss_fallback(&mut self, on: bool) {
        self.device_loss_fallback = on;
    }

    /// Calls `hook` when the engine changes backends (the device was lost and it continued on
    /// the CPU), as it happens; `Generation::backend_change` says so at the end too.
    pub fn on_backend_change(&mut self, hook: BackendChangeHook) {
        self.on_backend_change = Some(hook);
    }

    /// After a pass failed with `error`: when the device was lost and the engine may fall back,
    /// replaces the session (and the draft model's) with CPU sessions, the main one prefilled
    /// with the ids the lost one cached, so the caller can run the failed pass again. `None`
    /// when the error stays an error.
    fn fall_back(&mut self, error: &LeanError, generated: usize) -> Result<Option<BackendChange>> {
        let LeanError::DeviceLost(reason) = error else {
            return Ok(None);
        };
        if !self.device_loss_fallback || !self.model.has_weight_data() {
            return Ok(None);
        }
        let from = self.session.describe();
        let mut session: Box<dyn Session> =
            Box::new(CpuSession::new(&self.model, self.session.context_length()));
        if !self.cached.is_empty() {
            session.forward(&self.model, &self.cached, Logits::Last, &mut |_, _| {})?;
        }
        self.session = session;
        if let Some(draft) = &mut self.draft {
            draft.fall_back_to_cpu();
        }
        let change = BackendChange {
            from,
            to: self.session.describe(),
            reason: reason.clone(),
            generated_tokens: generated,
            replayed_tokens: self.cached.len(),
        };
        if let Some(hook) = &mut self.on_backend_change {
            hook(&change);
        }
        Ok(Some(change))
    }

    pub fn context_length(&self) -> usize {
        self.session.context_length()
    }

    pub fn kv_cache_bytes(&self) -> usize {
        self.session.kv_bytes()
    }

    /// The ids whose keys/values the cache holds (the last conversation: its prompt and the
    /// tokens generated after it that ran through the model).
    pub fn cached_ids(&self) -> &[u32] {
        &self.cached
    }

    /// How many of `prompt`'s ids the next generation would take from the cache: the common
    /// prefix with [`Engine::cached_ids`], less the last prompt token (which must run to give
    /// the next token's logits).
    pub fn reusable_tokens(&self, prompt: &Prompt) -> Result<usize> {
        Ok(self.reusable_prefix(&self.encode(prompt)?))
    }

    fn reusable_prefix(&self, ids: &[u32]) -> usize {
        let common = self
            .cached
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count();
        common.min(ids.len().saturating_sub(1))
    }

    /// Forgets the cache: the next generation prefills its whole prompt.
    pub fn reset_cache(&mut self) {
        self.session_owner = NO_SESSION_OWNER;
        self.cached.clear();
        self.session.truncate(0);
    }

    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        Ok(match prompt {
            Prompt::Raw(text) => self.tokenizer.encode(text, true)?,
            Prompt::Chat(messages) => self.tokenizer.encode_chat(messages, true)?,
            Prompt::Ids(ids) => ids.clone(),
        })
    }

    /// Teacher-forced logits for every position of `ids` (from a fresh context).
    pub fn logits_all(
        &mut self,
        ids: &[u32],
        on_logits: impl FnMut(usize, &[f32]) + Send,
    ) -> Result<()> {
        let mut on_logits = on_logits;
        self.reset_cache();
        self.session
            .forward(&self.model, ids, Logits::All, &mut on_logits)?;
        self.cached.extend_from_slice(ids);
        Ok(())
    }

    /// Generates from `prompt`, calling `on_token` for every token; return `false` from it to stop.
    /// A loop over [`Engine::begin`], [`Engine::step`] and [`Engine::finish`].
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        mut on_token: impl FnMut(&TokenEvent) -> bool,
    ) -> Result<Generation> {
        let mut active = self.begin(prompt, options)?;
        let cancelled = loop {
            let step = self.step(&mut active)?;
            // The caller's answer comes first: declining the last token still cancels.
            if let Some(token) = &step.token {
                if !on_token(token) {
                    break true;
                }
            }
            if step.finished.is_some() {
                break false;
            }
        };
        let ended = self.finish(active)?;
        if let Some(held_back) = &ended.held_back {
            on_token(held_back);
        }
        let mut generation = ended.generation;
        if cancelled {
            generation.finish_reason = FinishReason::Cancelled;
        }
        Ok(generation)
    }

    /// Starts a generation: encodes and checks `prompt` and runs it through the model as one
    /// batch. Then [`Engine::step`] produces the tokens one at a time, and [`Engine::finish`]
    /// ends it (at any point: before a step reported the end, it counts as cancelled). The
    /// session holds one generation: a later `begin` (or `logits_all`) makes this one's steps
    /// fail.
    pub fn begin(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
    ) -> Result<ActiveGeneration> {
        let active = self.prepare(prompt, options, None)?;
        self.prefill(active)
    }

    /// `begin` with a constraint compiled already by [`Engine::compile_constraint`] or
    /// [`Constraint::new`] (a server checks a request's schema before it queues, and the
    /// generation then follows that same compiled constraint instead of compiling it again).
    /// `options.constraint` is ignored. A constraint compiled over another vocabulary or other
    /// stop ids than this generation's is an `InvalidArgument`.
    pub fn begin_constrained(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        constraint: Constraint,
    ) -> Result<ActiveGeneration> {
        let active = self.prepare(prompt, options, Some(constraint))?;
        self.prefill(active)
    }

    /// `begin`'s forward pass over the prompt (what the cache does not hold of it).
    fn prefill(&mut self, mut active: ActiveGeneration) -> Result<ActiveGeneration> {
        let t0 = now();
        // Run once; after a lost device, once more on the CPU session that replaced it.
        let mut fell_back = false;
        let result = loop {
            let fresh = &active.ids[active.timings.cached_tokens..];
            let result = match active.constraint.as_mut().filter(|_| active.masked_argmax) {
                Some(constraint) => self
                    .session
                    .forward_argmax_masked(&self.model, fresh, constraint)
                    .and_then(allowed_token),
                None => self.session.forward_last(
                    &self.model,
                    fresh,
                    active.argmax_only,
                    &mut active.logits,
                ),
            };
            if let Err(e) = &result {
                if !fell_back {
                    if let Some(change) = self.fall_back(e, 0)? {
                        active.backend_change = Some(change);
                        fell_back = true;
                        continue;
                    }
                }
            }
            break result;
        };
        active.next_argmax = self.settle_prefill(&active, result)?;
        active.timings.prefill_seconds = since(t0);
        Ok(active)
    }

    /// `begin` for sessions that return results asynchronously (WebGPU in a browser); the same
    /// generation, awaiting the forward pass instead of blocking on it.
    pub async fn begin_async(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
    ) -> Result<ActiveGeneration> {
        let mut active = self.prepare(prompt, options, None)?;
        let t0 = now();
        let mut fell_back = false;
        let result = loop {
            let fresh = &active.ids[active.timings.cached_tokens..];
            let result = match active.constraint.as_mut().filter(|_| active.masked_argmax) {
                Some(constraint) => self
                    .session
                    .forward_argmax_masked_async(&self.model, fresh, constraint)
                    .await
                    .and_then(allowed_token),
                None => {
                    self.session
                        .forward_last_async(
                            &self.model,
                            fresh,
                            active.argmax_only,
                            &mut active.logits,
                        )
                        .await
                }
            };
            if let Err(e) = &result {
                if !fell_back {
                    if let Some(change) = self.fall_back(e, 0)? {
                        active.backend_change = Some(change);
                        fell_back = true;
                        continue;
                    }
                }
            }
            break result;
        };
        active.next_argmax = self.settle_prefill(&active, result)?;
        active.timings.prefill_seconds = since(t0);
        Ok(active)
    }

    /// Books a prefill's outcome in the cache: the prompt is cached, or (after an error) nothing.
    fn settle_prefill(&mut self, active: &ActiveGeneration, result: Result<u32>) -> Result<u32> {
        match result {
            Ok(next) => {
                self.cached.truncate(active.timings.cached_tokens);
                self.cached
                    .extend_from_slice(&active.ids[active.timings.cached_tokens..]);
                Ok(next)
            }
            Err(e) => {
                self.reset_cache();
                Err(e)
            }
        }
    }

    /// `begin` up to the prompt's forward pass: encodes and checks the prompt, makes the sampler.
    fn prepare(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        compiled: Option<Constraint>,
    ) -> Result<ActiveGeneration> {
        // Whatever happens below, the previous generation's cache is about to be overwritten.
        self.session_owner = new_session_owner();
        let prompt_ids = self.encode(prompt)?;
        if prompt_ids.is_empty() {
            return Err(LeanError::InvalidArgument("the prompt is empty".into()));
        }
        let ctx = self.session.context_length();
        if prompt_ids.len() >= ctx {
            return Err(LeanError::PromptTooLong {
                prompt_tokens: prompt_ids.len(),
                context_length: ctx,
            });
        }
        let sampler = Sampler::new(options.sampling.clone())?;
        let stop_ids = options
            .stop_token_ids
            .clone()
            .unwrap_or_else(|| self.tokenizer.eos_token_ids());
        let constraint = match (compiled, &options.constraint) {
            (Some(compiled), _) => {
                let vocab = compiled.vocabulary();
                if vocab.len() != self.model.config.vocab_size || vocab.stop_ids() != stop_ids {
                    return Err(LeanError::InvalidArgument(format!(
                        "the constraint was compiled for {} tokens ending with {:?}, this \
                         generation has {} ending with {:?}",
                        vocab.len(),
                        vocab.stop_ids(),
                        self.model.config.vocab_size,
                        stop_ids
                    )));
                }
                Some(compiled)
            }
            (None, Some(spec)) => Some(self.compile_constraint(spec, &stop_ids)?),
            (None, None) => None,
        };
        // Plain greedy decoding needs only the argmax: a GPU session then reads back 4 bytes
        // per token instead of the logits. Greedy under a constraint needs only the argmax over
        // the allowed tokens: the session takes the mask (a GPU computes it while the pass runs
        // and takes the masked argmax on the device, 4 bytes again). Sampling under a
        // constraint still reads the logits back: the warpers and the draw need the whole
        // allowed distribution.
        let greedy = sampler.params().is_greedy() && sampler.params().repetition_penalty == 1.0;
        let argmax_only = greedy && constraint.is_none();
        let masked_argmax = greedy && constraint.is_some();
        let drafter = match &options.speculation {
            None => None,
            Some(spec) => {
                match *spec {
                    Speculation::Lookup {
                        max_ngram,
                        max_draft,
                        ..
                    } if max_draft == 0 || max_ngram == 0 => {
                        return Err(LeanError::InvalidArgument(
                            "prompt lookup needs drafts and n-grams of at least one token".into(),
                        ));
                    }
                    Speculation::DraftModel { max_draft: 0, .. } => {
                        return Err(LeanError::InvalidArgument(
                            "a draft model needs drafts of at least one token".into(),
                        ));
                    }
                    Speculation::DraftModel { .. } if self.draft.is_none() => {
                        return Err(LeanError::InvalidArgument(
                            "speculation by a draft model needs one: load it first \
                             (Engine::set_draft_model, lean-cli --draft FILE)"
                                .into(),
                        ));
                    }
                    _ => {}
                }
                Some(Drafter::new(spec))
            }
        };
        // The cache is only trusted while it and the session agree on its length.
        if self.cached.len() != self.session.position() {
            self.cached.clear();
            self.session.truncate(0);
        }
        let reused = self.reusable_prefix(&prompt_ids);
        self.cached.truncate(reused);
        self.session.truncate(reused);
        let timings = Timings {
            cached_tokens: reused,
            ..Timings::default()
        };
        Ok(ActiveGeneration {
            session_owner: self.session_owner,
            prompt_len: prompt_ids.len(),
            ids: prompt_ids,
            text: String::new(),
            max_tokens: options.max_tokens,
            stop_ids,
            sampler,
            constraint,
            argmax_only,
            masked_argmax,
            logits: vec![0f32; self.model.config.vocab_size],
            next_argmax: 0,
            pending_forward: None,
            drafter,
            confirmed: VecDeque::new(),
            decided: false,
            pass_logits: Vec::new(),
            pass_masks: Vec::new(),
            decoder: StreamDecoder::new(true),
            finish_reason: None,
            timings,
            backend_change: None,
        })
    }

    /// Compiles `spec` against this engine's vocabulary with `stop_ids` as the tokens that end
    /// the output. The vocabulary's byte map and trie are built on first use and kept. A schema,
    /// regex or grammar the constraint library rejects is an `InvalidArgument` naming the problem.
    pub fn compile_constraint(
        &mut self,
        spec: &ConstraintSpec,
        stop_ids: &[u32],
    ) -> Result<Constraint> {
        let vocab = match &self.constraint_vocab {
            Some(v) if v.stop_ids() == stop_ids => v.clone(),
            _ => {
                let v = Arc::new(
                    Vocabulary::new(&self.tokenizer, self.model.config.vocab_size, stop_ids)
                        .map_err(constraint_error)?,
                );
                self.constraint_vocab = Some(v.clone());
                v
            }
        };
        Constraint::new(&vocab, spec).map_err(constraint_error)
    }

    /// Produces the next token of `active`: runs the previous token through the model, samples,
    /// and streams the token's text. `Step::finished` says when the generation is over (then
    /// call [`Engine::finish`]); a step after that, or after a failed step, or once a later
    /// `begin` took the session, is an error.
    pub fn step(&mut self, active: &mut ActiveGeneration) -> Result<Step> {
        self.check_step(active)?;
        let t0 = now();
        let mut result = Ok(());
        if let Some(id) = active.pending_forward.take() {
            result = if let Some(next) = active.confirmed.pop_front() {
                active.next_argmax = next;
                active.decided = true;
                Ok(())
            } else {
                match self.step_forward(active, id) {
                    Err(e) => match self.fall_back(&e, active.token_ids().len()) {
                        Ok(Some(change)) => {
                            active.backend_change = Some(change);
                            self.step_forward(active, id)
                        }
                        Ok(None) => Err(e),
                        Err(fallback) => Err(fallback),
                    },
                    ok => ok,
                }
            };
        }
        let step = result.and_then(|()| self.sample_next(active));
        self.settle(active, t0, step)
    }

    /// The forward pass of a step that runs one (`id`, the last generated token; with a guess
    /// after it when speculating); on failure nothing is booked, so it can run again.
    fn step_forward(&mut self, active: &mut ActiveGeneration, id: u32) -> Result<()> {
        let t0 = now();
        match self.speculation_pass(active, id)? {
            Some(pass) => {
                let verified = if active.argmax_only {
                    self.session
                        .forward_argmax_all(&self.model, &pass)
                        .map(Some)
                } else if active.masked_argmax {
                    let masks = &active.pass_masks;
                    self.session
                        .forward_argmax_all_masked(&self.model, &pass, masks)
                        .and_then(allowed_tokens)
                } else {
                    let rows = &mut active.pass_logits;
                    self.session
                        .forward_logits_all(&self.model, &pass, rows)
                        .map(|()| None)
                };
                self.settle_verification(active, &pass, verified, since(t0))
            }
            None => if active.argmax_only {
                let ahead = active.plain_steps_ahead();
                self.session.decode_argmax(&self.model, id, ahead)
            } else if let Some(constraint) =
                active.constraint.as_mut().filter(|_| active.masked_argmax)
            {
                self.session
                    .forward_argmax_masked(&self.model, &[id], constraint)
                    .and_then(allowed_token)
            } else {
                self.session
                    .forward_last(&self.model, &[id], false, &mut active.logits)
            }
            .map(|next| {
                active.next_argmax = next;
                self.cached.push(id);
                active.record_plain(since(t0));
            }),
        }
    }

    /// The tokens of a speculative step's batched pass: the last generated token `id`, then a
    /// guess of the ones after it. `None` when the generation does not speculate or the drafter
    /// has no guess (a plain step then). A draft model guesses synchronously, also in
    /// `step_async`.
    fn speculation_pass(
        &mut self,
        active: &mut ActiveGeneration,
        id: u32,
    ) -> Result<Option<Vec<u32>>> {
        let Some(drafter) = active.drafter.as_ref().filter(|d| !d.paused()) else {
            return Ok(None);
        };
        // Guesses past max_tokens or the context would be wasted work: the step that emits the
        // model's own next token needs one of each.
        let room_in_output = active
            .max_tokens
            .saturating_sub(active.token_ids().len() + 1);
        let room_in_cache = self.session.context_length() - self.session.position() - 1;
        let limit = room_in_output.min(room_in_cache);
        let mut draft = if drafter.uses_draft_model() {
            let draft_model = self.draft.as_mut().expect("checked in prepare");
            let vocab = self.model.config.vocab_size;
            let length = drafter.next_length(limit);
            draft_model.propose(&active.ids, length, vocab, active.constraint.as_mut())?
        } else {
            drafter.draft(&active.ids, active.token_ids().len(), limit)
        };
        // Under a constraint only the part of the guess it allows is worth a row: the rest
        // could never be chosen. Its masks are the rows' masks in the verification.
        if let Some(constraint) = &mut active.constraint {
            let allowed = constraint
                .masks_along(&draft, &mut active.pass_masks)
                .map_err(constraint_error)?;
            draft.truncate(allowed);
        }
        if draft.is_empty() {
            return Ok(None);
        }
        let mut pass = Vec::with_capacity(1 + draft.len());
        pass.push(id);
        pass.extend_from_slice(&draft);
        Ok(Some(pass))
    }

    /// Books a verification pass over `pass` (the last token, then the guess), given the
    /// model's argmaxes for its rows (greedy; under a constraint, each row's masked argmax), or
    /// `None` when its logits are in `active.pass_logits` (sampling): the guess's accepted
    /// prefix stays in the cache and comes out of the next steps, followed by the token the
    /// model chose after it; the rest of the pass is rolled back.
    fn settle_verification(
        &mut self,
        active: &mut ActiveGeneration,
        pass: &[u32],
        verified: Result<Option<Vec<u32>>>,
        seconds: f64,
    ) -> Result<()> {
        let draft = &pass[1..];
        let decided = match verified? {
            Some(argmaxes) => argmaxes[..=accepted_prefix(draft, &argmaxes)].to_vec(),
            None => {
                if active.constraint.is_some() {
                    self.mask_pass(active);
                }
                self.sample_verified(active, draft)
            }
        };
        let accepted = decided.len() - 1;
        let start = self.session.position() - pass.len();
        self.session.truncate(start + 1 + accepted);
        self.cached.extend_from_slice(&pass[..1 + accepted]);
        active.next_argmax = decided[0];
        active.decided = true;
        active.confirmed.extend(&decided[1..]);
        let drafter = active
            .drafter
            .as_mut()
            .expect("a speculative step has a drafter");
        drafter.record(draft.len(), accepted, seconds);
        active.timings.speculation = drafter.stats;
        Ok(())
    }

    /// Sampling under a constraint: each row of the pass keeps only the tokens its mask allows,
    /// as a plain constrained step masks its logits before the draw.
    fn mask_pass(&self, active: &mut ActiveGeneration) {
        let vocab = self.model.config.vocab_size;
        let rows = active.pass_logits.chunks_exact_mut(vocab);
        let masks = active
            .pass_masks
            .chunks_exact(lean_constraint::mask_words(vocab));
        for (row, mask) in rows.zip(masks) {
            crate::sampling::apply_mask(row, mask);
        }
    }

    /// Speculative sampling over a verification pass's logits: each guessed token is accepted
    /// with its probability (`Sampler::sample_guess`); the first one refused is replaced by a draw
    /// without it, and when all are accepted the last row gives one more token. Returns the
    /// accepted guesses and that token.
    fn sample_verified(&self, active: &mut ActiveGeneration, draft: &[u32]) -> Vec<u32> {
        let vocab = self.model.config.vocab_size;
        let before = active.ids.len();
        let mut decided = Vec::with_capacity(draft.len() + 1);
        for (i, row) in active.pass_logits.chunks_exact_mut(vocab).enumerate() {
            let Some(&guess) = draft.get(i) else {
                decided.push(active.sampler.sample(row, &active.ids));
                break;
            };
            let (id, accepted) = active.sampler.sample_guess(row, &active.ids, guess);
            decided.push(id);
            if !accepted {
                break;
            }
            // The next row's repetition penalty sees the accepted guess.
            active.ids.push(id);
        }
        active.ids.truncate(before);
        decided
    }

    /// `step` for sessions that return results asynchronously (see `begin_async`).
    pub async fn step_async(&mut self, active: &mut ActiveGeneration) -> Result<Step> {
        self.check_step(active)?;
        let t0 = now();
        let mut result = Ok(());
        if let Some(id) = active.pending_forward.take() {
            result = if let Some(next) = active.confirmed.pop_front() {
                active.next_argmax = next;
                active.decided = true;
                Ok(())
            } else {
                match self.step_forward_async(active, id).await {
                    Err(e) => match self.fall_back(&e, active.token_ids().len()) {
                        Ok(Some(change)) => {
                            active.backend_change = Some(change);
                            self.step_forward_async(active, id).await
                        }
                        Ok(None) => Err(e),
                        Err(fallback) => Err(fallback),
                    },
                    ok => ok,
                }
            };
        }
        let step = result.and_then(|()| self.sample_next(active));
        self.settle(active, t0, step)
    }

    /// `step_forward` awaiting the session.
    async fn step_forward_async(&mut self, active: &mut ActiveGeneration, id: u32) -> Result<()> {
        let tokens = [id];
        let t0 = now();
        match self.speculation_pass(active, id)? {
            Some(pass) => {
                let verified = if active.argmax_only {
                    let argmaxes = self.session.forward_argmax_all_async(&self.model, &pass);
                    argmaxes.await.map(Some)
                } else if active.masked_argmax {
                    let masks = &active.pass_masks;
                    let argmaxes =
                        self.session
                            .forward_argmax_all_masked_async(&self.model, &pass, masks);
                    argmaxes.await.and_then(allowed_tokens)
                } else {
                    let rows = &mut active.pass_logits;
                    let logits = self
                        .session
                        .forward_logits_all_async(&self.model, &pass, rows);
                    logits.await.map(|()| None)
                };
                self.settle_verification(active, &pass, verified, since(t0))
            }
            None => if active.argmax_only {
                let ahead = active.plain_steps_ahead();
                self.session
                    .decode_argmax_async(&self.model, id, ahead)
                    .await
            } else if let Some(constraint) =
                active.constraint.as_mut().filter(|_| active.masked_argmax)
            {
                self.session
                    .forward_argmax_masked_async(&self.model, &tokens, constraint)
                    .await
                    .and_then(allowed_token)
            } else {
                self.session
                    .forward_last_async(&self.model, &tokens, false, &mut active.logits)
                    .await
            }
            .map(|next| {
                active.next_argmax = next;
                self.cached.push(id);
                active.record_plain(since(t0));
            }),
        }
    }

    fn check_step(&self, active: &ActiveGeneration) -> Result<()> {
        if let Some(reason) = active.finish_reason {
            return Err(LeanError::InvalidArgument(format!(
                "the generation is over ({}): call finish, then begin a new one",
                reason.as_str()
            )));
        }
        if active.session_owner != self.session_owner {
            return Err(LeanError::InvalidArgument(
                "this generation can no longer continue (a step of it failed, or a later begin \
                 or logits_all reused the session): begin a new one"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Books a step's time; a failed step ends the generation (its cache and ids may disagree,
    /// so the cache is forgotten).
    fn settle(
        &mut self,
        active: &mut ActiveGeneration,
        t0: Option<f64>,
        step: Result<Step>,
    ) -> Result<Step> {
        active.timings.decode_seconds += since(t0);
        if step.is_err() {
            active.session_owner = NO_SESSION_OWNER;
            self.reset_cache();
        }
        step
    }

    /// After the forward pass of a step: samples the next token, checks the stop conditions and
    /// streams the token's text.
    fn sample_next(&mut self, active: &mut ActiveGeneration) -> Result<Step> {
        if active.token_ids().len() >= active.max_tokens {
            return Ok(active.end(None, FinishReason::Length));
        }
        let decided = std::mem::take(&mut active.decided);
        let id = if active.argmax_only || active.masked_argmax || decided {
            active.next_argmax
        } else {
            if let Some(constraint) = &mut active.constraint {
                let mask = constraint.mask().map_err(constraint_error)?;
                crate::sampling::apply_mask(&mut active.logits, mask);
            }
            active.sampler.sample(&mut active.logits, &active.ids)
        };
        active.ids.push(id);
        if active.stop_ids.contains(&id) {
            return Ok(active.end(None, FinishReason::Stop));
        }
        let mut complete = false;
        if let Some(constraint) = &mut active.constraint {
            constraint.accept(id).map_err(constraint_error)?;
            complete = constraint.is_complete();
        }
        let text = active
            .decoder
            .push(&self.tokenizer, id)?
            .unwrap_or_default();
        active.text.push_str(&text);
        let token = Some(TokenEvent { id, text });
        // Decided now rather than in the next step, so the caller learns it with the last token.
        if complete {
            // Nothing may follow: the constrained output is finished (no stop token generated).
            return Ok(active.end(token, FinishReason::Stop));
        }
        if active.token_ids().len() >= active.max_tokens {
            return Ok(active.end(token, FinishReason::Length));
        }
        // The position this token's pass takes: confirmed tokens are cached ahead of it.
        if self.session.position() - active.confirmed.len() >= self.session.context_length() {
            return Ok(active.end(token, FinishReason::ContextFull));
        }
        active.pending_forward = Some(id);
        Ok(Step {
            token,
            finished: None,
        })
    }

    /// Ends `active`: the reason a step reported, or `Cancelled` when none did. The text the
    /// stream decoder still held back comes out as one more event (with the last generated id).
    pub fn finish(&self, active: ActiveGeneration) -> Result<Ended> {
        let mut active = active;
        let t0 = now();
        let rest = active.decoder.finish(&self.tokenizer)?;
        let held_back = (!rest.is_empty()).then(|| {
            active.text.push_str(&rest);
            TokenEvent {
                id: active.ids[active.prompt_len..].last().copied().unwrap_or(0),
                text: rest,
            }
        });
        let mut timings = active.timings;
        timings.decode_seconds += since(t0);
        timings.prompt_tokens = active.prompt_len;
        timings.generated_tokens = active.ids.len() - active.prompt_len;
        let token_ids = active.ids.split_off(active.prompt_len);
        Ok(Ended {
            held_back,
            generation: Generation {
                prompt_ids: active.ids,
                token_ids,
                text: active.text,
                finish_reason: active.finish_reason.unwrap_or(FinishReason::Cancelled),
                timings,
                backend_change: active.backend_change,
            },
        })
    }
}

/// What one [`Engine::step`] produced.
#[derive(Clone, Debug)]
pub struct Step {
    /// The generated token and the text it completes; `None` when the step generated a stop
    /// token (which is in the ids but not streamed) or nothing (`max_tokens` reached).
    pub token: Option<TokenEvent>,
    /// Set when the generation is over; then call [`Engine::finish`].
    pub finished: Option<FinishReason>,
}

/// What [`Engine::finish`] returns.
#[derive(Clone, Debug)]
pub struct Ended {
    /// The text the stream decoder held back to the end (an incomplete character, written as
    /// U+FFFD like `decode` does), with the last generated id; `None` when there was none.
    pub held_back: Option<TokenEvent>,
    pub generation: Generation,
}

/// A generation between [`Engine::begin`] and [`Engine::finish`]: everything its loop keeps from
/// one token to the next, owned, so that a caller can resume it later (e.g. a Web Worker between
/// two turns of its event loop). The KV cache stays in the engine's session.
pub struct ActiveGeneration {
    /// Which `begin` of the engine this is; steps check it against the session's current owner.
    session_owner: u64,
    prompt_len: usize,
    /// The prompt, then the generated ids (the repetition penalty looks at all of them).
    ids: Vec<u32>,
    text: String,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    sampler: Sampler,
    /// The constraint being followed, if any (its mask is applied before sampling).
    constraint: Option<Constraint>,
    argmax_only: bool,
    /// Greedy under the constraint: the session takes the argmax over the allowed tokens
    /// (`Session::forward_argmax_masked`), so no logits come to the host.
    masked_argmax: bool,
    /// The last forward's output: its logits, or only their argmax when that is all sampling needs.
    logits: Vec<f32>,
    next_argmax: u32,
    /// The last generated id, still to run through the model before the next sample.
    pending_forward: Option<u32>,
    /// Speculative decoding's guesses, when the generation speculates.
    drafter: Option<Drafter>,
    /// Guessed tokens a verification pass confirmed, then the model's own token after them: the
    /// next steps' tokens, in order. Their keys and values are cached already (the last one's
    /// excepted), so those steps run no forward pass.
    confirmed: VecDeque<u32>,
    /// `next_argmax` holds a token a verification pass decided (sampled or not): the next
    /// `sample_next` takes it as it is.
    decided: bool,
    /// A sampled or constrained verification pass's logits, one row per token of the pass.
    pass_logits: Vec<f32>,
    /// Under a constraint, the mask each row of a verification pass meets: the constraint's
    /// now, then after each guessed token (`Constraint::masks_along`).
    pass_masks: Vec<u32>,
    decoder: StreamDecoder,
    finish_reason: Option<FinishReason>,
    timings: Timings,
    /// Set when the device was lost during this generation and it continued on the CPU.
    backend_change: Option<BackendChange>,
}

impl ActiveGeneration {
    /// Books a step that ran without a guess with the drafter, if speculating.
    fn record_plain(&mut self, seconds: f64) {
        if let Some(drafter) = &mut self.drafter {
            drafter.record_plain(seconds);
            self.timings.speculation = drafter.stats;
        }
    }

    pub fn prompt_ids(&self) -> &[u32] {
        &self.ids[..self.prompt_len]
    }

    /// Prompt ids taken from the KV cache (the prefill ran the rest).
    pub fn cached_tokens(&self) -> usize {
        self.timings.cached_tokens
    }

    /// The ids generated so far (a stop id included).
    pub fn token_ids(&self) -> &[u32] {
        &self.ids[self.prompt_len..]
    }

    /// Set once the device was lost during this generation and it continued on the CPU.
    pub fn backend_change(&self) -> Option<&BackendChange> {
        self.backend_change.as_ref()
    }

    /// Set once a step reported the end.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish_reason
    }

    /// Whether a token after the one being computed may still be generated (else there is no
    /// point in a session queueing its pass ahead).
    /// How many tokens `max_tokens` allows after the one being computed.
    fn tokens_after_next(&self) -> usize {
        self.max_tokens.saturating_sub(self.token_ids().len() + 1)
    }

    /// How many plain steps probably follow the next one, which a session may queue ahead: all
    /// the tokens left without speculation; with it, the drafter's
    /// `passes_to_queue_after_this` (a verification pass discards passes queued past it).
    fn plain_steps_ahead(&self) -> usize {
        let after_next = self.tokens_after_next();
        match &self.drafter {
            None => after_next,
            Some(drafter) => drafter.passes_to_queue_after_this().min(after_next),
        }
    }

    fn end(&mut self, token: Option<TokenEvent>, reason: FinishReason) -> Step {
        self.finish_reason = Some(reason);
        Step {
            token,
            finished: Some(reason),
        }
    }
}

/// No generation owns a session with this id (a fresh engine's, or after `logits_all`), and a
/// failed generation takes it so that its steps stop.
const NO_SESSION_OWNER: u64 = 0;

/// Ids of `begin` calls, unique across engines, so that a generation cannot step on the session
/// of another engine either.
fn new_session_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(NO_SESSION_OWNER + 1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn constraint_error(e: lean_constraint::ConstraintError) -> LeanError {
    LeanError::InvalidArgument(e.0)
}

/// A constraint's allowed tokens, for a session's masked argmax.
impl TokenMask for Constraint {
    fn allowed(&mut self) -> Result<&[u32]> {
        self.mask().map_err(constraint_error)
    }
}

/// A constrained verification pass's masked argmaxes (see `allowed_token`), for
/// `settle_verification`.
fn allowed_tokens(ids: Vec<Option<u32>>) -> Result<Option<Vec<u32>>> {
    ids.into_iter()
        .map(allowed_token)
        .collect::<Result<_>>()
        .map(Some)
}

/// The id a masked argmax chose; none allowed (a mask of ids the logits do not have: the
/// constraint itself refuses an empty mask) is an error.
fn allowed_token(id: Option<u32>) -> Result<u32> {
    id.ok_or_else(|| {
        LeanError::InvalidArgument("the constraint allows no token of the vocabulary here".into())
    })
}
