//! `qwen2` (Qwen2, Qwen2.5): the llama block plus biases on the q, k and v projections; rotary
//! embedding in HF's rotate_half layout (the converter does not permute qwen2's rows).
use crate::config::{Activation, Block, Description, Hyper, RopeStyle};
use crate::error::Result;

pub(crate) fn describe(h: &Hyper) -> Result<Description> {
    Ok(Description {
        block: Block {
            qkv_bias: true,
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            embedding_scale: None,
            attention_scale: Hyper::inverse_sqrt(h.head_dim),
        },
        ropes: vec![h.rope(RopeStyle::Neox)?],
        layers: h.uniform_layers(),
    })
}
