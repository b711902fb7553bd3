//! Constrained decoding: a constraint (any JSON object, a JSON schema, a regex or a Lark grammar)
//! compiled against a tokenizer's vocabulary by [llguidance], giving for each step the set of
//! tokens that keep the output inside the constraint (a bitset over the vocabulary), and
//! consuming the tokens that were chosen.
//!
//! [`Vocabulary`] is made once per tokenizer (it maps every token to the bytes it stands for and
//! builds llguidance's token trie); [`Constraint::new`] compiles one constraint for one generation.
//!
//! ```ignore
//! let vocab = Vocabulary::new(&tokenizer, model_vocab_size, &stop_ids)?;
//! let mut c = Constraint::new(&vocab, &ConstraintSpec::JsonSchema(schema))?;
//! loop {
//!     let mask = c.mask()?;              // bit i of word i / 32: token i allowed
//!     let id = sample(logits masked);    // a stop id is allowed only where the output may end
//!     if stop_ids.contains(&id) { break }
//!     c.accept(id)?;
//!     if c.is_complete() { break }       // nothing may follow: the output is finished
//! }
//! ```
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

/// What a constraint failed on, in words that name the problem (a schema feature the library
/// does not support, a regex or grammar syntax error with its place, a tokenizer it cannot map).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintError(pub String);

impl std::fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConstraintError {}

pub type Result<T> = std::result::Result<T, ConstraintError>;

fn err(message: impl Into<String>) -> ConstraintError {
    ConstraintError(message.into())
}

/// A constraint on the generated text.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid under this JSON schema (what llguidance supports of it: types, `properties`,
    /// `required`, `additionalProperties`, `items`/`prefixItems`, `minItems`/`maxItems`,
    /// `enum`, `const`, `anyOf`/`oneOf`, `allOf`, `$ref`/`$defs`, `pattern`, `format`,
    /// `minLength`/`maxLength`, `minimum`/`maximum` and their exclusive forms, `multipleOf`).
    JsonSchema(serde_json::Value),
    /// Text matching this regex in full (llguidance's syntax: Rust `regex` without look-around
    /// or back-references).
    Regex(String),
    /// A Lark grammar (llguidance's dialect: `start` is the top rule; `%json {schema}` and
    /// `/regex/` terminals are allowed).
    Lark(String),
}

impl ConstraintSpec {
    /// A short name for messages and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonObject => "json_object",
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Lark(_) => "grammar",
        }
    }
}

/// How JSON may be spaced between two of its tokens: one line break at most, then up to 32
/// spaces or tabs, so that a small model cannot loop on whitespace until `max_tokens`
/// (llguidance's default allows any amount). Enough for pretty-printed JSON nested deeply.
const JSON_WHITESPACE: &str = r"(\r?\n)?[\x20\t]{0,32}";

/// How a tokenizer writes the bytes of its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenEncoding {
    /// GPT-2's byte-level BPE: every byte is a printable character (`Ġ` is a space).
    ByteLevel,
    /// SentencePiece: `space` (`▁`) stands for a space, `<0xNN>` tokens for the byte NN.
    SentencePiece { space: char },
}

/// A tokenizer's vocabulary as llguidance sees it: the bytes of every token (special tokens
/// marked), the stop ids, and the parser factory built over them. Made once per tokenizer and
/// shared by the constraints compiled against it.
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
    /// The id llguidance uses as end of sequence (the first stop id).
    eos: u32,
    stop_ids: Vec<u32>,
    encoding: TokenEncoding,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("n_vocab", &self.n_vocab)
            .field("eos", &self.eos)
            .field("stop_ids", &self.stop_ids)
            .field("encoding", &self.encoding)
            .finish()
    }
}

/// The bytes each token id stands for, `n_vocab` of them (ids the tokenizer does not know, e.g.
/// a model's padded embedding rows, are empty: never allowed). Special added tokens (the chat
/// markers, end of sequence…) start with [`TokTrie::SPECIAL_TOKEN_MARKER`] (0xFF, never a byte
/// of UTF-8 text), so that no constraint on text ever allows them.
pub fn token_bytes(
    tokenizer: &lean_tokenizer::Tokenizer,
    n_vocab: usize,
) -> Result<(Vec<Vec<u8>>, TokenEncoding)> {
    let hf = tokenizer.hf_tokenizer();
    let encoding = token_encoding(hf)?;
    let byte_of_char = gpt2_char_to_byte();
    let mut words = vec![Vec::new(); n_vocab];
    let added = hf.get_added_tokens_decoder();
    for (token, id) in hf.get_vocab(false) {
        let Some(word) = words.get_mut(id as usize) else {
            continue;
        };
        *word = match encoding {
            TokenEncoding::ByteLevel => token
                .chars()
                .map(|c| {
                    byte_of_char.get(&c).copied().ok_or_else(|| {
                        err(format!(
                            "token {id} ({token:?}) is not byte-level BPE: {c:?} stands for no byte"
                        ))
                    })
                })
                .collect::<Result<Vec<u8>>>()?,
            TokenEncoding::SentencePiece { space } => match byte_fallback(&token) {
                Some(byte) => vec![byte],
                None => token.replace(space, " ").into_bytes(),
            },
        };
    }
    // Added tokens are matched as written, before the model's pre-tokenization: their content is
    // the text itself (not byte-level characters).
    for (id, token) in added {
        if let Some(word) = words.get_mut(id as usize) {
            let mut bytes = token.content.as_bytes().to_vec();
            if token.special {
                bytes.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
            *word = bytes;
        }
    }
    Ok((words, encoding))
}

/// `<0xNN>`: SentencePiece's byte-fallback token for byte NN.
fn byte_fallback(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// Which byte each character of GPT-2's byte-level alphabet stands for (lean-tokenizer's
/// table, inverted).
fn gpt2_char_to_byte() -> std::collections::HashMap<char, u8> {
    (0..=255u8)
        .zip(lean_tokenizer::byte_level_alphabet())
        .map(|(b, &c)| (c, b))
        .collect()
}

/// Reads the decoder: byte-level (GPT-2 style) or SentencePiece (a `Replace` of `▁` by a space,
/// byte fallback, or a `Metaspace`).
fn token_encoding(hf: &tokenizers::Tokenizer) -> Result<TokenEncoding> {
    let decoder = hf
        .get_decoder()
        .and_then(|d| serde_json::to_value(d).ok())
        .unwrap_or(serde_json::Value::Null);
    let kind = |d: &serde_json::Value| d["type"].as_str().unwrap_or("").to_string();
    let parts: Vec<serde_json::Value> = match kind(&decoder).as_str() {
        "Sequence" => decoder["decoders"].as_array().cloned().unwrap_or_default(),
        "" => Vec::new(),
        _ => vec![decoder.clone()],
    };
    if parts.iter().any(|d| kind(d) == "ByteLevel") {
        return Ok(TokenEncoding::ByteLevel);
    }
    for d in &parts {
        match kind(d).as_str() {
            "Metaspace" => {
                let space = d["replacement"].as_str().and_then(|s| s.chars().next());
                return Ok(TokenEncoding::SentencePiece {
                    space: space.unwrap_or('▁'),
                });
            }
            "Replace" if d["content"].as_str() == Some(" ") => {
                let pattern = d["pattern"]["String"].as_str().unwrap_or("");
                let mut chars = pattern.chars();
                if let (Some(space), None) = (chars.next(), chars.next()) {
                    return Ok(TokenEncoding::SentencePiece { space });
                }
            }
            _ => {}
        }
    }
    if parts.iter().any(|d| kind(d) == "ByteFallback") {
        return Ok(TokenEncoding::SentencePiece { space: '▁' });
    }
    Err(err(format!(
        "constrained decoding supports byte-level BPE and SentencePiece tokenizers; this \
         tokenizer's decoder is {decoder}"
    )))
}

impl Vocabulary {
    /// Maps `tokenizer`'s tokens to bytes over the model's `n_vocab` logits and builds the
    /// parser factory. `stop_ids` are the ids generation ends at (the first is llguidance's end
    /// of sequence); a constraint allows them exactly where its output may end.
    pub fn new(
        tokenizer: &lean_tokenizer::Tokenizer,
        n_vocab: usize,
        stop_ids: &[u32],
    ) -> Result<Vocabulary> {
        let (words, encoding) = token_bytes(tokenizer, n_vocab)?;
        Self::from_token_bytes(words, encoding, stop_ids)
    }

    /// As `new`, from the bytes of every token (see [`token_bytes`]).
    pub fn from_token_bytes(
        words: Vec<Vec<u8>>,
        encoding: TokenEncoding,
        stop_ids: &[u32],
    ) -> Result<Vocabulary> {
        let n_vocab = words.len();
        let &eos = stop_ids
            .first()
            .ok_or_else(|| err("constrained decoding needs a stop (end-of-sequence) token id"))?;
        if let Some(&bad) = stop_ids.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(err(format!(
                "stop id {bad} is outside the vocabulary ({n_vocab} tokens)"
            )));
        }
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| err(e.to_string()))?;
        // Nothing on stderr: errors come back as values.
        factory.quiet();
        Ok(Vocabulary {
            factory: Arc::new(factory),
            n_vocab,
            eos,
            stop_ids: stop_ids.to_vec(),
            encoding,
        })
    }

    /// Number of token ids (the model's logits).
    pub fn len(&self) -> usize {
        self.n_vocab
    }

    pub fn is_empty(&self) -> bool {
        self.n_vocab == 0
    }

    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    pub fn encoding(&self) -> TokenEncoding {
        self.encoding
    }

    /// The bytes token `id` stands for (special tokens start with 0xFF).
    pub fn token(&self, id: u32) -> &[u8] {
        self.factory.tok_env().tok_trie().token(id)
    }
}

/// Words of a token mask: bit `i % 32` of word `i / 32` is set when token `i` is allowed.
pub fn mask_words(n_vocab: usize) -> usize {
    n_vocab.div_ceil(32)
}

/// Whether token `id` is allowed by `mask` (see [`mask_words`]).
#[inline]
pub fn is_allowed(mask: &[u32], id: u32) -> bool {
    mask.get(id as usize / 32)
        .is_some_and(|w| w >> (id % 32) & 1 == 1)
}

/// One constraint being followed by one generation.
pub struct Constraint {
    matcher: Matcher,
    vocab: Arc<Vocabulary>,
    /// The last mask, stop ids included where the output may end.
    mask: Vec<u32>,
    /// Tokens accepted so far.
    accepted: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("accepted", &self.accepted)
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Compiles `spec` against `vocab`. A schema, regex or grammar the library rejects is an
    /// error that says why.
    pub fn new(vocab: &Arc<Vocabulary>, spec: &ConstraintSpec) -> Result<Constraint> {
        let grammar = match spec {
            ConstraintSpec::JsonObject => json_grammar(serde_json::json!({"type": "object"}))?,
            ConstraintSpec::JsonSchema(schema) => json_grammar(schema.clone())?,
            ConstraintSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ConstraintSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = vocab
            .factory
            .create_parser(grammar)
            .map_err(|e| err(format!("invalid {}: {e}", spec.kind())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(err(format!("invalid {}: {e}", spec.kind())));
        }
        Ok(Constraint {
            matcher,
            vocab: vocab.clone(),
            mask: vec![0; mask_words(vocab.n_vocab)],
            accepted: 0,
        })
    }

    /// The vocabulary this constraint was compiled over (its stop ids included).
    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    /// The tokens allowed next: bit `i % 32` of word `i / 32` for token `i`. The stop ids are
    /// allowed exactly where the output may end (and are all that is allowed once it must).
    pub fn mask(&mut self) -> Result<&[u32]> {
        let vob: SimpleVob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| err(format!("constraint: {e}")))?;
        let words = vob.as_slice();
        let n = self.mask.len().min(words.len());
        self.mask[..n].copy_from_slice(&words[..n]);
        self.mask[n..].fill(0);
        let eos_allowed = is_allowed(&self.mask, self.vocab.eos);
        for &id in &self.vocab.stop_ids {
            let (w, b) = (id as usize / 32, id % 32);
            if eos_allowed {
                self.mask[w] |= 1 << b;
            } else {
                self.mask[w] &= !(1 << b);
            }
        }
        if self.mask.iter().all(|&w| w == 0) {
            return Err(err(
                "the constraint allows no token here (the tokenizer cannot write what it needs)",
            ));
        }
        Ok(&self.mask)
    }

    /// Advances past token `id` (not a stop id: the generation ends there). A token the last
    /// mask did not allow is an error.
    pub fn accept(&mut self, id: u32) -> Result<()> {
        self.matcher
            .consume_token(id)
            .map_err(|e| err(format!("constraint: token {id} rejected: {e}")))?;
        self.accepted += 1;
        Ok(())
    }

    /// Speculative decoding's look ahead: the masks a guess would meet, without following it.
    /// Takes the longest prefix of `draft` this constraint allows from here (up to the first
    /// stop id, a token it refuses, or just past a token that completes the output) and writes
    /// the mask before each of its tokens and the one after the last, `mask_words` words each,
    /// into `masks`. Returns that prefix's length; `masks` then holds one more mask than that.
    /// The constraint ends where it began (its next `mask` is the first one written).
    pub fn masks_along(&mut self, draft: &[u32], masks: &mut Vec<u32>) -> Result<usize> {
        masks.clear();
        let mut followed = 0;
        let result = (|| loop {
            masks.extend_from_slice(self.mask()?);
            let Some(&id) = draft.get(followed) else {
                return Ok(());
            };
            let stop = self.vocab.stop_ids.contains(&id);
            if stop || self.is_complete() || !is_allowed(&self.mask, id) {
                return Ok(());
            }
            self.accept(id)?;
            followed += 1;
        })();
        // Back to where the guess began, whether or not it went well.
        self.rollback(followed)?;
        result.map(|()| followed)
    }

    /// Takes back the last `n` accepted tokens (a guess followed for a look ahead).
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.accepted {
            return Err(err(format!(
                "constraint: cannot take back {n} tokens of {}",
                self.accepted
            )));
        }
        self.matcher
            .rollback(n)
            .map_err(|e| err(format!("constraint: rollback of {n} tokens: {e}")))?;
        self.accepted -= n;
        Ok(())
    }

    /// The output is complete and nothing may follow it (only a stop token is allowed).
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The output so far is a complete match (a stop token is allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// A JSON schema as llguidance's grammar, with whitespace bounded (see [`JSON_WHITESPACE`]) unless
/// the schema sets its own `x-guidance` options.
fn json_grammar(mut schema: serde_json::Value) -> Result<TopLevelGrammar> {
    let Some(obj) = schema.as_object_mut() else {
        return match schema {
            // `true` (anything) and `false` (nothing) are schemas too.
            serde_json::Value::Bool(_) => Ok(TopLevelGrammar::from_json_schema(schema)),
            _ => Err(err(format!(
                "invalid json_schema: a schema is a JSON object (or true/false), got {schema}"
            ))),
        };
    };
    obj.entry("x-guidance")
        .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    Ok(TopLevelGrammar::from_json_schema(schema))
}
