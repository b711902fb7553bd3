//! Random-weight models of real models' shapes, built in memory: for benchmarks where the real
//! file cannot be copied (a rented GPU host with a small upload limit). Speed depends only on the
//! shapes and tensor types, so a synthetic model decodes exactly as fast as the real one.
//!
//! The weights are random but numerically sane (dequantized ~N(0, 0.02)-scale, norms ~1, no
//! NaN/Inf), so a forward pass gives finite logits. The output is deterministic in the seed.
use crate::config::Architecture;
use crate::error::{LeanError, Result};
use lean_gguf::{GgufWriter, TensorType};

/// The real model whose shape a synthetic model copies (hyper-parameters from its HF config.json).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SyntheticShape {
    /// HuggingFaceTB/SmolLM2-360M(-Instruct).
    SmolLm2_360M,
    /// Qwen/Qwen2.5-0.5B(-Instruct).
    Qwen2_5_0_5B,
    /// HuggingFaceTB/SmolLM2-1.7B(-Instruct).
    SmolLm2_1_7B,
    /// Qwen/Qwen2.5-3B(-Instruct).
    Qwen2_5_3B,
    /// meta-llama/Llama-3.2-1B(-Instruct): llama3 rope scaling (`rope_freqs.weight`).
    Llama3_2_1B,
    /// Qwen/Qwen3-1.7B: per-head q/k norms, head_dim 128.
    Qwen3_1_7B,
    /// google/gemma-3-1b-it: post-norms, q/k norms, GELU-tanh, head_dim 256, 5 sliding-window
    /// layers (512) for each global one.
    Gemma3_1B,
}

/// Llama 3.1+'s `rope_scaling` (`rope_type: llama3`), from which the converter computes
/// `rope_freqs.weight`.
#[derive(Copy, Clone, Debug)]
struct Llama3Rope {
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    original_max_position_embeddings: usize,
}

/// Hyper-parameters of a shape. All tie the output head to the embedding. The architecture
/// implies the rest of the block: q/k/v biases (qwen2), per-head q/k norms (qwen3, gemma3),
/// post-norms (gemma3).
#[derive(Clone, Debug)]
pub(crate) struct ShapeParams {
    arch: Architecture,
    pub(crate) n_layers: usize,
    pub(crate) n_embd: usize,
    pub(crate) n_heads: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) n_ff: usize,
    vocab_size: usize,
    rope_base: f32,
    rms_eps: f32,
    context_length: usize,
    /// `rope_freqs.weight` from these (Llama 3.x).
    llama3_rope: Option<Llama3Rope>,
    /// Gemma 3's `attention.sliding_window`.
    sliding_window: Option<usize>,
}

impl SyntheticShape {
    pub const ALL: [SyntheticShape; 7] = [
        SyntheticShape::SmolLm2_360M,
        SyntheticShape::Qwen2_5_0_5B,
        SyntheticShape::SmolLm2_1_7B,
        SyntheticShape::Qwen2_5_3B,
        SyntheticShape::Llama3_2_1B,
        SyntheticShape::Qwen3_1_7B,
        SyntheticShape::Gemma3_1B,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SyntheticShape::SmolLm2_360M => "smollm2-360m",
            SyntheticShape::Qwen2_5_0_5B => "qwen2.5-0.5b",
            SyntheticShape::SmolLm2_1_7B => "smollm2-1.7b",
            SyntheticShape::Qwen2_5_3B => "qwen2.5-3b",
            SyntheticShape::Llama3_2_1B => "llama3.2-1b",
            SyntheticShape::Qwen3_1_7B => "qwen3-1.7b",
            SyntheticShape::Gemma3_1B => "gemma3-1b",
        }
    }

    /// A shape by its [`SyntheticShape::name`] (case-insensitive).
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|s| s.name()).collect();
                LeanError::InvalidArgument(format!(
                    "unknown synthetic shape '{name}' (one of: {})",
                    names.join(", ")
                ))
            })
    }

    pub(crate) fn params(self) -> ShapeParams {
        let llama = |n_layers, n_embd, n_heads, n_kv_heads, n_ff, rope_base| ShapeParams {
            arch: Architecture::Llama,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads,
            head_dim: n_embd / n_heads,
            n_ff,
            vocab_size: 49152,
            rope_base,
            rms_eps: 1e-5,
            context_length: 8192,
            llama3_rope: None,
            sliding_window: None,
        };
        let qwen2 = |n_layers, n_embd, n_heads, n_kv_heads, n_ff| ShapeParams {
            arch: Architecture::Qwen2,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads,
            head_dim: n_embd / n_heads,
            n_ff,
            vocab_size: 151936,
            rope_base: 1e6,
            rms_eps: 1e-6,
            context_length: 32768,
            llama3_rope: None,
            sliding_window: None,
        };
        match self {
            SyntheticShape::SmolLm2_360M => llama(32, 960, 15, 5, 2560, 100_000.0),
            SyntheticShape::Qwen2_5_0_5B => qwen2(24, 896, 14, 2, 4864),
            SyntheticShape::SmolLm2_1_7B => llama(24, 2048, 32, 32, 8192, 130_000.0),
            SyntheticShape::Qwen2_5_3B => qwen2(36, 2048, 16, 2, 11008),
            SyntheticShape::Llama3_2_1B => ShapeParams {
                vocab_size: 128256,
                context_length: 131072,
                llama3_rope: Some(Llama3Rope {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }),
                ..llama(16, 2048, 32, 8, 8192, 500_000.0)
            },
            SyntheticShape::Qwen3_1_7B => ShapeParams {
                arch: Architecture::Qwen3,
                head_dim: 128,
                context_length: 40960,
                ..qwen2(28, 2048, 16, 8, 6144)
            },
            // query_pre_attn_scalar 256 = head_dim and the local layers' rotary base 10,000 are
            // what model/gemma3.rs implies for this shape (no metadata key carries them).
            SyntheticShape::Gemma3_1B => ShapeParams {
                arch: Architecture::Gemma3,
                n_layers: 26,
                n_embd: 1152,
                n_heads: 4,
                n_kv_heads: 1,
                head_dim: 256,
                n_ff: 6912,
                vocab_size: 262144,
                rope_base: 1e6,
                rms_eps: 1e-6,
                context_length: 32768,
                llama3_rope: None,
                sliding_window: Some(512),
            },
        }
    }
}

impl std::str::FromStr for SyntheticShape {
    type Err = LeanError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl std::fmt::Display for SyntheticShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Tensor types of a synthetic model's matrices (norms and biases are F32).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SyntheticWeights {
    /// Q4_0 matrices; the (tied) embedding Q6_K, as llama.cpp quantizes the output head of a
    /// Q4_0 file, or Q8_0 where rows are not a whole number of 256-element blocks (llama.cpp's
    /// fallback for Q6_K: d = 960 and 896).
    Q4_0,
    /// Q8_0 everywhere, embedding included.
    Q8_0,
}

impl SyntheticWeights {
    pub const ALL: [SyntheticWeights; 2] = [SyntheticWeights::Q4_0, SyntheticWeights::Q8_0];

    pub fn name(self) -> &'static str {
        match self {
            SyntheticWeights::Q4_0 => "q4_0",
            SyntheticWeights::Q8_0 => "q8_0",
        }
    }

    /// Weights by their [`SyntheticWeights::name`] (case-insensitive).
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                LeanError::InvalidArgument(format!(
                    "unknown synthetic weight types '{name}' (one of: q4_0, q8_0)"
                ))
            })
    }

    /// The type of the layers' matrices.
    pub fn matrix_type(self) -> TensorType {
        match self {
            SyntheticWeights::Q4_0 => TensorType::Q4_0,
            SyntheticWeights::Q8_0 => TensorType::Q8_0,
        }
    }

    /// The type of the embedding (and tied output head) for rows of `n_embd` elements.
    pub fn embedding_type(self, n_embd: usize) -> TensorType {
        match self {
            SyntheticWeights::Q4_0 if n_embd.is_multiple_of(TensorType::Q6_K.block_len()) => {
                TensorType::Q6_K
            }
            _ => TensorType::Q8_0,
        }
    }

    /// llama.cpp's `general.file_type` (LLAMA_FTYPE_MOSTLY_Q4_0 / _Q8_0).
    fn file_type(self) -> u32 {
        match self {
            SyntheticWeights::Q4_0 => 2,
            SyntheticWeights::Q8_0 => 7,
        }
    }
}

impl std::str::FromStr for SyntheticWeights {
    type Err = LeanError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl std::fmt::Display for SyntheticWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A complete GGUF of `shape` with random `weights`, ready for
/// `Model::load(ModelBytes::Owned(bytes))`. Tensor data is generated straight into the returned
/// buffer (the largest, qwen2.5-3b in Q8_0, is about 3.3 GB). Fails only where the file does not
/// fit the address space (wasm32: 4 GiB).
pub fn synthetic_gguf(
    shape: SyntheticShape,
    weights: SyntheticWeights,
    seed: u64,
) -> Result<Vec<u8>> {
    build(&shape.params(), shape.name(), weights, seed)
}

/// `synthetic_gguf` with only the first `n_layers` layers: every layer of a shape is alike, so
/// tests of the forward pass's arithmetic (here and in the backends' crates) need few (the full
/// files reach 3.3 GB).
pub fn reduced_gguf(
    shape: SyntheticShape,
    weights: SyntheticWeights,
    n_layers: usize,
    seed: u64,
) -> Result<Vec<u8>> {
    let mut p = shape.params();
    p.n_layers = n_layers;
    build(&p, shape.name(), weights, seed)
}

/// Standard deviation of the dequantized matrix weights (typical of trained small LMs).
const WEIGHT_STD: f32 = 0.02;

/// What fills a tensor.
#[derive(Copy, Clone)]
enum Fill {
    Matrix(TensorType),
    /// RMSNorm weights: 1 ± 5%.
    Norm,
    /// Projection biases: uniform with std WEIGHT_STD.
    Bias,
    /// Llama 3's `rope_freqs.weight` (computed, not random).
    RopeFreqs,
}

/// `rope_freqs.weight` as llama.cpp's converter computes it (`LlamaModel.generate_extra_tensors`,
/// as scripts/make_test_models.py's `llama3_rope_factors`): the inverse frequencies in float32,
/// each frequency's divisor from its wavelength (1 above the high-frequency wavelength, `factor`
/// below the low one, smoothly between), in float32 arithmetic.
fn llama3_rope_factors(r: &Llama3Rope, base: f32, dim: usize) -> Vec<f32> {
    let old_ctx = r.original_max_position_embeddings as f32;
    // Python floats: exact for the published values (8192 / 1 and 8192 / 4).
    let low_wavelen = (r.original_max_position_embeddings as f64 / r.low_freq_factor as f64) as f32;
    let high_wavelen =
        (r.original_max_position_embeddings as f64 / r.high_freq_factor as f64) as f32;
    (0..dim)
        .step_by(2)
        .map(|i| {
            // torch: base ** (arange(0, dim, 2, float32) / dim); a Python float base, a float32
            // exponent: the power in double, the tensor's result in float32.
            let exponent = i as f32 / dim as f32;
            let freq = 1.0f32 / ((base as f64).powf(exponent as f64) as f32);
            let wavelen = (2.0 * std::f64::consts::PI) as f32 / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                r.factor
            } else {
                let smooth = (old_ctx / wavelen - r.low_freq_factor)
                    / (r.high_freq_factor - r.low_freq_factor);
                1.0 / ((1.0 - smooth) / r.factor + smooth)
            }
        })
        .collect()
}

fn build(p: &ShapeParams, name: &str, weights: SyntheticWeights, seed: u64) -> Result<Vec<u8>> {
    let a = p.arch.name();
    let key = |k: &str| format!("{a}.{k}");
    // The shapes' hyper-parameters are constants far below u32::MAX.
    let u32_of = |v: usize| v as u32;
    let mut w = GgufWriter::new();
    w.add("general.architecture", a)
        .add("general.name", format!("synthetic {name} {weights}"))
        .add("general.file_type", weights.file_type())
        .add(key("block_count"), u32_of(p.n_layers))
        .add(key("context_length"), u32_of(p.context_length))
        .add(key("embedding_length"), u32_of(p.n_embd))
        .add(key("feed_forward_length"), u32_of(p.n_ff))
        .add(key("attention.head_count"), u32_of(p.n_heads))
        .add(key("attention.head_count_kv"), u32_of(p.n_kv_heads))
        .add(key("attention.key_length"), u32_of(p.head_dim))
        .add(key("attention.value_length"), u32_of(p.head_dim))
        .add(key("rope.dimension_count"), u32_of(p.head_dim))
        .add(key("rope.freq_base"), p.rope_base)
        .add(key("attention.layer_norm_rms_epsilon"), p.rms_eps)
        .add(key("vocab_size"), u32_of(p.vocab_size));
    if let Some(window) = p.sliding_window {
        w.add(key("attention.sliding_window"), u32_of(window));
    }
    w.add("tokenizer.ggml.model", "gpt2").add(
        "tokenizer.ggml.tokens",
        (0..p.vocab_size)
            .map(|i| format!("<synthetic-{i}>"))
            .collect::<Vec<_>>(),
    );

    // Embedding, blocks, final norm; `fills[i]` fills tensor i.
    let mut fills = Vec::new();
    let mut add = |w: &mut GgufWriter, name: String, fill: Fill, dims: &[usize]| {
        let ty = match fill {
            Fill::Matrix(ty) => ty,
            Fill::Norm | Fill::Bias | Fill::RopeFreqs => TensorType::F32,
        };
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        w.add_tensor_in_place(name, ty, &dims);
        fills.push(fill);
    };
    let (e, q, kv, ff) = (
        p.n_embd,
        p.n_heads * p.head_dim,
        p.n_kv_heads * p.head_dim,
        p.n_ff,
    );
    let matrix = Fill::Matrix(weights.matrix_type());
    let rope_freqs = p
        .llama3_rope
        .map(|r| llama3_rope_factors(&r, p.rope_base, p.head_dim));
    if let Some(factors) = &rope_freqs {
        add(
            &mut w,
            "rope_freqs.weight".into(),
            Fill::RopeFreqs,
            &[factors.len()],
        );
    }
    let (qk_norms, post_norms) = (
        matches!(p.arch, Architecture::Qwen3 | Architecture::Gemma3),
        p.arch == Architecture::Gemma3,
    );
    add(
        &mut w,
        "token_embd.weight".into(),
        Fill::Matrix(weights.embedding_type(e)),
        &[e, p.vocab_size],
    );
    for i in 0..p.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        add(&mut w, n("attn_norm.weight"), Fill::Norm, &[e]);
        add(&mut w, n("attn_q.weight"), matrix, &[e, q]);
        add(&mut w, n("attn_k.weight"), matrix, &[e, kv]);
        add(&mut w, n("attn_v.weight"), matrix, &[e, kv]);
        if p.arch == Architecture::Qwen2 {
            add(&mut w, n("attn_q.bias"), Fill::Bias, &[q]);
            add(&mut w, n("attn_k.bias"), Fill::Bias, &[kv]);
            add(&mut w, n("attn_v.bias"), Fill::Bias, &[kv]);
        }
        if qk_norms {
            add(&mut w, n("attn_q_norm.weight"), Fill::Norm, &[p.head_dim]);
            add(&mut w, n("attn_k_norm.weight"), Fill::Norm, &[p.head_dim]);
        }
        add(&mut w, n("attn_output.weight"), matrix, &[q, e]);
        if post_norms {
            add(&mut w, n("post_attention_norm.weight"), Fill::Norm, &[e]);
        }
        add(&mut w, n("ffn_norm.weight"), Fill::Norm, &[e]);
        add(&mut w, n("ffn_gate.weight"), matrix, &[e, ff]);
        add(&mut w, n("ffn_up.weight"), matrix, &[e, ff]);
        add(&mut w, n("ffn_down.weight"), matrix, &[ff, e]);
        if post_norms {
            add(&mut w, n("post_ffw_norm.weight"), Fill::Norm, &[e]);
        }
    }
    add(&mut w, "output_norm.weight".into(), Fill::Norm, &[e]);

    Ok(w.finish_with(|index, data| {
        // One stream per tensor: its bytes do not depend on the tensors before it.
        let mut rng = SplitMix64(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        match fills[index] {
            Fill::Matrix(ty) => fill_blocks(ty, data, &mut rng),
            Fill::Norm => fill_f32(data, &mut rng, |u| 1.0 + 0.1 * (u - 0.5)),
            // Uniform on ±√3·σ has standard deviation σ.
            Fill::Bias => fill_f32(data, &mut rng, |u| {
                (2.0 * u - 1.0) * 3f32.sqrt() * WEIGHT_STD
            }),
            Fill::RopeFreqs => {
                let factors = rope_freqs.as_deref().expect("added with the factors");
                for (v, f) in data.chunks_exact_mut(4).zip(factors) {
                    v.copy_from_slice(&f.to_le_bytes());
                }
            }
        }
    })?)
}

/// SplitMix64: fast, and good enough for weights nobody reads.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let last = self.next().to_le_bytes();
            rest.copy_from_slice(&last[..rest.len()]);
        }
    }
}

fn fill_f32(data: &mut [u8], rng: &mut SplitMix64, value: impl Fn(f32) -> f32) {
    for v in data.chunks_exact_mut(4) {
        v.copy_from_slice(&value(rng.unit()).to_le_bytes());
    }
}

fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Random quants with a block scale chosen so that the dequantized weights have standard
/// deviation WEIGHT_STD (the scale divides it by the quants' root mean square).
fn fill_blocks(ty: TensorType, data: &mut [u8], rng: &mut SplitMix64) {
    match ty {
        // x = d·(q − 8) with q − 8 uniform on −7..=7 (nibble 0 → 8, so that the weights are
        // symmetric about 0 as quantized ones are): E[(q − 8)²] = 2·140/16.
        TensorType::Q4_0 => {
            let d = f16_bits(WEIGHT_STD / 17.5f32.sqrt());
            let symmetric = |n: u8| if n == 0 { 8 } else { n };
            for block in data.chunks_exact_mut(18) {
                block[..2].copy_from_slice(&d);
                rng.fill(&mut block[2..]);
                for q in &mut block[2..] {
                    *q = symmetric(*q & 0x0F) | symmetric(*q >> 4) << 4;
                }
            }
        }
        // x = d·q with q uniform on −127..=127 (−128 → 0: llama.cpp's quantizer never writes
        // −128, and kernels may assume so): E[q²] = 2·(127·128·255/6)/256.
        TensorType::Q8_0 => {
            let d = f16_bits(WEIGHT_STD / (127.0f32 * 255.0 / 6.0).sqrt());
            for block in data.chunks_exact_mut(34) {
                block[..2].copy_from_slice(&d);
                rng.fill(&mut block[2..]);
                for q in &mut block[2..] {
                    if *q == 0x80 {
                        *q = 0;
                    }
                }
            }
        }
        // x = d·scale·(q − 32), q uniform on 0..64 (random ql, qh): E[(q − 32)²] = 341.5; the
        // i8 sub-block scales ±(8..=15) with random signs (which cancel q − 32's mean of −0.5):
        // E[scale²] = 137.5.
        TensorType::Q6_K => {
            let d = f16_bits(WEIGHT_STD / (341.5f32 * 137.5).sqrt());
            for block in data.chunks_exact_mut(210) {
                rng.fill(&mut block[..192]);
                let scales = rng
                    .next()
                    .to_le_bytes()
                    .into_iter()
                    .chain(rng.next().to_le_bytes());
                for (s, r) in block[192..208].iter_mut().zip(scales) {
                    let magnitude = 8 + (r & 7) as i8;
                    let scale = if r & 8 == 0 { magnitude } else { -magnitude };
                    *s = scale as u8;
                }
                block[208..].copy_from_slice(&d);
            }
        }
        other => unreachable!("synthetic models have no {other} matrices"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RopeStyle;
    use crate::cpu::{CpuSession, Logits};
    use crate::model::{Matrix, Model, ModelBytes};

    /// A shape with fewer layers: the per-layer tensors are all alike, and the big shapes' full
    /// files (up to 3.3 GB) would make the tests slow.
    fn reduced(shape: SyntheticShape, weights: SyntheticWeights, n_layers: usize) -> Model {
        let bytes = reduced_gguf(shape, weights, n_layers, 7).unwrap();
        Model::load(ModelBytes::Owned(bytes)).unwrap()
    }

    /// Mean and standard deviation of a matrix's dequantized values (its first 256 rows).
    fn stats(model: &Model, m: &Matrix) -> (f64, f64) {
        let rows = m.rows.min(256);
        let mut values = vec![0f32; rows * m.cols];
        let row_bytes = m.len / m.rows;
        lean_quant::dequantize_row(m.ty, &model.data(m)[..rows * row_bytes], &mut values);
        assert!(values.iter().all(|v| v.is_finite()), "{}", m.name);
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    }

    /// Parameter counts extrapolated from a one-layer build, against the published ones as
    /// rounded there (HF model pages: SmolLM2-360M "362M", SmolLM2-1.7B "1.71B", Llama-3.2-1B
    /// "1.24B"; Qwen2.5 and Qwen3 model cards: total and non-embedding; the Gemma 3 technical
    /// report: 1B = 302M embedding + 698M non-embedding): a check of every tensor's shape against
    /// an outside source. `rope_freqs.weight` is a constant, no parameter.
    fn check_parameter_count(model: &Model, n_layers: usize, unit: f64, total: f64, rest: f64) {
        let all: usize = model.gguf.tensors.iter().map(|t| t.n_elements()).sum();
        let embd = model.gguf.tensor("token_embd.weight").unwrap().n_elements();
        let rope_freqs = model
            .gguf
            .tensor("rope_freqs.weight")
            .map_or(0, |t| t.n_elements());
        let final_norm = model.config.n_embd;
        let per_layer = all - embd - final_norm - rope_freqs;
        let full = (embd + final_norm + per_layer * n_layers) as f64;
        assert_eq!((full / unit).round(), total, "{full}");
        if rest > 0.0 {
            assert_eq!(((full - embd as f64) / unit).round(), rest, "{full}");
        }
    }

    #[test]
    fn every_shape_loads_with_its_config_types_and_parameter_count() {
        // (shape, arch, layers, d, heads, kv heads, head_dim, ffn, vocab, rope base, eps, ctx,
        //  published parameter count: unit, total, non-embedding or 0 where unpublished)
        #[rustfmt::skip]
        let table = [
            (SyntheticShape::SmolLm2_360M, Architecture::Llama, 32, 960, 15, 5, 64, 2560, 49152, 100_000.0, 1e-5, 8192, (1e6, 362.0, 0.0)),
            (SyntheticShape::Qwen2_5_0_5B, Architecture::Qwen2, 24, 896, 14, 2, 64, 4864, 151936, 1e6, 1e-6, 32768, (1e7, 49.0, 36.0)),
            (SyntheticShape::SmolLm2_1_7B, Architecture::Llama, 24, 2048, 32, 32, 64, 8192, 49152, 130_000.0, 1e-5, 8192, (1e7, 171.0, 0.0)),
            (SyntheticShape::Qwen2_5_3B, Architecture::Qwen2, 36, 2048, 16, 2, 128, 11008, 151936, 1e6, 1e-6, 32768, (1e7, 309.0, 277.0)),
            (SyntheticShape::Llama3_2_1B, Architecture::Llama, 16, 2048, 32, 8, 64, 8192, 128256, 500_000.0, 1e-5, 131072, (1e7, 124.0, 0.0)),
            (SyntheticShape::Qwen3_1_7B, Architecture::Qwen3, 28, 2048, 16, 8, 128, 6144, 151936, 1e6, 1e-6, 40960, (1e8, 17.0, 14.0)),
            (SyntheticShape::Gemma3_1B, Architecture::Gemma3, 26, 1152, 4, 1, 256, 6912, 262144, 1e6, 1e-6, 32768, (1e6, 1000.0, 698.0)),
        ];
        for (shape, arch, layers, d, heads, kv, hd, ff, vocab, base, eps, ctx, params) in table {
            assert_eq!(shape.params().n_layers, layers, "{shape}");
            for weights in SyntheticWeights::ALL {
                let model = reduced(shape, weights, 1);
                let (unit, total, rest) = params;
                check_parameter_count(&model, layers, unit, total, rest);
                let c = &model.config;
                assert_eq!(
                    (
                        c.arch,
                        c.n_layers,
                        c.n_embd,
                        c.n_heads,
                        c.n_kv_heads,
                        c.head_dim
                    ),
                    (arch, 1, d, heads, kv, hd),
                    "{shape}"
                );
                assert_eq!(
                    (c.n_ff, c.vocab_size, c.ropes[0].dim),
                    (ff, vocab, hd),
                    "{shape}"
                );
                assert_eq!(
                    (c.ropes[0].base, c.rms_eps, c.train_context_length),
                    (base, eps, ctx)
                );
                let style = if arch == Architecture::Llama {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::Neox
                };
                assert_eq!(c.ropes[0].style, style);
                assert!(model.weights.tied_output);
                assert_eq!(model.vocabulary().unwrap().len(), vocab);

                let embd = match (weights, d % 256) {
                    (SyntheticWeights::Q4_0, 0) => TensorType::Q6_K,
                    _ => TensorType::Q8_0,
                };
                assert_eq!(model.weights.token_embd.ty, embd, "{shape} {weights}");
                let l = &model.weights.layers[0];
                for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                    assert_eq!(m.ty, weights.matrix_type(), "{}", m.name);
                }
                let qk_norms = matches!(arch, Architecture::Qwen3 | Architecture::Gemma3);
                let post_norms = arch == Architecture::Gemma3;
                let rope_freqs = shape == SyntheticShape::Llama3_2_1B;
                assert_eq!(l.bq.is_some(), arch == Architecture::Qwen2);
                assert_eq!(c.block.qk_norm, qk_norms, "{shape}");
                assert_eq!(l.q_norm.is_some() && l.k_norm.is_some(), qk_norms);
                assert_eq!(c.block.post_norms, post_norms, "{shape}");
                assert_eq!(
                    l.post_attn_norm.is_some() && l.post_ffn_norm.is_some(),
                    post_norms
                );
                assert_eq!(c.ropes[0].freq_factors.is_some(), rope_freqs, "{shape}");
                let f32s = model
                    .gguf
                    .tensors
                    .iter()
                    .filter(|t| t.ty == TensorType::F32)
                    .count();
                let expected = 3
                    + 3 * usize::from(arch == Architecture::Qwen2)
                    + 2 * usize::from(qk_norms)
                    + 2 * usize::from(post_norms)
                    + usize::from(rope_freqs);
                assert_eq!(f32s, expected, "{shape}");
            }
        }
    }

    #[test]
    fn llama3_rope_factors_are_the_converters() {
        let model = reduced(SyntheticShape::Llama3_2_1B, SyntheticWeights::Q4_0, 1);
        let factors = model.config.ropes[0].freq_factors.as_ref().unwrap();
        assert_eq!(factors.len(), 32);
        // Computed by scripts/make_test_models.py's llama3_rope_factors (float32 arithmetic)
        // for Llama 3.2's rope_scaling and rope_theta.
        let expected: &[(usize, f32)] = &[
            (0, 1.0),
            (14, 1.0),
            (15, 1.651_329_3),
            (16, 3.292_262_8),
            (17, 9.666_731),
            (18, 32.0),
            (31, 32.0),
        ];
        for &(i, f) in expected {
            assert_eq!(factors[i], f, "factor {i}");
        }
    }

    #[test]
    fn gemma3_has_its_windows_and_ropes() {
        let model = reduced(SyntheticShape::Gemma3_1B, SyntheticWeights::Q4_0, 6);
        let c = &model.config;
        let bases: Vec<f32> = c.ropes.iter().map(|r| r.base).collect();
        assert_eq!(bases, [1e6, 10_000.0]);
        let windows: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
        assert_eq!(
            windows,
            [Some(512), Some(512), Some(512), Some(512), Some(512), None]
        );
        assert_eq!(c.block.attention_scale, 1.0 / 16.0);
        assert_eq!(c.block.activation, crate::config::Activation::GeluTanh);
        assert_eq!(c.block.embedding_scale, Some((1152f64).sqrt() as f32));
    }

    #[test]
    fn weights_have_the_intended_distribution() {
        for weights in SyntheticWeights::ALL {
            let model = reduced(SyntheticShape::SmolLm2_1_7B, weights, 1);
            let (w, l) = (&model.weights, &model.weights.layers[0]);
            for m in [&w.token_embd, &l.wq, &l.w_down] {
                let (mean, std) = stats(&model, m);
                assert!(mean.abs() < 2e-3, "{weights} {}: mean {mean}", m.name);
                assert!(
                    (std - 0.02).abs() < 0.001,
                    "{weights} {}: std {std}",
                    m.name
                );
            }
            for norm in [
                &model.weights.output_norm,
                &model.weights.layers[0].ffn_norm,
            ] {
                assert!(norm.iter().all(|v| (0.95..=1.05).contains(v)));
            }
        }
        let qwen = reduced(SyntheticShape::Qwen2_5_0_5B, SyntheticWeights::Q8_0, 1);
        let bias = qwen.weights.layers[0].bq.as_ref().unwrap();
        let std = (bias.iter().map(|v| v * v).sum::<f32>() / bias.len() as f32).sqrt();
        assert!((std - 0.02).abs() < 0.002, "bias std {std}");
    }

    #[test]
    fn the_same_seed_gives_the_same_bytes() {
        let mut p = SyntheticShape::SmolLm2_360M.params();
        p.n_layers = 2;
        let a = build(&p, "t", SyntheticWeights::Q4_0, 1).unwrap();
        assert_eq!(a, build(&p, "t", SyntheticWeights::Q4_0, 1).unwrap());
        let b = build(&p, "t", SyntheticWeights::Q4_0, 2).unwrap();
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
    }

    #[test]
    fn a_forward_pass_gives_finite_varied_logits() {
        for weights in SyntheticWeights::ALL {
            let model = reduced(SyntheticShape::Qwen2_5_0_5B, weights, 2);
            let mut session = CpuSession::new(&model, 8);
            let mut rows = Vec::new();
            session
                .forward(&model, &[1, 2, 3], Logits::All, |_, l| {
                    rows.push(l.to_vec())
                })
                .unwrap();
            session
                .forward(&model, &[4], Logits::Last, |_, l| rows.push(l.to_vec()))
                .unwrap();
            assert_eq!(rows.len(), 4);
            for l in &rows {
                assert!(l.iter().all(|v| v.is_finite()), "{weights}");
                let max = l.iter().fold(f32::MIN, |a, &b| a.max(b));
                let min = l.iter().fold(f32::MAX, |a, &b| a.min(b));
                // Random weights: logits spread, but not to absurd magnitudes.
                assert!(
                    max - min > 0.5 && max.abs() < 100.0,
                    "{weights}: {min}..{max}"
                );
            }
            assert_ne!(rows[0], rows[1]);
        }
    }

    /// The newer blocks (llama3 rope factors, q/k norms, post-norms and GELU, sliding windows)
    /// through a CPU forward pass: finite, varied logits. Gemma 3 with six layers (five local,
    /// one global) and a window of 2, so that the window cuts into a short prompt.
    #[test]
    fn the_newer_shapes_forward_to_finite_logits() {
        for (shape, n_layers) in [
            (SyntheticShape::Llama3_2_1B, 2),
            (SyntheticShape::Qwen3_1_7B, 2),
            (SyntheticShape::Gemma3_1B, 6),
        ] {
            let mut p = shape.params();
            p.n_layers = n_layers;
            if p.sliding_window.is_some() {
                p.sliding_window = Some(2);
            }
            let bytes = build(&p, shape.name(), SyntheticWeights::Q4_0, 7).unwrap();
            let model = Model::load(ModelBytes::Owned(bytes)).unwrap();
            let mut session = CpuSession::new(&model, 8);
            let mut rows = Vec::new();
            session
                .forward(&model, &[1, 2, 3, 4], Logits::Last, |_, l| {
                    rows.push(l.to_vec())
                })
                .unwrap();
            session
                .forward(&model, &[5], Logits::Last, |_, l| rows.push(l.to_vec()))
                .unwrap();
            assert_eq!(rows.len(), 2);
            for l in &rows {
                assert!(l.iter().all(|v| v.is_finite()), "{shape}");
                let max = l.iter().fold(f32::MIN, |a, &b| a.max(b));
                let min = l.iter().fold(f32::MAX, |a, &b| a.min(b));
                assert!(
                    max - min > 0.5 && max.abs() < 100.0,
                    "{shape}: {min}..{max}"
                );
            }
            assert_ne!(rows[0], rows[1], "{shape}");
        }
    }

    #[test]
    fn names_parse_back() {
        for shape in SyntheticShape::ALL {
            assert_eq!(shape.name().parse::<SyntheticShape>().unwrap(), shape);
        }
        assert_eq!(
            SyntheticWeights::parse("Q8_0").unwrap(),
            SyntheticWeights::Q8_0
        );
        let err = SyntheticShape::parse("llama-70b").unwrap_err().to_string();
        assert!(
            err.contains("llama-70b") && err.contains("qwen2.5-3b"),
            "{err}"
        );
        assert!(SyntheticWeights::parse("q4_k")
            .unwrap_err()
            .to_string()
            .contains("q4_k"));
    }
}
