//! A real model grown to a bigger model's tensor shapes while computing the same function. This is
//! for benchmarks of speculative decoding on a GPU host. The test models we can fetch stop at
//! 0.5B parameters, and a synthetic model (`synthetic`) has the right speed but guesses nothing.
//! An inflated Qwen2.5-Coder-0.5B decodes at the speed of a Qwen2.5-3B and predicts what the 0.5B
//! predicts, so prompt lookup keeps the 0.5B's guesses at the 3B's cost per step.
//!
//! How the function is kept: every added weight is zero.
//! - Hidden and feed-forward dimensions are padded with zero rows and columns, so the padded part
//!   of the residual stream stays exactly zero.
//! - Added heads have zero query, key and value rows and zero output columns.
//! - Added layers have zero `attn_output` and `ffn_down`, so each adds exactly zero to the residual.
//! - RMSNorm averages over the wider hidden size, so its weights are scaled by √(d / d′) to give the
//!   same normalized values, up to ε and rounding. Tokens may therefore differ from the source's
//!   where its logits nearly tie.
//!
//! The source's head size (and rotary embedding) is kept. The shape's query and key/value widths
//! are filled with more heads of the source's size, and a GQA group may only grow. Only Llama,
//! Qwen2 and Qwen3 blocks can be inflated; Gemma 3 scales its embeddings by √d, which would change.
//! The bytes read per token match the shape's, except where the source's tensor types differ from a
//! real file of the shape (e.g. a Q8_0 embedding padded where the 3B's is Q6_K).

use crate::config::Architecture;
use crate::error::{LeanError, Result};
use crate::model::Model;
use crate::synthetic::SyntheticShape;
use lean_gguf::{GgufWriter, TensorInfo, TensorType};

/// The widths an inflated model grows to. Each must be at least the source's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrownShape {
    pub n_layers: usize,
    pub n_embd: usize,
    /// Query width: heads × head size.
    pub q_width: usize,
    /// Key (and value) width: key/value heads × head size.
    pub kv_width: usize,
    pub n_ff: usize,
}

impl GrownShape {
    /// The widths of a synthetic shape (the real model it copies).
    pub fn of(shape: SyntheticShape) -> Self {
        let p = shape.params();
        GrownShape {
            n_layers: p.n_layers,
            n_embd: p.n_embd,
            q_width: p.n_heads * p.head_dim,
            kv_width: p.n_kv_heads * p.head_dim,
            n_ff: p.n_ff,
        }
    }
}

/// `source` grown to `shape`'s widths (see the module's comment), as a GGUF file's bytes.
pub fn inflated_gguf(source: &Model, shape: SyntheticShape) -> Result<Vec<u8>> {
    inflate(source, &GrownShape::of(shape), shape.name())
}

/// Where a dimension's source indices go in the grown dimension: runs of (source start, grown
/// start, length). Every other grown index holds zero.
#[derive(Clone, Debug)]
struct DimMap {
    grown: usize,
    runs: Vec<(usize, usize, usize)>,
}

impl DimMap {
    /// The source's `len` indices first, zeros after.
    fn padded(len: usize, grown: usize) -> Self {
        DimMap {
            grown,
            runs: vec![(0, 0, len)],
        }
    }

    /// Heads of `head_dim` in `groups` groups of `per` source heads, each group placed at the
    /// start of a group of `grown_per` heads; `grown` heads in all (zero heads fill the rest).
    fn heads(head_dim: usize, groups: usize, per: usize, grown_per: usize, grown: usize) -> Self {
        DimMap {
            grown: grown * head_dim,
            runs: (0..groups)
                .map(|g| (g * per * head_dim, g * grown_per * head_dim, per * head_dim))
                .collect(),
        }
    }

    fn source_len(&self) -> usize {
        self.runs.iter().map(|r| r.2).sum()
    }
}

/// What fills one tensor of the inflated file.
enum Fill {
    /// Source rows and columns placed by the maps (both in elements).
    Grown {
        info: TensorInfo,
        cols: DimMap,
        rows: DimMap,
    },
    /// F32 values (norm weights).
    Values(Vec<f32>),
    /// Zero bytes (the added layers' matrices and biases).
    Zero,
}

fn error(what: String) -> LeanError {
    LeanError::InvalidArgument(format!("cannot inflate the model: {what}"))
}

fn inflate(source: &Model, to: &GrownShape, name: &str) -> Result<Vec<u8>> {
    let c = &source.config;
    if !source.has_weight_data() {
        return Err(error("its weights are not in memory".into()));
    }
    if !matches!(
        c.arch,
        Architecture::Llama | Architecture::Qwen2 | Architecture::Qwen3
    ) {
        return Err(error(format!(
            "{} blocks do not keep their function when widened (llama, qwen2, qwen3 do)",
            c.arch.name()
        )));
    }
    let (hd, q, kv) = (
        c.head_dim,
        c.n_heads * c.head_dim,
        c.n_kv_heads * c.head_dim,
    );
    for (what, from, grown) in [
        ("layers", c.n_layers, to.n_layers),
        ("hidden size", c.n_embd, to.n_embd),
        ("query width", q, to.q_width),
        ("key/value width", kv, to.kv_width),
        ("feed-forward size", c.n_ff, to.n_ff),
    ] {
        if grown < from {
            return Err(error(format!(
                "its {what} ({from}) is larger than the target's ({grown})"
            )));
        }
    }
    if !to.q_width.is_multiple_of(hd) || !to.kv_width.is_multiple_of(hd) {
        return Err(error(format!(
            "the target's query and key/value widths ({}, {}) are not whole heads of the \
             source's size {hd}",
            to.q_width, to.kv_width
        )));
    }
    let (heads, kv_heads) = (to.q_width / hd, to.kv_width / hd);
    if heads % kv_heads != 0 || heads / kv_heads < c.n_heads / c.n_kv_heads {
        return Err(error(format!(
            "{heads} query heads over {kv_heads} key/value heads cannot hold groups of {}",
            c.n_heads / c.n_kv_heads
        )));
    }

    let hidden = DimMap::padded(c.n_embd, to.n_embd);
    let (groups, per) = (c.n_kv_heads, c.n_heads / c.n_kv_heads);
    let q_map = DimMap::heads(hd, groups, per, heads / kv_heads, heads);
    let kv_map = DimMap::heads(hd, groups, 1, 1, kv_heads);
    let ff = DimMap::padded(c.n_ff, to.n_ff);
    let one = DimMap::padded(1, 1);
    let vocab = DimMap::padded(c.vocab_size, c.vocab_size);
    // RMSNorm over d′ ≥ d values, d′ − d of them zero: the same output from weights × √(d / d′).
    let norm_scale = (c.n_embd as f64 / to.n_embd as f64).sqrt() as f32;

    let a = c.arch.name();
    let key = |k: &str| format!("{a}.{k}");
    let mut overrides: Vec<(String, lean_gguf::Value)> = vec![
        ("general.name".to_string(), format!("{name}-shaped").into()),
        (key("block_count"), (to.n_layers as u32).into()),
        (key("embedding_length"), (to.n_embd as u32).into()),
        (key("feed_forward_length"), (to.n_ff as u32).into()),
        (key("attention.head_count"), (heads as u32).into()),
        (key("attention.head_count_kv"), (kv_heads as u32).into()),
        (key("attention.key_length"), (hd as u32).into()),
        (key("attention.value_length"), (hd as u32).into()),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in source.gguf.metadata.iter() {
        match overrides.iter().position(|(o, _)| o == k) {
            Some(i) => {
                let (k, v) = overrides.swap_remove(i);
                w.add(k, v)
            }
            None => w.add(k, v.clone()),
        };
    }
    for (k, v) in overrides {
        w.add(k, v);
    }

    let mut fills = Vec::new();
    // A tensor's grown dims and how it fills: (cols, rows) maps, or a norm's scaled values.
    let grown_fill = |t: &TensorInfo, cols: &DimMap, rows: &DimMap| -> Result<Fill> {
        let (bl, cols_in, rows_in) = (t.ty.block_len(), t.row_len(), t.rows());
        if t.dims.len() > 2 || cols_in != cols.source_len() || rows_in != rows.source_len() {
            return Err(error(format!(
                "tensor '{}' has dims {:?}, not the {} × {} its config implies",
                t.name,
                t.dims,
                cols.source_len(),
                rows.source_len()
            )));
        }
        let aligned = cols.grown.is_multiple_of(bl)
            && cols
                .runs
                .iter()
                .all(|&(s, d, l)| s % bl == 0 && d % bl == 0 && l % bl == 0);
        if !aligned {
            return Err(error(format!(
                "tensor '{}' is {}, whose blocks of {bl} do not fit the grown columns",
                t.name, t.ty
            )));
        }
        Ok(Fill::Grown {
            info: t.clone(),
            cols: cols.clone(),
            rows: rows.clone(),
        })
    };
    // A norm's (or rope factors') values × `scale`, padded with ones to `len` (written as F32).
    let norm_fill = |t: &TensorInfo, scale: f32, len: usize| -> Result<Fill> {
        let mut values = source.vector(&t.name, t.n_elements())?;
        values.iter_mut().for_each(|v| *v *= scale);
        values.resize(len, 1.0);
        Ok(Fill::Values(values))
    };
    let mut add = |w: &mut GgufWriter, name: &str, ty: TensorType, dims: Vec<u64>, fill: Fill| {
        w.add_tensor_in_place(name, ty, &dims);
        fills.push(fill);
    };
    let dims = |cols: &DimMap, rows: &DimMap, t: &TensorInfo| -> Vec<u64> {
        match t.dims.len() {
            1 => vec![cols.grown as u64],
            _ => vec![cols.grown as u64, rows.grown as u64],
        }
    };

    // The source's tensors, grown, then the added layers' (zero), named as layer 0's.
    let mut layer0 = Vec::new();
    for t in &source.gguf.tensors {
        // "blk.{i}.{part}", or a whole-model tensor's name.
        let (layer, part) = t
            .name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(i, part)| Some((Some(i.parse::<usize>().ok()?), part)))
            .unwrap_or((None, t.name.as_str()));
        let maps = match part {
            "token_embd.weight" | "output.weight" => Some((&hidden, &vocab)),
            "attn_q.weight" => Some((&hidden, &q_map)),
            "attn_k.weight" | "attn_v.weight" => Some((&hidden, &kv_map)),
            "attn_q.bias" => Some((&q_map, &one)),
            "attn_k.bias" | "attn_v.bias" => Some((&kv_map, &one)),
            "attn_output.weight" => Some((&q_map, &hidden)),
            "ffn_gate.weight" | "ffn_up.weight" => Some((&hidden, &ff)),
            "ffn_down.weight" => Some((&ff, &hidden)),
            _ => None,
        };
        let (grown_dims, fill) = match (maps, part) {
            (Some((cols, rows)), _) => (dims(cols, rows, t), grown_fill(t, cols, rows)?),
            (None, "attn_norm.weight" | "ffn_norm.weight" | "output_norm.weight") => {
                (vec![to.n_embd as u64], norm_fill(t, norm_scale, to.n_embd)?)
            }
            // Per-head norms (qwen3) and Llama 3's rope factors: the head size is kept.
            (None, "attn_q_norm.weight" | "attn_k_norm.weight" | "rope_freqs.weight") => {
                (t.dims.clone(), norm_fill(t, 1.0, t.row_len())?)
            }
            _ => return Err(error(format!("tensor '{}' is not one it knows", t.name))),
        };
        let ty = match fill {
            Fill::Values(_) => TensorType::F32,
            _ => t.ty,
        };
        if layer == Some(0) {
            layer0.push((part.to_string(), ty, grown_dims.clone()));
        }
        add(&mut w, &t.name, ty, grown_dims, fill);
    }
    for i in c.n_layers..to.n_layers {
        for (part, ty, dims) in &layer0 {
            let fill = match part.ends_with("norm.weight") {
                true => Fill::Values(vec![1.0; dims[0] as usize]),
                false => Fill::Zero,
            };
            add(&mut w, &format!("blk.{i}.{part}"), *ty, dims.clone(), fill);
        }
    }

    Ok(w.finish_with(|index, out| match &fills[index] {
        Fill::Grown { info, cols, rows } => {
            copy_grown(source.tensor_data(info), info.ty, cols, rows, out)
        }
        Fill::Values(values) => {
            for (o, v) in out.chunks_exact_mut(4).zip(values) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        // The writer hands over zeroed bytes; zero bytes are zero in every GGML type.
        Fill::Zero => {}
    })?)
}

/// Copies a source tensor's rows and column runs (block-aligned: checked when planned) into the
/// zeroed grown tensor `out`.
fn copy_grown(src: &[u8], ty: TensorType, cols: &DimMap, rows: &DimMap, out: &mut [u8]) {
    let bytes = |elements: usize| elements / ty.block_len() * ty.block_bytes();
    let (src_row, out_row) = (bytes(cols.source_len()), bytes(cols.grown));
    for &(row_from, row_to, n_rows) in &rows.runs {
        for r in 0..n_rows {
            let (s, o) = ((row_from + r) * src_row, (row_to + r) * out_row);
            for &(from, to, len) in &cols.runs {
                let (from, to, len) = (bytes(from), bytes(to), bytes(len));
                out[o + to..o + to + len].copy_from_slice(&src[s + from..s + from + len]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{CpuSession, Logits};
    use crate::model::ModelBytes;
    use crate::synthetic::{reduced_gguf, SyntheticWeights};

    fn reduced(shape: SyntheticShape, weights: SyntheticWeights, n_layers: usize) -> Model {
        Model::load(ModelBytes::Owned(
            reduced_gguf(shape, weights, n_layers, 3).unwrap(),
        ))
        .unwrap()
    }

    /// Every position's logits of a prompt.
    fn logits(model: &Model, ids: &[u32]) -> Vec<Vec<f32>> {
        let mut session = CpuSession::new(model, 16);
        let mut rows = Vec::new();
        session
            .forward(model, ids, Logits::All, |_, l| rows.push(l.to_vec()))
            .unwrap();
        rows
    }

    fn argmax(l: &[f32]) -> usize {
        (0..l.len()).fold(0, |best, i| if l[i] > l[best] { i } else { best })
    }

    /// Each architecture, grown in every width (more heads in each group, and for SmolLM2 no
    /// more key/value heads), gives the source's logits up to rounding. (Added layers or a wider
    /// feed-forward alone give them bit for bit, as checked by hand; wider rows change the
    /// matvecs' summation order, and a wider hidden size the norms' rounding.)
    #[test]
    fn an_inflated_model_computes_the_sources_logits() {
        let grown = |n_embd, heads: usize, kv_heads: usize, hd: usize, n_ff| GrownShape {
            n_layers: 3,
            n_embd,
            q_width: heads * hd,
            kv_width: kv_heads * hd,
            n_ff,
        };
        for (shape, weights, to) in [
            // 14 heads over 2 → 24 over 3: groups of 7 → 8, and a zero group; a query width
            // (1536) other than the hidden size.
            (
                SyntheticShape::Qwen2_5_0_5B,
                SyntheticWeights::Q4_0,
                grown(1152, 24, 3, 64, 5120),
            ),
            // 15 heads over 5 → 20 over 5.
            (
                SyntheticShape::SmolLm2_360M,
                SyntheticWeights::Q8_0,
                grown(1024, 20, 5, 64, 2816),
            ),
            // Per-head q/k norms, head size 128; a Q6_K embedding (2048 → 2304 columns).
            (
                SyntheticShape::Qwen3_1_7B,
                SyntheticWeights::Q4_0,
                grown(2304, 24, 8, 128, 6400),
            ),
        ] {
            let source = reduced(shape, weights, 2);
            let bytes = inflate(&source, &to, "test").unwrap();
            let inflated = Model::load(ModelBytes::Owned(bytes)).unwrap();
            let c = &inflated.config;
            assert_eq!(
                (
                    c.n_layers,
                    c.n_embd,
                    c.n_heads * c.head_dim,
                    c.n_kv_heads * c.head_dim,
                    c.n_ff
                ),
                (to.n_layers, to.n_embd, to.q_width, to.kv_width, to.n_ff),
                "{shape}"
            );
            assert_eq!(c.head_dim, source.config.head_dim);
            let ids = [1, 5, 9, 200, 7];
            let (want, got) = (logits(&source, &ids), logits(&inflated, &ids));
            for (pos, (w, g)) in want.iter().zip(&got).enumerate() {
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = w.iter().zip(g).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                // The norms' scaled weights round differently, and the CPU's matvecs quantize
                // activations to 8 bits per block of 32: ~2e-4 of the largest logit is seen.
                assert!(
                    worst <= 2e-3 * scale,
                    "{shape} position {pos}: {worst} of {scale}"
                );
                assert_eq!(argmax(w), argmax(g), "{shape} position {pos}");
            }
        }
    }

    /// Zero weights are not a no-op by accident: an inflated model whose added layer is not
    /// silent (its output projection non-zero) gives other logits, so the test above can fail.
    #[test]
    fn an_added_layer_with_weights_changes_the_logits() {
        let source = reduced(SyntheticShape::Qwen2_5_0_5B, SyntheticWeights::Q8_0, 1);
        let to = GrownShape {
            n_layers: 2,
            ..GrownShape {
                n_layers: 1,
                n_embd: 896,
                q_width: 896,
                kv_width: 128,
                n_ff: 4864,
            }
        };
        let mut bytes = inflate(&source, &to, "test").unwrap();
        let silent = Model::load(ModelBytes::Owned(bytes.clone())).unwrap();
        let ids = [3, 4, 5];
        assert!(logits(&silent, &ids) == logits(&source, &ids));
        // Each of layer 1's Q8_0 matrices: a block of scale 1.0 (f16 0x3C00) and quants 1 at
        // the start of each row.
        let gguf = lean_gguf::Gguf::parse(&bytes).unwrap();
        for t in gguf.tensors.iter().filter(|t| t.name.starts_with("blk.1.")) {
            if t.ty == TensorType::Q8_0 {
                for row in 0..t.rows() {
                    let at = t.offset + row * t.row_bytes();
                    bytes[at..at + 2].copy_from_slice(&[0x00, 0x3C]);
                    bytes[at + 2] = 1;
                }
            }
        }
        let loud = Model::load(ModelBytes::Owned(bytes)).unwrap();
        assert!(logits(&loud, &ids) != logits(&source, &ids));
    }

    #[test]
    fn shrinking_or_other_blocks_are_refused_by_name() {
        let source = reduced(SyntheticShape::Qwen2_5_0_5B, SyntheticWeights::Q4_0, 2);
        let err = |to: GrownShape| inflate(&source, &to, "t").unwrap_err().to_string();
        let base = GrownShape::of(SyntheticShape::Qwen2_5_3B);
        assert!(err(GrownShape {
            n_layers: 1,
            ..base.clone()
        })
        .contains("its layers (2)"));
        assert!(err(GrownShape {
            n_ff: 4000,
            ..base.clone()
        })
        .contains("feed-forward size"));
        assert!(err(GrownShape {
            q_width: 2048 + 32,
            ..base.clone()
        })
        .contains("whole heads"));
        // 16 heads over 8 key/value heads: groups of 2 cannot hold the source's 7.
        assert!(err(GrownShape {
            kv_width: 8 * 64,
            ..base.clone()
        })
        .contains("groups of 7"));
        let gemma = reduced(SyntheticShape::Gemma3_1B, SyntheticWeights::Q4_0, 1);
        let message = inflated_gguf(&gemma, SyntheticShape::Qwen2_5_3B)
            .unwrap_err()
            .to_string();
        assert!(message.contains("gemma3 blocks"), "{message}");
    }
}
