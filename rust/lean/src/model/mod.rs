//! A loaded model: configuration, weight views over the file's bytes, and the architecture files
//! that map GGUF tensors onto the transformer (one file per architecture).
mod gemma3;
mod llama;
mod qwen2;
mod qwen3;
mod weights;

pub use weights::{LayerWeights, Matrix, Weights};

use crate::config::{Architecture, ModelConfig};
use crate::error::{LeanError, Result};
use lean_gguf::Gguf;

/// The bytes of a GGUF file: memory-mapped natively, an owned buffer on wasm (or when asked), or
/// only part of it when the weight matrices went straight to a GPU (`Partial`).
pub enum ModelBytes {
    #[cfg(feature = "mmap")]
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
    Partial(PartialBytes),
}

/// The header of a GGUF file and the tensors kept on the host (the small 1-D ones: norms,
/// biases), each at its file offset; the weight matrices live on a device, uploaded while the
/// file streamed in (lean-gpu's `StreamedModel`). Only a GPU session can run such a model.
pub struct PartialBytes {
    pub file_len: usize,
    /// The file's first bytes: at least its metadata and tensor infos.
    pub header: Vec<u8>,
    /// (file offset, bytes) of each tensor kept, in any order.
    pub tensors: Vec<(usize, Vec<u8>)>,
}

impl ModelBytes {
    /// The whole file; empty for `Partial` (see `range`).
    pub fn as_slice(&self) -> &[u8] {
        match self {
            #[cfg(feature = "mmap")]
            ModelBytes::Mmap(m) => m,
            ModelBytes::Owned(v) => v,
            ModelBytes::Partial(_) => &[],
        }
    }

    /// The file's size.
    pub fn len(&self) -> usize {
        match self {
            ModelBytes::Partial(p) => p.file_len,
            whole => whole.as_slice().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `offset .. offset + len` of the file, when they are in memory.
    pub fn range(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        match self {
            ModelBytes::Partial(p) => p
                .tensors
                .iter()
                .find(|(start, bytes)| *start <= offset && end <= start + bytes.len())
                .map(|(start, bytes)| &bytes[offset - start..end - start])
                .or_else(|| p.header.get(offset..end)),
            whole => whole.as_slice().get(offset..end),
        }
    }

    /// Whether every byte of the file is in memory (a CPU session needs the weights).
    pub fn is_whole(&self) -> bool {
        !matches!(self, ModelBytes::Partial(_))
    }

    /// Memory-maps a file read-only: weights are paged in on use and shared with the page cache,
    /// so peak memory stays close to the file size.
    #[cfg(feature = "mmap")]
    pub fn map_file(path: &std::path::Path) -> Result<Self> {
        let io = |source| LeanError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; lean never writes through it. A file truncated by another
        // process while mapped would fault, as with any mmap-based loader.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(ModelBytes::Mmap(map))
    }
}

pub struct Model {
    pub config: ModelConfig,
    pub gguf: Gguf,
    pub weights: Weights,
    bytes: ModelBytes,
}

impl Model {
    /// Parses and validates the GGUF, reads the hyper-parameters and checks every tensor the
    /// architecture needs (presence, type, shape) before any compute.
    pub fn load(bytes: ModelBytes) -> Result<Model> {
        let gguf = match &bytes {
            ModelBytes::Partial(p) => Gguf::parse_header(&p.header, p.file_len as u64)?,
            whole => Gguf::parse(whole.as_slice())?,
        };
        let arch = Architecture::from_gguf_name(gguf.architecture()?)?;
        let describe = match arch {
            Architecture::Llama => llama::describe,
            Architecture::Qwen2 => qwen2::describe,
            Architecture::Qwen3 => qwen3::describe,
            Architecture::Gemma3 => gemma3::describe,
        };
        let vector = |name: &str, len: usize| weights::read_vector(&gguf, &bytes, name, len);
        let config = ModelConfig::from_gguf(&gguf, &vector, describe)?;
        // Token ids index the embedding's rows (and the head's): a vocabulary with more tokens
        // than rows would read past them. (Fewer is fine: rows padded for alignment.)
        if let Ok(tokens) = gguf.string_array("tokenizer.ggml.tokens") {
            if tokens.len() > config.vocab_size {
                return Err(LeanError::Model(format!(
                    "tensor 'token_embd.weight' has {} rows but the vocabulary \
                     (tokenizer.ggml.tokens) has {} tokens: their ids would index past it",
                    config.vocab_size,
                    tokens.len()
                )));
            }
        }
        let loader = weights::Loader {
            gguf: &gguf,
            bytes: &bytes,
            config: &config,
        };
        let weights = loader.load()?;
        Ok(Model {
            config,
            gguf,
            weights,
            bytes,
        })
    }

    #[cfg(feature = "mmap")]
    pub fn load_file(path: &std::path::Path) -> Result<Model> {
        Self::load(ModelBytes::map_file(path)?)
    }

    /// The packed bytes of a weight matrix (empty when they are not in memory: see
    /// `has_weight_data`).
    #[inline]
    pub fn data(&self, m: &Matrix) -> &[u8] {
        self.bytes.range(m.offset, m.len).unwrap_or(&[])
    }

    /// A 1-D tensor's values (any type, dequantized), checked to hold `len` of them.
    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        weights::read_vector(&self.gguf, &self.bytes, name, len)
    }

    /// A tensor's bytes in the file (empty when they are not in memory).
    pub(crate) fn tensor_data(&self, info: &lean_gguf::TensorInfo) -> &[u8] {
        self.bytes.range(info.offset, info.size).unwrap_or(&[])
    }

    /// Whether the weight matrices are in memory: false when they streamed straight to a GPU.
    pub fn has_weight_data(&self) -> bool {
        self.bytes.is_whole()
    }

    pub fn file_size(&self) -> usize {
        self.bytes.len()
    }

    /// The GGUF's own vocabulary (`tokenizer.ggml.tokens`), to check a tokenizer against.
    pub fn vocabulary(&self) -> Result<Vec<&str>> {
        Ok(self.gguf.string_array("tokenizer.ggml.tokens")?)
    }

    /// A one-line description: architecture, size and tensor types.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let mut types: Vec<(String, usize)> = Vec::new();
        for t in &self.gguf.tensors {
            match types.iter_mut().find(|(n, _)| *n == t.ty.name()) {
                Some((_, k)) => *k += 1,
                None => types.push((t.ty.name().to_string(), 1)),
            }
        }
        let types: Vec<String> = types.iter().map(|(n, k)| format!("{n}×{k}")).collect();
        format!(
            "{} · {} layers · d={} · heads {}/{} · ffn {} · vocab {} · {}",
            c.arch.name(),
            c.n_layers,
            c.n_embd,
            c.n_heads,
            c.n_kv_heads,
            c.n_ff,
            c.vocab_size,
            types.join(" ")
        )
    }
}
