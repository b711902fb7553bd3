//! `qwen3` (Qwen3 dense): the llama block without biases, plus an RMS norm over each head of q
//! and of k before the rotation (`attn_q_norm`, `attn_k_norm`, head_dim weights shared by the
//! heads); the head size is explicit (`attention.key_length`: 128 while d / heads is 64 for
//! 0.6B). Rotary embedding in rotate_half layout.
use crate::config::{Activation, Block, Description, Hyper, RopeStyle};
use crate::error::Result;

pub(crate) fn describe(h: &Hyper) -> Result<Description> {
    Ok(Description {
        block: Block {
            qkv_bias: false,
            qk_norm: true,
            post_norms: false,
            activation: Activation::Silu,
            embedding_scale: None,
            attention_scale: Hyper::inverse_sqrt(h.head_dim),
        },
        ropes: vec![h.rope(RopeStyle::Neox)?],
        layers: h.uniform_layers(),
    })
}
