//! Weight views: packed matrices stay in the file's bytes (zero-copy); the small 1-D tensors
//! (norms, biases) are dequantized to f32 once.
use crate::config::ModelConfig;
use crate::error::{LeanError, Result};
use lean_gguf::{Gguf, TensorType};

/// A 2-D weight of `rows` rows of `cols` elements, packed as in the file.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub ty: TensorType,
    pub rows: usize,
    pub cols: usize,
    /// Byte range in the model file.
    pub offset: usize,
    pub len: usize,
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Per-head RMS norm weights of q and k (head_dim each), when the block has them.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: Matrix,
    /// The norm of the attention's output before the residual add (`post_norms`).
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    /// The norm of the feed-forward's output before the residual add (`post_norms`).
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Weights {
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The output head; `token_embd` again when the model ties them.
    pub output: Matrix,
    pub tied_output: bool,
}

/// What the architecture files use to fetch and check tensors.
pub(crate) struct Loader<'a> {
    pub gguf: &'a Gguf,
    pub bytes: &'a super::ModelBytes,
    pub config: &'a ModelConfig,
}

impl Loader<'_> {
    pub fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    /// A matrix that must have `cols` elements per row and `rows` rows.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self
            .gguf
            .tensor(name)
            .ok_or_else(|| LeanError::Model(format!("tensor '{name}' is missing")))?;
        if t.dims.len() != 2 || t.row_len() != cols || t.rows() != rows {
            return Err(LeanError::Model(format!(
                "tensor '{name}' has shape {:?}, expected [{cols}, {rows}]",
                t.dims
            )));
        }
        Ok(Matrix {
            name: name.to_string(),
            ty: t.ty,
            rows,
            cols,
            offset: t.offset,
            len: t.size,
        })
    }

    /// A 1-D tensor of `len` elements, as f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        read_vector(self.gguf, self.bytes, name, len)
    }

    /// Layer `i`'s tensors: those of every block, and those the block description asks for.
    fn layer(&self, i: usize) -> Result<LayerWeights> {
        let c = self.config;
        let b = &c.block;
        let n = |s: &str| format!("blk.{i}.{s}");
        let (e, q, kv, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
        let optional = |wanted: bool, s: &str, len| {
            if wanted {
                self.vector(&n(s), len).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(LayerWeights {
            attn_norm: self.vector(&n("attn_norm.weight"), e)?,
            wq: self.matrix(&n("attn_q.weight"), q, e)?,
            wk: self.matrix(&n("attn_k.weight"), kv, e)?,
            wv: self.matrix(&n("attn_v.weight"), kv, e)?,
            bq: optional(b.qkv_bias, "attn_q.bias", q)?,
            bk: optional(b.qkv_bias, "attn_k.bias", kv)?,
            bv: optional(b.qkv_bias, "attn_v.bias", kv)?,
            q_norm: optional(b.qk_norm, "attn_q_norm.weight", hd)?,
            k_norm: optional(b.qk_norm, "attn_k_norm.weight", hd)?,
            wo: self.matrix(&n("attn_output.weight"), e, q)?,
            post_attn_norm: optional(b.post_norms, "post_attention_norm.weight", e)?,
            ffn_norm: self.vector(&n("ffn_norm.weight"), e)?,
            w_gate: self.matrix(&n("ffn_gate.weight"), ff, e)?,
            w_up: self.matrix(&n("ffn_up.weight"), ff, e)?,
            w_down: self.matrix(&n("ffn_down.weight"), e, ff)?,
            post_ffn_norm: optional(b.post_norms, "post_ffw_norm.weight", e)?,
        })
    }

    /// Every weight the description asks for, checked.
    pub fn load(&self) -> Result<Weights> {
        let layers = (0..self.config.n_layers)
            .map(|i| self.layer(i))
            .collect::<Result<Vec<_>>>()?;
        self.weights(layers)
    }

    /// Embedding, final norm and output head (tied to the embedding when `output.weight` is absent).
    fn weights(&self, layers: Vec<LayerWeights>) -> Result<Weights> {
        let c = self.config;
        let token_embd = self.matrix("token_embd.weight", c.vocab_size, c.n_embd)?;
        let (output, tied_output) = if self.has("output.weight") {
            (self.matrix("output.weight", c.vocab_size, c.n_embd)?, false)
        } else {
            (token_embd.clone(), true)
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: self.vector("output_norm.weight", c.n_embd)?,
            output,
            tied_output,
        })
    }
}

/// The 1-D tensor `name` of `len` elements as f32, checked (shape, data in memory).
pub(crate) fn read_vector(
    gguf: &Gguf,
    bytes: &super::ModelBytes,
    name: &str,
    len: usize,
) -> Result<Vec<f32>> {
    let t = gguf
        .tensor(name)
        .ok_or_else(|| LeanError::Model(format!("tensor '{name}' is missing")))?;
    if t.n_elements() != len || t.dims.len() != 1 {
        return Err(LeanError::Model(format!(
            "tensor '{name}' has shape {:?}, expected [{len}]",
            t.dims
        )));
    }
    let data = bytes
        .range(t.offset, t.size)
        .ok_or_else(|| LeanError::Model(format!("tensor '{name}': its data is not in memory")))?;
    let mut out = vec![0f32; len];
    lean_quant::dequantize_row(t.ty, data, &mut out);
    Ok(out)
}
