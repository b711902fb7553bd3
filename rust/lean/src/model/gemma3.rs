//! `gemma3` (Gemma 3 text): embedding × √d; four RMS norms a layer (before and after the
//! attention, before and after the feed-forward: x += post(attn(pre(x)))); per-head q/k RMS
//! norms; GeGLU (`gelu_pytorch_tanh`); five sliding-window layers for each global one.
//!
//! Gemma's RMSNorm multiplies by (1 + w): the converter stores 1 + w, so the norms are plain.
//! Some hyper-parameters are implied by the architecture, not stored, and come from
//! transformers' Gemma 3 config as llama.cpp takes them: the 5:1 local/global pattern, the local
//! layers' rotary base (10,000, no scaling) and the query scale (query_pre_attn_scalar^-½:
//! head_dim, except 27B's d / heads).
use crate::config::{Activation, Block, Description, Hyper, Layer, Rope, RopeStyle};
use crate::error::{LeanError, Result};

/// Every sixth layer attends globally (transformers: `sliding_window_pattern` 6).
const GLOBAL_EVERY: usize = 6;
/// The local layers' rotary base (transformers: `rope_local_base_freq`).
const LOCAL_ROPE_BASE: f32 = 10_000.0;

pub(crate) fn describe(h: &Hyper) -> Result<Description> {
    let window = h.gguf.u32(&h.key("attention.sliding_window"))? as usize;
    if window == 0 {
        return Err(LeanError::Model(format!(
            "{} is 0: no position would be visible",
            h.key("attention.sliding_window")
        )));
    }
    // Gemma 3 27B (62 layers) scales queries by (d / heads)^-½ (query_pre_attn_scalar 168).
    let query_pre_attn_scalar = if h.n_layers == 62 {
        h.n_embd / h.n_heads
    } else {
        h.head_dim
    };
    let global = h.rope(RopeStyle::Neox)?;
    let local = Rope {
        base: LOCAL_ROPE_BASE,
        linear_factor: 1.0,
        ..global.clone()
    };
    let layers = (0..h.n_layers)
        .map(|i| match (i + 1) % GLOBAL_EVERY {
            0 => Layer {
                rope: 0,
                window: None,
            },
            _ => Layer {
                rope: 1,
                window: Some(window),
            },
        })
        .collect();
    Ok(Description {
        block: Block {
            qkv_bias: false,
            qk_norm: true,
            post_norms: true,
            activation: Activation::GeluTanh,
            // transformers: hidden_size ** 0.5 (a Python float) as a float32 tensor.
            embedding_scale: Some((h.n_embd as f64).sqrt() as f32),
            attention_scale: Hyper::inverse_sqrt(query_pre_attn_scalar),
        },
        ropes: vec![global, local],
        layers,
    })
}
