//! One error type for everything the engine can refuse.
use std::fmt;

#[derive(Debug)]
pub enum LeanError {
    /// The GGUF file is malformed or lacks a required key.
    Gguf(lean_gguf::GgufError),
    /// The tokenizer files are malformed, or do not belong to the model.
    Tokenizer(lean_tokenizer::TokenizerError),
    /// The GGUF is well-formed but is not a model lean can run (architecture, missing tensor, shape).
    Model(String),
    /// The prompt (plus at least one generated token) does not fit in the context window.
    PromptTooLong {
        prompt_tokens: usize,
        context_length: usize,
    },
    /// An argument is out of range (a sampling parameter, a token id, ...).
    InvalidArgument(String),
    /// The compute backend failed (e.g. no GPU adapter, out of GPU memory).
    Backend(String),
    /// The GPU device was lost (driver reset, the browser reclaimed it, an out-of-memory it did
    /// not survive): its session can run nothing more. An engine whose model weights are in
    /// memory continues on the CPU instead (`Engine::set_device_loss_fallback`).
    DeviceLost(String),
    /// Reading a file failed.
    Io {
        path: String,
        source: std::io::Error,
    },
}

pub type Result<T, E = LeanError> = std::result::Result<T, E>;

impl fmt::Display for LeanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeanError::Gguf(e) => write!(f, "invalid GGUF file: {e}"),
            LeanError::Tokenizer(e) => write!(f, "tokenizer: {e}"),
            LeanError::Model(m) => write!(f, "unsupported model: {m}"),
            LeanError::PromptTooLong { prompt_tokens, context_length } => write!(
                f,
                "the prompt has {prompt_tokens} tokens, which leaves no room to generate in a context of {context_length} tokens (raise --ctx or shorten the prompt)"
            ),
            LeanError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            LeanError::Backend(m) => write!(f, "backend: {m}"),
            LeanError::DeviceLost(m) => write!(f, "device lost: {m}"),
            LeanError::Io { path, source } => write!(f, "{path}: {source}"),
        }
    }
}

impl std::error::Error for LeanError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LeanError::Gguf(e) => Some(e),
            LeanError::Tokenizer(e) => Some(e),
            LeanError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<lean_gguf::GgufError> for LeanError {
    fn from(e: lean_gguf::GgufError) -> Self {
        LeanError::Gguf(e)
    }
}

impl From<lean_tokenizer::TokenizerError> for LeanError {
    fn from(e: lean_tokenizer::TokenizerError) -> Self {
        LeanError::Tokenizer(e)
    }
}
