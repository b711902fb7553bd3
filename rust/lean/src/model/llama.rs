//! `llama` (SmolLM2): pre-norm decoder, RMSNorm, GQA attention without biases, SwiGLU MLP.
//!
//! The GGUF converter permutes the rows of attn_q/attn_k so that rotary pairs are adjacent
//! (2i, 2i+1); applying that "interleaved" rotation to the permuted weights is the same arithmetic
//! as HF's rotate_half on the original weights (see `RopeStyle::Interleaved`).
use super::weights::{Loader, Weights};
use crate::error::Result;

pub(crate) fn load(l: &Loader) -> Result<Weights> {
    let layers = (0..l.config.n_layers)
        .map(|i| l.layer(i, false))
        .collect::<Result<Vec<_>>>()?;
    l.weights(layers)
}
