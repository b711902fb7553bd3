//! Tokenizer and chat template.
//!
//! Loads a Hugging Face `tokenizer.json` (through the `tokenizers` crate, fancy-regex engine on
//! every target), the tokenizer's `tokenizer_config.json` and its chat template, and reproduces
//! what transformers 5 does with them: `encode`/`decode` give the ids and text of
//! `AutoTokenizer.encode/decode`, and `apply_chat_template` renders (with minijinja, configured
//! like transformers' jinja environment) the text of `apply_chat_template(tokenize=False)`.
//!
//! No file system access outside [`Tokenizer::from_path`], which is native-only.

mod chat;
mod error;
mod gguf;
mod stream;

use std::collections::HashSet;

use serde_json::Value as Json;

pub use chat::{ChatMessage, FullChatMessage};
pub use error::TokenizerError;
/// Byte-level BPE's alphabet: which character stands for each byte (GPT-2's `bytes_to_unicode`).
pub use gguf::byte_level::byte_alphabet as byte_level_alphabet;
pub use stream::StreamDecoder;

/// The named special tokens transformers passes to chat templates (`special_tokens_map`), in its
/// order (`SPECIAL_TOKENS_ATTRIBUTES`).
const SPECIAL_TOKEN_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Added special tokens that end a turn or a document in common chat formats; generation stops at
/// them besides the configured eos token (the rule llama.cpp uses for its end-of-generation set).
const END_OF_GENERATION_TOKENS: [&str; 9] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
];

/// A Hugging Face tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `len(tokenizer)` in transformers: distinct tokens, added tokens included.
    vocab_size: usize,
    /// One past the largest id the tokenizer knows.
    id_limit: u32,
    /// (attribute, token text) for the special tokens tokenizer_config.json names.
    special_tokens: Vec<(&'static str, String)>,
    eos_token_ids: Vec<u32>,
    chat: Result<chat::ChatTemplate, TokenizerError>,
    /// Built from a GGUF's own metadata: its vocabulary is the model's by construction.
    from_gguf: bool,
}

impl Tokenizer {
    /// Builds a tokenizer from `tokenizer.json` bytes, optional `tokenizer_config.json` bytes and
    /// optional chat template text. As in transformers, a given chat template (the content of
    /// `chat_template.jinja`) replaces the config's `"chat_template"`, which may be a string or a
    /// list of `{name, template}` (the one named `default` is used).
    pub fn from_bytes(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&[u8]>,
        chat_template: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        // The whole JSON first (syntax, UTF-8, escapes): tokenizers 0.22 panics (an `expect` in
        // its decoder's deserializer) on an error inside the "decoder" object instead of
        // returning it (found by fuzzing: fuzz/corpus/tokenizer_json/decoder-*.json). A parse
        // into a Value, not IgnoredAny, which skips strings without checking their UTF-8.
        serde_json::from_slice::<Json>(tokenizer_json)
            .map_err(|e| TokenizerError::TokenizerJson(e.to_string()))?;
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| TokenizerError::TokenizerJson(e.to_string()))?;
        let config = match tokenizer_config {
            Some(bytes) => parse_config(bytes)?,
            None => Json::Null,
        };
        Tokenizer::from_parts(inner, &config, chat_template, false)
    }

    /// Builds the tokenizer a GGUF describes in its metadata (`tokenizer.ggml.*`, and
    /// `tokenizer.chat_template`), as transformers' `AutoTokenizer.from_pretrained(dir,
    /// gguf_file=...)` builds it, for a model file that comes without a tokenizer.json.
    /// A `tokenizer_config.json` given explicitly overrides the keys it sets (its chat template,
    /// special tokens, class); a chat template text given explicitly replaces both.
    pub fn from_gguf(
        gguf: &lean_gguf::Gguf,
        tokenizer_config: Option<&[u8]>,
        chat_template: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        let gguf::Built { inner, mut config } = gguf::build(gguf)?;
        if let Some(bytes) = tokenizer_config {
            if let (Json::Object(explicit), Json::Object(derived)) =
                (parse_config(bytes)?, &mut config)
            {
                derived.extend(explicit);
            }
        }
        Tokenizer::from_parts(inner, &config, chat_template, true)
    }

    /// Whether this tokenizer was built from a GGUF's own metadata.
    pub fn is_from_gguf(&self) -> bool {
        self.from_gguf
    }

    fn from_parts(
        mut inner: tokenizers::Tokenizer,
        config: &Json,
        chat_template: Option<&str>,
        from_gguf: bool,
    ) -> Result<Tokenizer, TokenizerError> {
        apply_transformers_class_pipeline(&mut inner, config)?;

        let (vocab_size, id_limit) = vocab_extent(&inner);

        let mut special_tokens = Vec::new();
        for attribute in SPECIAL_TOKEN_ATTRIBUTES {
            if let Some(text) = special_token_text(config, attribute)? {
                special_tokens.push((attribute, text));
            }
        }
        let eos_token_ids = end_of_generation_ids(&inner, &special_tokens);
        let chat = chat::ChatTemplate::resolve(config, chat_template)
            .and_then(chat::ChatTemplate::compile);
        Ok(Tokenizer {
            inner,
            vocab_size,
            id_limit,
            special_tokens,
            eos_token_ids,
            chat,
            from_gguf,
        })
    }

    /// Loads `tokenizer.json`, and `tokenizer_config.json` and `chat_template.jinja` where present,
    /// from a directory, or from the directory of the given `tokenizer.json` file.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_path(path: &std::path::Path) -> Result<Tokenizer, TokenizerError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| TokenizerError::Io {
                path: p.display().to_string(),
                message: e.to_string(),
            })
        };
        let (tokenizer_file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            (
                path.to_path_buf(),
                path.parent().map(|p| p.to_path_buf()).unwrap_or_default(),
            )
        };
        let tokenizer_json = read(&tokenizer_file)?;
        let config_file = dir.join("tokenizer_config.json");
        let config = if config_file.is_file() {
            Some(read(&config_file)?)
        } else {
            None
        };
        let template_file = dir.join("chat_template.jinja");
        let template = if template_file.is_file() {
            let bytes = read(&template_file)?;
            Some(String::from_utf8(bytes).map_err(|_| TokenizerError::Io {
                path: template_file.display().to_string(),
                message: "not valid UTF-8".into(),
            })?)
        } else {
            None
        };
        Tokenizer::from_bytes(&tokenizer_json, config.as_deref(), template.as_deref())
    }

    /// The ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. a bos
    /// token), as transformers' `encode(text, add_special_tokens=...)`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`. Ids the tokenizer does not know decode to nothing, as in transformers.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Number of distinct tokens, added tokens included (transformers' `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The `tokenizers` tokenizer inside: its model vocabulary, added tokens and decoder (what
    /// lean-constraint needs to map every token to the bytes it stands for).
    pub fn hf_tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// `bos_token` of tokenizer_config.json.
    pub fn bos_token(&self) -> Option<&str> {
        self.special_token("bos_token")
    }

    /// `eos_token` of tokenizer_config.json.
    pub fn eos_token(&self) -> Option<&str> {
        self.special_token("eos_token")
    }

    /// The id of [`Tokenizer::eos_token`]: the only stop id of transformers' `generate` when the
    /// model has no generation_config.json listing more.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token().and_then(|t| self.token_to_id(t))
    }

    /// The ids generation stops at: the eos token's id first, then every *special* added token
    /// named like a common end-of-turn/end-of-text marker (`<|im_end|>`, `<|endoftext|>`,
    /// `<|eot_id|>`, `<|eom_id|>`, `<|end_of_text|>`, `<|end|>`, `<end_of_turn>`, `<EOT>`,
    /// DeepSeek's end of sentence), the set llama.cpp stops at. Qwen2.5 gives [151645, 151643],
    /// as its generation_config.json does.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_ids.clone()
    }

    /// Whether a chat template was given and compiles.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_ok()
    }

    /// Replaces the chat template with `source` (as a `chat_template.jinja` given at load does);
    /// one that does not compile makes the chat calls fail with its error, as at load.
    pub fn set_chat_template(&mut self, source: &str) {
        self.chat = chat::ChatTemplate::compile(source.to_string());
    }

    /// Pins the time (Unix seconds, rendered as UTC) that the templates' `strftime_now` sees;
    /// `None` goes back to the system clock. wasm32 has no clock, so set it there before
    /// rendering a template that asks for the date.
    pub fn set_template_time(&mut self, unix_seconds: Option<i64>) {
        if let Ok(chat) = &self.chat {
            chat.set_time(unix_seconds);
        }
    }

    /// Renders the chat as transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)` does.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// `apply_chat_template` with extra template variables, as transformers'
    /// `apply_chat_template(..., **kwargs)` (OpenAI servers' `chat_template_kwargs`): e.g.
    /// Qwen3's `enable_thinking: false`, Llama 3.x's `date_string`. They override the special
    /// tokens' names; `messages` and `add_generation_prompt` are refused.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Json>,
    ) -> Result<String, TokenizerError> {
        self.render_chat(messages, add_generation_prompt, kwargs)
    }

    /// `apply_chat_template_with` over messages with tool calls and tool results
    /// ([`FullChatMessage`]); the tools themselves go in `kwargs` as `tools`, as transformers'
    /// `apply_chat_template(messages, tools=...)`.
    pub fn apply_chat_template_full(
        &self,
        messages: &[FullChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Json>,
    ) -> Result<String, TokenizerError> {
        self.render_chat(messages, add_generation_prompt, kwargs)
    }

    /// `encode_chat_with` over [`FullChatMessage`]s (`apply_chat_template_full`).
    pub fn encode_chat_full(
        &self,
        messages: &[FullChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Json>,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.apply_chat_template_full(messages, add_generation_prompt, kwargs)?;
        self.encode(&text, false)
    }

    fn render_chat<M: serde::Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Json>,
    ) -> Result<String, TokenizerError> {
        if let Some(name) = ["messages", "add_generation_prompt"]
            .into_iter()
            .find(|name| kwargs.contains_key(*name))
        {
            return Err(TokenizerError::Template(format!(
                "the chat template's extra variables may not set '{name}'"
            )));
        }
        let chat = self.chat.as_ref().map_err(Clone::clone)?;
        if messages.is_empty() {
            // transformers refuses too, before rendering.
            return Err(TokenizerError::Template(
                "cannot apply the chat template to an empty conversation".into(),
            ));
        }
        chat.render(
            messages,
            add_generation_prompt,
            &self.special_tokens,
            kwargs,
        )
    }

    /// The ids of transformers' `apply_chat_template(..., tokenize=True)`: the rendered text
    /// encoded with `add_special_tokens=False`.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// `encode_chat` with extra template variables (`apply_chat_template_with`).
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Json>,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.apply_chat_template_with(messages, add_generation_prompt, kwargs)?;
        self.encode(&text, false)
    }

    /// Checks that this tokenizer belongs to a model whose GGUF vocabulary
    /// (`tokenizer.ggml.tokens`) is `gguf_tokens`: every id the tokenizer knows must be spelled
    /// the same there. The model may have more tokens (padding rows) than the tokenizer.
    pub fn check_vocab(&self, gguf_tokens: &[&str]) -> Result<(), TokenizerError> {
        let tokenizer_ids = self.id_limit as usize;
        if tokenizer_ids > gguf_tokens.len() {
            return Err(TokenizerError::VocabSize {
                tokenizer: tokenizer_ids,
                model: gguf_tokens.len(),
            });
        }
        if self.from_gguf {
            // Built from these very tokens; a few may be respelled (byte-level vocabularies spell
            // tokens outside the byte alphabet by their bytes), so only the count is checked.
            return Ok(());
        }
        for (id, &model_token) in (0..self.id_limit).zip(gguf_tokens) {
            match self.id_to_token(id) {
                Some(token) if token == model_token => {}
                // Gemma's GGUFs store whitespace tokens with real spaces ("  "); the
                // tokenizer.json transformers converts spells them "▁▁".
                Some(token) if same_whitespace_token(&token, model_token) => {}
                tokenizer_token => {
                    return Err(TokenizerError::VocabToken {
                        id,
                        tokenizer: tokenizer_token,
                        model: model_token.to_string(),
                    })
                }
            }
        }
        Ok(())
    }

    fn special_token(&self, attribute: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(a, _)| *a == attribute)
            .map(|(_, t)| t.as_str())
    }
}

/// Whether `tokenizer` is `gguf`'s whitespace-only token respelled as transformers' Gemma
/// conversion does: one "▁" per character (Gemma's GGUFs store such tokens with real spaces).
fn same_whitespace_token(tokenizer: &str, gguf: &str) -> bool {
    gguf.contains(' ')
        && gguf.chars().all(char::is_whitespace)
        && tokenizer.chars().count() == gguf.chars().count()
        && tokenizer.chars().all(|c| c == '\u{2581}')
}

/// tokenizer_config.json's bytes: a JSON object.
fn parse_config(bytes: &[u8]) -> Result<Json, TokenizerError> {
    let config = serde_json::from_slice::<Json>(bytes)
        .map_err(|e| TokenizerError::Config(format!("not valid JSON: {e}")))?;
    if !config.is_object() {
        return Err(TokenizerError::Config(
            "the top level is not a JSON object".into(),
        ));
    }
    Ok(config)
}

/// (`len(tokenizer)`, one past the largest id), without `get_vocab`, which copies the whole
/// vocabulary (60 ms for Qwen's 152k tokens).
fn vocab_extent(inner: &tokenizers::Tokenizer) -> (usize, u32) {
    use tokenizers::Model;
    let model = inner.get_model();
    let model_size = model.get_vocab_size();
    let added = inner.get_added_vocabulary().get_added_tokens_decoder();
    // transformers counts distinct token strings: an added token the model also has counts once.
    let added_only = added
        .values()
        .filter(|token| model.token_to_id(&token.content).is_none())
        .count();
    let mut id_limit = added
        .keys()
        .map(|&id| id.saturating_add(1))
        .fold(u32::try_from(model_size).unwrap_or(u32::MAX), u32::max);
    // Model ids past its size (a sparse vocabulary) still count as known ids.
    while id_limit < u32::MAX && inner.id_to_token(id_limit).is_some() {
        id_limit += 1;
    }
    (model_size + added_only, id_limit)
}

/// A special token of tokenizer_config.json: a string, or an AddedToken object (`{"content": ...}`).
fn special_token_text(config: &Json, attribute: &str) -> Result<Option<String>, TokenizerError> {
    match config.get(attribute) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(text)) => Ok(Some(text.clone())),
        Some(Json::Object(token)) => match token.get("content") {
            Some(Json::String(text)) => Ok(Some(text.clone())),
            _ => Err(TokenizerError::Config(format!(
                "{attribute} is an object without a string \"content\""
            ))),
        },
        Some(other) => Err(TokenizerError::Config(format!(
            "{attribute} is neither a string nor an object: {other}"
        ))),
    }
}

fn end_of_generation_ids(
    inner: &tokenizers::Tokenizer,
    special_tokens: &[(&'static str, String)],
) -> Vec<u32> {
    let added = inner.get_added_vocabulary();
    let eos = special_tokens
        .iter()
        .find(|(a, _)| *a == "eos_token")
        .and_then(|(_, t)| inner.token_to_id(t));
    let markers = END_OF_GENERATION_TOKENS
        .iter()
        .filter(|token| added.is_special_token(token))
        .filter_map(|token| inner.token_to_id(token));
    let mut seen = HashSet::new();
    eos.into_iter()
        .chain(markers)
        .filter(|id| seen.insert(*id))
        .collect()
}

/// transformers 5 does not take tokenizer.json's pipeline as-is for tokenizer classes that define
/// their own: it keeps the file's vocabulary, merges and added tokens and rebuilds normalizer,
/// pre-tokenizer and decoder as the class's `__init__` does. Qwen2Tokenizer is the one our
/// models use (GGUF-converted Qwen tokenizer.json files lack its NFC normalizer); other classes
/// keep the file's pipeline.
fn apply_transformers_class_pipeline(
    inner: &mut tokenizers::Tokenizer,
    config: &Json,
) -> Result<(), TokenizerError> {
    use tokenizers::pre_tokenizers::{byte_level::ByteLevel, sequence::Sequence};
    use tokenizers::{normalizers::NFC, PreTokenizerWrapper};

    let class = config
        .get("tokenizer_class")
        .and_then(Json::as_str)
        .unwrap_or("");
    if class != "Qwen2Tokenizer" && class != "Qwen2TokenizerFast" {
        return Ok(());
    }
    let add_prefix_space = config
        .get("add_prefix_space")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    inner.with_normalizer(Some(NFC));
    inner.with_decoder(Some(ByteLevel::default()));
    // A tokenizer built from a Qwen GGUF has this pre-tokenizer already: compiling the regex
    // again would double the build's largest cost (~1.5 ms).
    let current = inner
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_value(p).ok());
    if current == Some(qwen2_pre_tokenizer_json(add_prefix_space)) {
        return Ok(());
    }
    let split = constant_regex_split(QWEN2_PRETOKENIZE_REGEX)
        .map_err(|e| TokenizerError::TokenizerJson(format!("Qwen2 pre-tokenizer regex: {e}")))?;
    inner.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(add_prefix_space, true, false)),
    ])));
    Ok(())
}

/// transformers/models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX.
pub(crate) const QWEN2_PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenizer as `tokenizers` serializes it (checked against the built one in a test):
/// its split regex, then byte-level without a regex of its own.
fn qwen2_pre_tokenizer_json(add_prefix_space: bool) -> Json {
    serde_json::json!({
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PRETOKENIZE_REGEX},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": true,
             "use_regex": false},
        ]
    })
}

/// A Split pre-tokenizer (isolating its matches) on `regex`, one of transformers' constant
/// patterns, never input. Under cargo-fuzz (`cfg(fuzzing)`) on a stand-in: tokenizers compiles
/// one of these in ~1.5 ms, most of a GGUF tokenizer's build, while the fuzzer is there for
/// what the metadata drives. (The real patterns: tests/gguf_metadata.rs and the parity tests.)
pub(crate) fn constant_regex_split(
    regex: &'static str,
) -> tokenizers::Result<tokenizers::pre_tokenizers::split::Split> {
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    #[cfg(fuzzing)]
    let regex = {
        let _ = regex;
        r"\s+|\S+"
    };
    Split::new(
        SplitPattern::Regex(regex.into()),
        tokenizers::SplitDelimiterBehavior::Isolated,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON that lets a Qwen GGUF's tokenizer keep its pre-tokenizer is the one `tokenizers`
    /// writes for the built one (were it not, the regex would only be compiled twice again).
    #[test]
    fn qwen2s_pre_tokenizer_json_is_the_built_ones() {
        use tokenizers::pre_tokenizers::{byte_level::ByteLevel, sequence::Sequence};
        use tokenizers::PreTokenizerWrapper;
        for add_prefix_space in [false, true] {
            let built = PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Split(constant_regex_split(QWEN2_PRETOKENIZE_REGEX).unwrap()),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(add_prefix_space, true, false)),
            ]));
            assert_eq!(
                serde_json::to_value(&built).unwrap(),
                qwen2_pre_tokenizer_json(add_prefix_space)
            );
        }
    }
}
