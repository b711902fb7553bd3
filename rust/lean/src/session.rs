//! The seam between the engine and a compute backend: a [`Session`] holds one conversation's
//! state on a device (KV cache, scratch, position) and runs tokens through the model. The CPU
//! backend (`cpu::CpuSession`) and the GPU backend (crate `lean-gpu`) implement it; the engine's
//! generation loop and sampling do not know which one runs.
use crate::error::Result;
use crate::model::Model;
use crate::sampling::argmax;

/// Which positions of a forward pass need logits.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's (teacher-forced evaluation).
    All,
}

pub trait Session: Send {
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
}
