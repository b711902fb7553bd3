//! A loaded model: configuration, weight views over the file's bytes, and the architecture files
//! that map GGUF tensors onto the transformer (one file per architecture).
mod llama;
mod qwen2;
mod weights;

pub use weights::{LayerWeights, Matrix, Weights};

use crate::config::{Architecture, ModelConfig};
use crate::error::Result;
use lean_gguf::Gguf;

/// The bytes of a GGUF file: memory-mapped natively, an owned buffer on wasm (or when asked).
pub enum ModelBytes {
    #[cfg(feature = "mmap")]
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl ModelBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            #[cfg(feature = "mmap")]
            ModelBytes::Mmap(m) => m,
            ModelBytes::Owned(v) => v,
        }
    }

    /// Memory-maps a file read-only: weights are paged in on use and shared with the page cache,
    /// so peak memory stays close to the file size.
    #[cfg(feature = "mmap")]
    pub fn map_file(path: &std::path::Path) -> Result<Self> {
        let io = |source| crate::error::LeanError::Io {
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
        let gguf = Gguf::parse(bytes.as_slice())?;
        let config = ModelConfig::from_gguf(&gguf)?;
        let loader = weights::Loader {
            gguf: &gguf,
            bytes: bytes.as_slice(),
            config: &config,
        };
        let weights = match config.arch {
            Architecture::Llama => llama::load(&loader)?,
            Architecture::Qwen2 => qwen2::load(&loader)?,
        };
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

    /// The packed bytes of a weight matrix.
    #[inline]
    pub fn data(&self, m: &Matrix) -> &[u8] {
        &self.bytes.as_slice()[m.offset..m.offset + m.len]
    }

    pub fn file_size(&self) -> usize {
        self.bytes.as_slice().len()
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
