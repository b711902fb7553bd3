//! The tokenizer a GGUF file describes in its own metadata, for files that come without a
//! tokenizer.json.
//!
//! llama.cpp's converter stores the vocabulary (`tokenizer.ggml.tokens`), the token types, the
//! merges (byte-level BPE) or scores (SentencePiece), the special ids, the add-bos/eos flags, the
//! pre-tokenizer's name (`tokenizer.ggml.pre`) and the chat template (`tokenizer.chat_template`).
//! We build from them the `tokenizers::Tokenizer` that transformers builds
//! (transformers/integrations/gguf/gguf_tokenizer_mapping.py: `get_gguf_tokenizer`,
//! `convert_gguf_tokenizer`), and the tokenizer_config.json it saves beside it, so that a GGUF
//! alone gives the ids that transformers' `tokenizer(text)` gives after
//! `AutoTokenizer.from_pretrained(dir, gguf_file=...)` — and that our tokenizer.json path gives.
//!
//! One builder per `tokenizer.ggml.model`: [`byte_level`] (`gpt2`) and [`sentencepiece`]
//! (`llama`). What both share lives here: reading and checking the metadata, the added tokens
//! (control → special, user-defined → plain), the bos/eos post-processor, and the config.

pub(crate) mod byte_level;
mod sentencepiece;

use lean_gguf::{Gguf, Value};
use serde_json::{json, Map, Value as Json};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use crate::TokenizerError;

/// llama.cpp's token types (`llama_token_type`), as `tokenizer.ggml.token_type` stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_stored(value: i128) -> Option<TokenType> {
        Some(match value {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// The tokenizer metadata of one GGUF, read and checked; strings borrow from the parsed file.
pub(crate) struct GgufVocab<'a> {
    /// `general.architecture`: a few SentencePiece vocabularies are built per architecture.
    pub arch: &'a str,
    /// `tokenizer.ggml.model`: `gpt2`, `llama`, ...
    pub model: &'a str,
    /// `tokenizer.ggml.pre`: the pre-tokenizer a byte-level vocabulary's merges were learned with.
    pub pre: Option<&'a str>,
    pub tokens: Vec<&'a str>,
    /// One per token; `Normal` where the file has no types.
    pub token_types: Vec<TokenType>,
    /// `tokenizer.ggml.scores`, one per token, where present.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges` ("left right"), where present.
    pub merges: Option<Vec<&'a str>>,
    // `tokenizer.ggml.add_space_prefix` is not read: transformers builds SentencePiece
    // tokenizers without it (see sentencepiece.rs).
}

const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPES: &str = "tokenizer.ggml.token_type";
const SCORES: &str = "tokenizer.ggml.scores";
const MERGES: &str = "tokenizer.ggml.merges";

impl<'a> GgufVocab<'a> {
    pub(crate) fn read(gguf: &'a Gguf) -> Result<GgufVocab<'a>, TokenizerError> {
        let model =
            gguf.str_opt("tokenizer.ggml.model")
                .map_err(gguf_error)?
                .ok_or_else(|| {
                    TokenizerError::Gguf(
                "the file has no tokenizer (no tokenizer.ggml.model); give a tokenizer.json".into(),
            )
                })?;
        let arch = gguf
            .str_opt("general.architecture")
            .map_err(gguf_error)?
            .unwrap_or("");
        let pre = gguf.str_opt("tokenizer.ggml.pre").map_err(gguf_error)?;
        let tokens = gguf.string_array(TOKENS).map_err(gguf_error)?;
        if tokens.is_empty() {
            return Err(TokenizerError::Gguf(format!("{TOKENS} is empty")));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TokenizerError::Gguf(format!(
                "{TOKENS} has {} tokens, more than 32-bit ids can number",
                tokens.len()
            )));
        }
        let token_types = match gguf.get(TOKEN_TYPES) {
            None => vec![TokenType::Normal; tokens.len()],
            Some(value) => {
                let items = per_token(TOKEN_TYPES, value, tokens.len())?;
                items
                    .iter()
                    .enumerate()
                    .map(|(id, item)| {
                        item.as_i128()
                            .and_then(TokenType::from_stored)
                            .ok_or_else(|| {
                                TokenizerError::Gguf(format!(
                                    "{TOKEN_TYPES}[{id}] is {item}, not a token type (0 to 6)"
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let scores = match gguf.get(SCORES) {
            None => None,
            Some(value) => {
                let items = per_token(SCORES, value, tokens.len())?;
                Some(
                    items
                        .iter()
                        .enumerate()
                        .map(|(id, item)| match item.as_f64() {
                            Some(score) if score.is_finite() => Ok(score as f32),
                            _ => Err(TokenizerError::Gguf(format!(
                                "{SCORES}[{id}] is {item}, not a finite float"
                            ))),
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
        };
        let merges = match gguf.get(MERGES) {
            None => None,
            Some(_) => Some(gguf.string_array(MERGES).map_err(gguf_error)?),
        };
        Ok(GgufVocab {
            arch,
            model,
            pre,
            tokens,
            token_types,
            scores,
            merges,
        })
    }

    /// The text of the token a `tokenizer.ggml.<key>` id names, checked against the vocabulary.
    fn special_token(&self, gguf: &Gguf, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        let key = format!("tokenizer.ggml.{key}");
        let Some(id) = gguf.u32_opt(&key).map_err(gguf_error)? else {
            return Ok(None);
        };
        match self.tokens.get(id as usize) {
            Some(token) => Ok(Some(token)),
            None => Err(TokenizerError::Gguf(format!(
                "{key} is {id}, past the vocabulary's {} tokens",
                self.tokens.len()
            ))),
        }
    }
}

/// A metadata array that must hold one item per token.
fn per_token<'v>(key: &str, value: &'v Value, count: usize) -> Result<&'v [Value], TokenizerError> {
    let items = value.as_array().ok_or_else(|| {
        TokenizerError::Gguf(format!(
            "{key} is {}, not an array",
            value.type_description()
        ))
    })?;
    if items.len() != count {
        return Err(TokenizerError::Gguf(format!(
            "{key} has {} entries but {TOKENS} has {count} tokens",
            items.len()
        )));
    }
    Ok(items)
}

/// `tokenizer.ggml.merges` as pairs: each entry is two tokens separated by one space.
pub(crate) fn file_merges(merges: &[&str]) -> Result<Vec<(String, String)>, TokenizerError> {
    merges
        .iter()
        .enumerate()
        .map(|(index, merge)| {
            let mut parts = merge.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(left), Some(right), None) => Ok((left.to_string(), right.to_string())),
                _ => Err(TokenizerError::Gguf(format!(
                    "{MERGES}[{index}] is {merge:?}, not two tokens separated by one space"
                ))),
            }
        })
        .collect()
}

fn gguf_error(e: lean_gguf::GgufError) -> TokenizerError {
    TokenizerError::Gguf(e.to_string())
}

/// The pieces `Tokenizer::from_parts` takes: the built tokenizer and the tokenizer_config.json
/// transformers would save beside it.
pub(crate) struct Built {
    pub inner: tokenizers::Tokenizer,
    pub config: Json,
}

/// transformers' `get_gguf_tokenizer` + `convert_gguf_tokenizer`, and the config it saves.
pub(crate) fn build(gguf: &Gguf) -> Result<Built, TokenizerError> {
    let vocab = GgufVocab::read(gguf)?;
    let mut inner = match vocab.model {
        "gpt2" => byte_level::build(&vocab)?,
        "llama" => sentencepiece::build(&vocab)?,
        other => {
            return Err(TokenizerError::Gguf(format!(
                "tokenizer.ggml.model is {other:?}; lean builds \"gpt2\" (byte-level BPE) and \
                 \"llama\" (SentencePiece) tokenizers; give a tokenizer.json for this model"
            )))
        }
    };
    add_typed_tokens(&mut inner, &vocab);

    let mut config = Map::new();
    let mut named = Vec::new();
    for (attribute, key) in [
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ] {
        let token = vocab.special_token(gguf, key)?;
        config.insert(attribute.into(), token.map_or(Json::Null, |t| json!(t)));
        named.extend(token);
    }
    // The named special tokens are special added tokens in transformers too (whole in the text,
    // skipped by decode(skip_special_tokens=True)), whatever their stored type.
    let known: Vec<AddedToken> = named
        .iter()
        .filter(|token| inner.token_to_id(token).is_some())
        .map(|token| AddedToken::from(token.to_string(), true).normalized(false))
        .collect();
    inner.add_special_tokens(&known);

    // SentencePiece files without the flag get a bos token, as in llama.cpp and transformers.
    let add_bos = gguf
        .bool_opt("tokenizer.ggml.add_bos_token")
        .map_err(gguf_error)?
        .unwrap_or(vocab.model == "llama");
    let add_eos = gguf
        .bool_opt("tokenizer.ggml.add_eos_token")
        .map_err(gguf_error)?
        .unwrap_or(false);
    let bos = config["bos_token"].as_str().filter(|_| add_bos);
    let eos = config["eos_token"].as_str().filter(|_| add_eos);
    let processor = bos_eos_processor(&inner, bos, eos)?;
    inner.with_post_processor(Some(processor));

    if let Some(template) = gguf
        .str_opt("tokenizer.chat_template")
        .map_err(gguf_error)?
    {
        config.insert("chat_template".into(), json!(template));
    }
    if let Some(class) = tokenizer_class(vocab.arch) {
        config.insert("tokenizer_class".into(), json!(class));
    }
    Ok(Built {
        inner,
        config: Json::Object(config),
    })
}

/// The tokenizer class transformers records for an architecture, where that class brings its own
/// pipeline when loaded again (see `apply_transformers_class_pipeline`).
fn tokenizer_class(arch: &str) -> Option<&'static str> {
    match arch {
        "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" => Some("Qwen2Tokenizer"),
        _ => None,
    }
}

/// transformers' `add_gguf_special_tokens`: control tokens become special added tokens (whole in
/// the text, skipped when decoding with `skip_special_tokens`), user-defined ones plain added
/// tokens (whole in the text, decoded). In a byte-level vocabulary a control token spelled outside
/// the byte alphabet is a converter's mislabel and stays out.
fn add_typed_tokens(inner: &mut tokenizers::Tokenizer, vocab: &GgufVocab) {
    let byte_level = vocab.model == "gpt2";
    let control: Vec<AddedToken> = vocab
        .tokens
        .iter()
        .zip(&vocab.token_types)
        .filter(|(token, ty)| {
            **ty == TokenType::Control && (!byte_level || byte_level::in_alphabet(token))
        })
        .map(|(token, _)| AddedToken::from(token.to_string(), true).normalized(false))
        .collect();
    inner.add_special_tokens(&control);
    let user_defined: Vec<AddedToken> = vocab
        .tokens
        .iter()
        .zip(&vocab.token_types)
        .filter(|(token, ty)| **ty == TokenType::UserDefined && inner.token_to_id(token).is_some())
        .map(|(token, _)| AddedToken::from(token.to_string(), false).normalized(false))
        .collect();
    inner.add_tokens(&user_defined);
}

/// transformers' `update_post_processor`: `bos $A eos` with each end where its flag is set.
fn bos_eos_processor(
    inner: &tokenizers::Tokenizer,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<TemplateProcessing, TokenizerError> {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut special = Vec::new();
    if let Some(bos) = bos {
        single.push(format!("{bos}:0"));
        special.push((bos.to_string(), inner.token_to_id(bos).unwrap_or_default()));
    }
    single.push("$A:0".into());
    if let Some(eos) = eos {
        single.push(format!("{eos}:0"));
        special.push((eos.to_string(), inner.token_to_id(eos).unwrap_or_default()));
    }
    pair.extend(single.iter().cloned());
    if let Some(bos) = bos {
        pair.push(format!("{bos}:1"));
    }
    pair.push("$B:1".into());
    if let Some(eos) = eos {
        pair.push(format!("{eos}:1"));
    }
    let fail = |e: String| TokenizerError::Gguf(format!("bos/eos post-processor: {e}"));
    let mut builder = TemplateProcessing::builder();
    builder.try_single(single).map_err(fail)?;
    builder.try_pair(pair).map_err(fail)?;
    builder.special_tokens(special);
    builder.build().map_err(|e| fail(e.to_string()))
}
