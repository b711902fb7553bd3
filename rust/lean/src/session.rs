//! The seam between the engine and a compute backend: a [`Session`] holds one conversation's
//! state on a device (KV cache, scratch, position) and runs tokens through the model. The CPU
//! backend (`cpu::CpuSession`) and the GPU backend (crate `lean-gpu`) implement it; the engine's
//! generation loop and sampling do not know which one runs.
use crate::error::Result;
use crate::model::Model;
use crate::sampling::{argmax, argmax_masked};
use std::future::Future;
use std::pin::Pin;

/// `Send` natively. In a browser a session may hold WebGPU objects, which are JS objects bound
/// to their thread: there it asks nothing.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + ?Sized> MaybeSend for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSend for T {}

/// The future of an asynchronous forward pass (`Session::forward_last_async`).
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Which positions of a forward pass need logits.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's (teacher-forced evaluation).
    All,
}

/// The tokens a constrained step may choose (a JSON schema's, a grammar's): a bitset over the
/// vocabulary, bit `i % 32` of word `i / 32` for token `i`, ids past its end disallowed.
/// [`Session::forward_argmax_masked`] asks for it once the step's forward pass is under way, so
/// that a session whose device computes on its own (a GPU) overlaps the two. The engine's
/// constraint implements it; a fixed mask (`Vec<u32>`, `&[u32]`) does too.
pub trait TokenMask {
    fn allowed(&mut self) -> Result<&[u32]>;
}

impl TokenMask for Vec<u32> {
    fn allowed(&mut self) -> Result<&[u32]> {
        Ok(self)
    }
}

impl TokenMask for &[u32] {
    fn allowed(&mut self) -> Result<&[u32]> {
        Ok(self)
    }
}

pub trait Session: MaybeSend {
    /// One line for logs, e.g. "cpu (avx512, 2 threads)".
    fn describe(&self) -> String;
    /// Positions the KV cache holds.
    fn context_length(&self) -> usize;
    /// Tokens in the cache.
    fn position(&self) -> usize;
    fn kv_bytes(&self) -> usize;
    /// Forgets cached positions from `pos` on (e.g. 0 for a new conversation).
    fn truncate(&mut self, pos: usize);
    /// Runs `tokens` through the model after the cached positions. Calls `on_logits(i, logits)`
    /// for the last token (or every token with `Logits::All`), i = index in `tokens`.
    fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        on_logits: &mut (dyn FnMut(usize, &[f32]) + Send),
    ) -> Result<()>;
    /// Runs `tokens` and returns the argmax of the last token's logits (greedy decoding). A GPU
    /// backend overrides it to read back only the id instead of the whole logits row.
    fn forward_argmax(&mut self, model: &Model, tokens: &[u32]) -> Result<u32> {
        let mut id = 0;
        self.forward(model, tokens, Logits::Last, &mut |_, l| id = argmax(l))?;
        Ok(id)
    }

    /// Greedy decoding under a constraint: runs `tokens`, asks `mask` for the allowed tokens and
    /// returns the argmax of the last token's logits over them (`sampling::argmax_masked`: the
    /// first on ties; `None` when no token is allowed). A GPU backend overrides it to compute
    /// the mask while the device runs the pass, then upload it and take the masked argmax on
    /// the device: 4 bytes come back instead of the logits. The default computes the mask first
    /// (a CPU's forward pass keeps every core busy) and never copies the logits.
    fn forward_argmax_masked(
        &mut self,
        model: &Model,
        tokens: &[u32],
        mask: &mut dyn TokenMask,
    ) -> Result<Option<u32>> {
        let allowed = mask.allowed()?;
        let mut id = None;
        self.forward(model, tokens, Logits::Last, &mut |_, l| {
            id = argmax_masked(l, allowed)
        })?;
        Ok(id)
    }

    /// `forward_argmax_masked` without blocking (see `forward_last_async`).
    fn forward_argmax_masked_async<'a>(
        &'a mut self,
        model: &'a Model,
        tokens: &'a [u32],
        mask: &'a mut dyn TokenMask,
    ) -> LocalFuture<'a, Result<Option<u32>>> {
        let result = self.forward_argmax_masked(model, tokens, mask);
        Box::pin(std::future::ready(result))
    }

    /// Bytes this session has read back from its device so far (logits, argmax ids): 0 for a
    /// backend that computes in host memory. Tests check with it what a token costs.
    fn bytes_read(&self) -> u64 {
        0
    }

    /// Runs `tokens` and returns the argmax of every token's logits: speculative decoding's
    /// verification pass (the last generated token, then the guessed ones). A GPU backend may
    /// override it to take the argmaxes on the device.
    fn forward_argmax_all(&mut self, model: &Model, tokens: &[u32]) -> Result<Vec<u32>> {
        let mut ids = vec![0; tokens.len()];
        self.forward(model, tokens, Logits::All, &mut |i, l| ids[i] = argmax(l))?;
        Ok(ids)
    }

    /// Greedy decoding's verification pass under a constraint: runs `tokens` and returns each
    /// token's argmax among the tokens its own mask allows (`masks`: one mask of
    /// `lean_constraint::mask_words(vocab)` words per token, one after another;
    /// `sampling::argmax_masked`, `None` where none is allowed). A GPU backend overrides it to
    /// take the masked argmaxes on the device.
    fn forward_argmax_all_masked(
        &mut self,
        model: &Model,
        tokens: &[u32],
        masks: &[u32],
    ) -> Result<Vec<Option<u32>>> {
        let words = lean_constraint::mask_words(model.config.vocab_size);
        check_masks(masks.len(), tokens.len(), words)?;
        let mut ids = vec![None; tokens.len()];
        self.forward(model, tokens, Logits::All, &mut |i, l| {
            ids[i] = argmax_masked(l, &masks[i * words..(i + 1) * words])
        })?;
        Ok(ids)
    }

    /// `forward_argmax_all_masked` without blocking (see `forward_last_async`).
    fn forward_argmax_all_masked_async<'a>(
        &'a mut self,
        model: &'a Model,
        tokens: &'a [u32],
        masks: &'a [u32],
    ) -> LocalFuture<'a, Result<Vec<Option<u32>>>> {
        let result = self.forward_argmax_all_masked(model, tokens, masks);
        Box::pin(std::future::ready(result))
    }

    /// Runs `tokens` and leaves every token's logits in `rows`, one row after another (speculative
    /// sampling's verification pass).
    fn forward_logits_all(
        &mut self,
        model: &Model,
        tokens: &[u32],
        rows: &mut Vec<f32>,
    ) -> Result<()> {
        let vocab = model.config.vocab_size;
        rows.resize(tokens.len() * vocab, 0.0);
        self.forward(model, tokens, Logits::All, &mut |i, l| {
            rows[i * vocab..(i + 1) * vocab].copy_from_slice(l)
        })
    }

    /// `forward_logits_all` without blocking (see `forward_last_async`).
    fn forward_logits_all_async<'a>(
        &'a mut self,
        model: &'a Model,
        tokens: &'a [u32],
        rows: &'a mut Vec<f32>,
    ) -> LocalFuture<'a, Result<()>> {
        let result = self.forward_logits_all(model, tokens, rows);
        Box::pin(std::future::ready(result))
    }

    /// `forward_argmax_all` without blocking (see `forward_last_async`).
    fn forward_argmax_all_async<'a>(
        &'a mut self,
        model: &'a Model,
        tokens: &'a [u32],
    ) -> LocalFuture<'a, Result<Vec<u32>>> {
        let result = self.forward_argmax_all(model, tokens);
        Box::pin(std::future::ready(result))
    }

    /// The generation loop's forward pass: runs `tokens`, then returns the argmax of the last
    /// token's logits (`argmax_only`), or copies those logits into `logits` and returns 0.
    fn forward_last(
        &mut self,
        model: &Model,
        tokens: &[u32],
        argmax_only: bool,
        logits: &mut [f32],
    ) -> Result<u32> {
        if argmax_only {
            return self.forward_argmax(model, tokens);
        }
        self.forward(model, tokens, Logits::Last, &mut |_, l| {
            logits.copy_from_slice(l)
        })?;
        Ok(0)
    }

    /// Greedy decoding of one token: runs `token` and returns the argmax of its logits. With
    /// `ahead` > 0 the caller says it will probably run that many more passes, each on the
    /// argmax of the one before: a session may queue some of them before returning (a GPU then
    /// computes while the caller streams this token, and a browser gets several ids per wait).
    /// A call for the returned token finds its pass under way; any other call discards the
    /// queued passes, and `position` does not count them. By default `forward_argmax`.
    fn decode_argmax(&mut self, model: &Model, token: u32, ahead: usize) -> Result<u32> {
        let _ = ahead;
        self.forward_argmax(model, &[token])
    }

    /// `decode_argmax` without blocking (see `forward_last_async`).
    fn decode_argmax_async<'a>(
        &'a mut self,
        model: &'a Model,
        token: u32,
        ahead: usize,
    ) -> LocalFuture<'a, Result<u32>> {
        let result = self.decode_argmax(model, token, ahead);
        Box::pin(std::future::ready(result))
    }

    /// `forward_last` without blocking: a session whose results come back asynchronously (the
    /// GPU in a browser, where waiting would stall the event loop that delivers them) overrides
    /// it. The default runs the synchronous one.
    fn forward_last_async<'a>(
        &'a mut self,
        model: &'a Model,
        tokens: &'a [u32],
        argmax_only: bool,
        logits: &'a mut [f32],
    ) -> LocalFuture<'a, Result<u32>> {
        let result = self.forward_last(model, tokens, argmax_only, logits);
        Box::pin(std::future::ready(result))
    }
}

/// A verification pass under a constraint needs a mask of `words` words per token.
pub fn check_masks(len: usize, tokens: usize, words: usize) -> Result<()> {
    if len == tokens * words {
        return Ok(());
    }
    Err(crate::error::LeanError::InvalidArgument(format!(
        "{len} mask words for {tokens} tokens: a mask of {words} words a token"
    )))
}
