use std::fmt;

/// Everything that can go wrong loading a tokenizer, rendering a chat or checking a vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerError {
    /// tokenizer.json is not valid JSON or not a tokenizer the `tokenizers` crate understands.
    TokenizerJson(String),
    /// tokenizer_config.json is not valid JSON or has a malformed field.
    Config(String),
    /// A file could not be read.
    Io {
        path: String,
        message: String,
    },
    /// There is no chat template to render with; the text says why.
    NoChatTemplate(String),
    /// The chat template does not compile or failed while rendering (e.g. `raise_exception`).
    Template(String),
    /// The GGUF's tokenizer metadata (`tokenizer.ggml.*`) is missing, malformed or of a kind
    /// lean cannot build; the text names the key and the value.
    Gguf(String),
    Encode(String),
    Decode(String),
    /// The tokenizer knows ids beyond the model's vocabulary.
    VocabSize {
        tokenizer: usize,
        model: usize,
    },
    /// Id `id` is spelled differently (or is missing, `tokenizer: None`) in the tokenizer.
    VocabToken {
        id: u32,
        tokenizer: Option<String>,
        model: String,
    },
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::TokenizerJson(e) => write!(f, "bad tokenizer.json: {e}"),
            TokenizerError::Config(e) => write!(f, "bad tokenizer_config.json: {e}"),
            TokenizerError::Io { path, message } => write!(f, "cannot read {path}: {message}"),
            TokenizerError::NoChatTemplate(why) => write!(f, "no chat template: {why}"),
            TokenizerError::Template(e) => write!(f, "chat template error: {e}"),
            TokenizerError::Gguf(e) => write!(f, "cannot build the tokenizer from the GGUF's metadata: {e}"),
            TokenizerError::Encode(e) => write!(f, "encoding failed: {e}"),
            TokenizerError::Decode(e) => write!(f, "decoding failed: {e}"),
            TokenizerError::VocabSize { tokenizer, model } => write!(
                f,
                "vocabulary mismatch: the tokenizer has ids up to {} but the model's vocabulary has only {model} tokens \
                 ({} too few); this tokenizer does not belong to this model",
                tokenizer - 1,
                tokenizer - model
            ),
            TokenizerError::VocabToken { id, tokenizer: Some(token), model } => write!(
                f,
                "vocabulary mismatch at id {id}: the tokenizer has {token:?}, the model has {model:?}; \
                 this tokenizer does not belong to this model"
            ),
            TokenizerError::VocabToken { id, tokenizer: None, model } => write!(
                f,
                "vocabulary mismatch at id {id}: the tokenizer has no token there, the model has {model:?}; \
                 this tokenizer does not belong to this model"
            ),
        }
    }
}

impl std::error::Error for TokenizerError {}
