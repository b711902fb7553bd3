//! `llama`: SmolLM2, Llama 2 and Llama 3.x. Pre-norm decoder, RMSNorm, GQA attention without
//! biases, SwiGLU feed-forward.
//!
//! The GGUF converter permutes the rows of attn_q/attn_k so that rotary pairs are adjacent
//! (2i, 2i+1); applying that "interleaved" rotation to the permuted weights is the same arithmetic
//! as HF's rotate_half on the original weights (see `RopeStyle::Interleaved`). Llama 3.1+'s
//! `rope_type: llama3` frequency scaling comes as `rope_freqs.weight`: one divisor per frequency,
//! computed by the converter from the HF config.
use crate::config::{Activation, Block, Description, Hyper, RopeStyle};
use crate::error::Result;

pub(crate) fn describe(h: &Hyper) -> Result<Description> {
    let mut rope = h.rope(RopeStyle::Interleaved)?;
    rope.freq_factors = h.vector_opt("rope_freqs.weight", rope.dim / 2)?;
    Ok(Description {
        block: Block {
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            embedding_scale: None,
            attention_scale: Hyper::inverse_sqrt(h.head_dim),
        },
        ropes: vec![rope],
        layers: h.uniform_layers(),
    })
}
