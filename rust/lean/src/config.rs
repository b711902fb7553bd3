//! Hyper-parameters of a transformer and the description of its forward pass, read from GGUF
//! metadata. The numbers common to every architecture are read here; what differs (norm
//! placement, biases, q/k norms, rotary tables, sliding windows, the gate's activation) comes
//! from the architecture's own file in `model/`, as a [`Block`] and per-layer [`Layer`]s that
//! both backends run: no backend names an architecture.
use crate::error::{LeanError, Result};
use lean_gguf::Gguf;

/// Which architecture file describes the model.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama`: SmolLM2, Llama 2 and Llama 3.x (rope frequency factors).
    Llama,
    /// `qwen2` (Qwen2, Qwen2.5): llama plus q/k/v biases.
    Qwen2,
    /// `qwen3`: llama plus per-head q/k RMS norms.
    Qwen3,
    /// `gemma3`: scaled embedding, four norms a layer, q/k norms, sliding-window layers.
    Gemma3,
}

impl Architecture {
    pub const ALL: [Architecture; 4] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
    ];

    pub fn from_gguf_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|a| a.name()).collect();
                LeanError::Model(format!(
                    "architecture '{name}' is not supported (lean runs {})",
                    names.join(", ")
                ))
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama GGUFs, whose converter permuted the Q/K rows so that this equals
    /// HF's rotate_half on the original weights.
    Interleaved,
    /// Pairs (i, i + d/2): HF's rotate_half layout (qwen2, qwen3, gemma3: rows not permuted).
    Neox,
}

/// The feed-forward's gate activation: `act(gate) · up`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(g) = g · sigmoid(g).
    Silu,
    /// GeGLU with torch's tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// One rotary embedding: the frequencies of a table of (cos, sin).
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// Rotated dimensions per head (≤ head_dim).
    pub dim: usize,
    pub base: f32,
    /// Linear position scaling (HF rope_scaling type "linear"): positions are divided by this.
    pub linear_factor: f32,
    pub style: RopeStyle,
    /// Per-frequency divisors (Llama 3's `rope_freqs.weight`, `dim / 2` of them).
    pub freq_factors: Option<Vec<f32>>,
}

/// What every layer's block does besides the common pre-norm decoder skeleton
/// (x += attn(norm(x)); x += ffn(norm(x))).
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// RMS norms over each head of q and of k, before the rotation.
    pub qk_norm: bool,
    /// RMS norms on the attention's and the feed-forward's outputs, before the residual adds.
    pub post_norms: bool,
    pub activation: Activation,
    /// The embedding rows are multiplied by this (Gemma: √d in float32).
    pub embedding_scale: Option<f32>,
    /// Attention scores are multiplied by this (usually head_dim^-½).
    pub attention_scale: f32,
}

/// What differs between layers.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Index in `ModelConfig::ropes`.
    pub rope: usize,
    /// Sliding window: a token sees itself and the `window - 1` positions before it.
    pub window: Option<usize>,
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
    pub rms_eps: f32,
    /// The context length the model was trained for.
    pub train_context_length: usize,
    pub vocab_size: usize,
    pub block: Block,
    /// The distinct rotary embeddings (one table each); layers name theirs.
    pub ropes: Vec<Rope>,
    /// One per layer.
    pub layers: Vec<Layer>,
}

/// The numbers every architecture has, and the GGUF they came from: what an architecture file
/// reads to describe its block.
pub struct Hyper<'a> {
    pub gguf: &'a Gguf,
    /// Reads a 1-D tensor of the given length as f32 (checked).
    pub vector: &'a dyn Fn(&str, usize) -> Result<Vec<f32>>,
    pub arch: Architecture,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    pub head_dim: usize,
}

impl Hyper<'_> {
    /// The metadata key `<arch>.<k>`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.name())
    }

    /// The rotary embedding the metadata describes (dimension count, base, linear scaling).
    pub fn rope(&self, style: RopeStyle) -> Result<Rope> {
        let (g, head_dim) = (self.gguf, self.head_dim);
        let dim = g
            .u32_opt(&self.key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        if dim > head_dim || dim % 2 != 0 || head_dim % 2 != 0 {
            return Err(LeanError::Model(format!(
                "{} ({dim}) must be even and at most the head dimension ({head_dim})",
                self.key("rope.dimension_count")
            )));
        }
        let linear_factor = match g.str_opt(&self.key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => g.f32(&self.key("rope.scaling.factor"))?,
            Some(other) => {
                return Err(LeanError::Model(format!(
                    "{} '{other}' is not supported",
                    self.key("rope.scaling.type")
                )))
            }
        };
        if !(linear_factor.is_finite() && linear_factor > 0.0) {
            return Err(LeanError::Model(format!(
                "{} ({linear_factor}) must be a positive number",
                self.key("rope.scaling.factor")
            )));
        }
        let base = g.f32_opt(&self.key("rope.freq_base"))?.unwrap_or(10_000.0);
        if !(base.is_finite() && base > 1.0) {
            return Err(LeanError::Model(format!(
                "{} ({base}) must be a number above 1",
                self.key("rope.freq_base")
            )));
        }
        Ok(Rope {
            dim,
            base,
            linear_factor,
            style,
            freq_factors: None,
        })
    }

    /// The 1-D tensor `name` of `len` elements, when the file has it.
    pub fn vector_opt(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        match self.gguf.tensor(name) {
            Some(_) => (self.vector)(name, len).map(Some),
            None => Ok(None),
        }
    }

    /// head_dim^-½ as HF computes it (in float64, then rounded once to float32).
    pub fn inverse_sqrt(value: usize) -> f32 {
        (value as f64).powf(-0.5) as f32
    }

    /// Every layer with the same rotary embedding (index 0) and no window.
    pub fn uniform_layers(&self) -> Vec<Layer> {
        vec![
            Layer {
                rope: 0,
                window: None
            };
            self.n_layers
        ]
    }
}

/// What an architecture file says about a model: its block, rotary embeddings and layers.
pub struct Description {
    pub block: Block,
    pub ropes: Vec<Rope>,
    pub layers: Vec<Layer>,
}

impl ModelConfig {
    /// The common numbers from the metadata, and the rest from `describe` (the architecture's
    /// file), checked for consistency.
    pub fn from_gguf(
        gguf: &Gguf,
        vector: &dyn Fn(&str, usize) -> Result<Vec<f32>>,
        describe: fn(&Hyper) -> Result<Description>,
    ) -> Result<Self> {
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
        if let Some(v) = gguf.u32_opt(&key("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(LeanError::Model(format!(
                    "{a}.attention.value_length ({v}) differs from key_length ({head_dim}): \
                     lean needs equal key and value heads"
                )));
            }
        }
        if head_dim == 0 {
            return Err(LeanError::Model(format!("{a}: a head dimension of 0")));
        }
        let vocab_size = gguf
            .tensor("token_embd.weight")
            .map(|t| t.rows())
            .ok_or_else(|| LeanError::Model("tensor 'token_embd.weight' is missing".into()))?;
        let n_layers = gguf.u32(&key("block_count"))? as usize;
        // Each block has tensors of its own: a count past the file's tensors is a lie, and the
        // architecture files size their per-layer tables by it (a fuzzed file claiming 4
        // billion blocks made load abort on a 26 GB allocation).
        if n_layers > gguf.tensors.len() {
            return Err(LeanError::Model(format!(
                "{a}.block_count ({n_layers}) is more than the file's {} tensors: each block has tensors of its own",
                gguf.tensors.len()
            )));
        }
        let hyper = Hyper {
            gguf,
            vector,
            arch,
            n_layers,
            n_embd,
            n_heads,
            head_dim,
        };
        let Description {
            block,
            ropes,
            layers,
        } = describe(&hyper)?;
        let cfg = ModelConfig {
            arch,
            n_layers,
            n_embd,
            n_ff: gguf.u32(&key("feed_forward_length"))? as usize,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_eps: gguf.f32(&key("attention.layer_norm_rms_epsilon"))?,
            train_context_length: gguf.u32(&key("context_length"))? as usize,
            vocab_size,
            block,
            ropes,
            layers,
        };
        if cfg.n_layers == 0 || cfg.n_embd == 0 || cfg.n_ff == 0 {
            return Err(LeanError::Model(format!(
                "{a}: block_count, embedding_length and feed_forward_length must be non-zero"
            )));
        }
        if !(cfg.rms_eps.is_finite() && cfg.rms_eps >= 0.0) {
            return Err(LeanError::Model(format!(
                "{a}.attention.layer_norm_rms_epsilon ({}) must be a non-negative number",
                cfg.rms_eps
            )));
        }
        // The architecture files build these; a mistake there must not index out of bounds.
        assert_eq!(cfg.layers.len(), cfg.n_layers, "{a}: one Layer per block");
        assert!(
            cfg.layers.iter().all(|l| l.rope < cfg.ropes.len()),
            "{a}: layers name existing ropes"
        );
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
