//! The engine: a model, its tokenizer and a backend session, and the generation loop
//! (prefill the prompt as one batch, then decode token by token until a stop condition).
use crate::cpu::{CpuSession, Logits};
use crate::error::{LeanError, Result};
use crate::model::Model;
use crate::sampling::{Sampler, SamplingParams};
use lean_tokenizer::{ChatMessage, StreamDecoder, Tokenizer};

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
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_token_ids: None,
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
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

impl Timings {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(1e-9)
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
}

pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    session: CpuSession,
}

/// Wall-clock seconds, where the platform has a clock (wasm32-unknown-unknown has none in std).
fn now() -> Option<std::time::Instant> {
    #[cfg(not(target_arch = "wasm32"))]
    return Some(std::time::Instant::now());
    #[cfg(target_arch = "wasm32")]
    return None;
}

fn since(t: Option<std::time::Instant>) -> f64 {
    t.map_or(0.0, |t| t.elapsed().as_secs_f64())
}

impl Engine {
    /// Checks that the tokenizer belongs to the model and sizes the KV cache for
    /// `context_length` positions (capped at the model's training context).
    pub fn new(model: Model, tokenizer: Tokenizer, context_length: usize) -> Result<Self> {
        tokenizer.check_vocab(&model.vocabulary()?)?;
        if context_length == 0 {
            return Err(LeanError::InvalidArgument(
                "the context length must be at least 1".into(),
            ));
        }
        let ctx = context_length.min(model.config.train_context_length.max(1));
        let session = CpuSession::new(&model, ctx);
        Ok(Engine {
            model,
            tokenizer,
            session,
        })
    }

    pub fn context_length(&self) -> usize {
        self.session.context_length()
    }

    pub fn kv_cache_bytes(&self) -> usize {
        self.session.kv_bytes()
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
        self.session.truncate(0);
        self.session
            .forward(&self.model, ids, Logits::All, on_logits)
    }

    /// Generates from `prompt`, calling `on_token` for every token; return `false` from it to stop.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        mut on_token: impl FnMut(&TokenEvent) -> bool,
    ) -> Result<Generation> {
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
        let mut sampler = Sampler::new(options.sampling.clone())?;
        let stop_ids = options
            .stop_token_ids
            .clone()
            .unwrap_or_else(|| self.tokenizer.eos_token_ids());
        let mut decoder = StreamDecoder::new(&self.tokenizer, true);
        let mut seen = prompt_ids.clone();
        let mut generated = Vec::new();
        let mut text = String::new();
        let mut timings = Timings {
            prompt_tokens: prompt_ids.len(),
            ..Default::default()
        };

        self.session.truncate(0);
        let mut logits = vec![0f32; self.model.config.vocab_size];
        let t0 = now();
        self.session
            .forward(&self.model, &prompt_ids, Logits::Last, |_, l| {
                logits.copy_from_slice(l)
            })?;
        timings.prefill_seconds = since(t0);

        let t1 = now();
        let finish = loop {
            if generated.len() >= options.max_tokens {
                break FinishReason::Length;
            }
            let id = sampler.sample(&mut logits, &seen);
            generated.push(id);
            seen.push(id);
            if stop_ids.contains(&id) {
                break FinishReason::Stop;
            }
            let piece = decoder.push(id)?.unwrap_or_default();
            text.push_str(&piece);
            if !on_token(&TokenEvent { id, text: piece }) {
                break FinishReason::Cancelled;
            }
            if generated.len() >= options.max_tokens {
                break FinishReason::Length;
            }
            if self.session.position() >= ctx {
                break FinishReason::ContextFull;
            }
            self.session
                .forward(&self.model, &[id], Logits::Last, |_, l| {
                    logits.copy_from_slice(l)
                })?;
        };
        let rest = decoder.finish()?;
        if !rest.is_empty() {
            text.push_str(&rest);
            on_token(&TokenEvent {
                id: *generated.last().unwrap_or(&0),
                text: rest,
            });
        }
        timings.decode_seconds = since(t1);
        timings.generated_tokens = generated.len();
        Ok(Generation {
            prompt_ids,
            token_ids: generated,
            text,
            finish_reason: finish,
            timings,
        })
    }
}
