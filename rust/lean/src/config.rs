//! Hyper-parameters of a transformer, read from GGUF metadata.
use crate::error::{LeanError, Result};
use lean_gguf::Gguf;

/// Which architecture file describes the model.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama` (SmolLM2, Llama 2/3-style without rope frequency factors).
    Llama,
    /// `qwen2` (Qwen2, Qwen2.5): llama plus q/k/v biases.
    Qwen2,
}

impl Architecture {
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(LeanError::Model(format!(
                "architecture '{other}' is not supported (lean runs llama and qwen2)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama GGUFs, whose converter permuted the Q/K rows so that this equals
    /// HF's rotate_half on the original weights.
    Interleaved,
    /// Pairs (i, i + d/2): HF's rotate_half layout, used by qwen2 GGUFs (rows not permuted).
    Neox,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Rotated dimensions per head (≤ head_dim).
    pub rope_dim: usize,
    pub rope_base: f32,
    /// Linear position scaling (HF rope_scaling type "linear"): positions are divided by this.
    pub rope_linear_factor: f32,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
    /// The context length the model was trained for.
    pub train_context_length: usize,
    pub vocab_size: usize,
}

impl ModelConfig {
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let arch = Architecture::from_gguf_name(gguf.architecture()?)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let n_embd = gguf.u32(&key("embedding_length"))? as usize;
        let n_heads = gguf.u32(&key("attention.head_count"))? as usize;
        let n_kv_heads = gguf
            .u32_opt(&key("attention.head_count_kv"))?
            .map_or(n_heads, |v| v as usize);
        if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(LeanError::Model(format!(
                "{a}.attention.head_count ({n_heads}) must be a non-zero multiple of head_count_kv ({n_kv_heads})"
            )));
        }
        let head_dim = match gguf.u32_opt(&key("attention.key_length"))? {
            Some(d) => d as usize,
            None if n_embd.is_multiple_of(n_heads) => n_embd / n_heads,
            None => {
                return Err(LeanError::Model(format!(
                    "{a}.embedding_length ({n_embd}) is not a multiple of head_count ({n_heads})"
                )))
            }
        };
        let rope_dim = gguf
            .u32_opt(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        if rope_dim > head_dim || rope_dim % 2 != 0 || head_dim % 2 != 0 {
            return Err(LeanError::Model(format!(
                "{a}.rope.dimension_count ({rope_dim}) must be even and at most the head dimension ({head_dim})"
            )));
        }
        let rope_linear_factor = match gguf.str_opt(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => gguf.f32(&key("rope.scaling.factor"))?,
            Some(other) => {
                return Err(LeanError::Model(format!(
                    "{a}.rope.scaling.type '{other}' is not supported"
                )))
            }
        };
        if gguf.tensor("rope_freqs.weight").is_some() {
            return Err(LeanError::Model(
                "rope frequency factors (rope_freqs.weight, Llama 3.1-style) are not supported"
                    .into(),
            ));
        }
        let vocab_size = gguf
            .tensor("token_embd.weight")
            .map(|t| t.rows())
            .ok_or_else(|| LeanError::Model("tensor 'token_embd.weight' is missing".into()))?;
        let cfg = ModelConfig {
            arch,
            n_layers: gguf.u32(&key("block_count"))? as usize,
            n_embd,
            n_ff: gguf.u32(&key("feed_forward_length"))? as usize,
            n_heads,
            n_kv_heads,
            head_dim,
            rope_dim,
            rope_base: gguf.f32_opt(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_linear_factor,
            rope_style: match arch {
                Architecture::Llama => RopeStyle::Interleaved,
                Architecture::Qwen2 => RopeStyle::Neox,
            },
            rms_eps: gguf.f32(&key("attention.layer_norm_rms_epsilon"))?,
            train_context_length: gguf.u32(&key("context_length"))? as usize,
            vocab_size,
        };
        if cfg.n_layers == 0 || cfg.n_embd == 0 || cfg.n_ff == 0 {
            return Err(LeanError::Model(format!(
                "{a}: block_count, embedding_length and feed_forward_length must be non-zero"
            )));
        }
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
