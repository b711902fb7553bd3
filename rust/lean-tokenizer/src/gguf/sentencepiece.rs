//! `tokenizer.ggml.model = llama`: SentencePiece BPE with byte fallback, over the file's merges or,
//! as most files have none, over merges recovered from the vocabulary and its scores.
//!
//! transformers/integrations/gguf/gguf_tokenizer_mapping.py picks the builder by architecture:
//! * `gemma`, `gemma2`, `gemma3`: `gemma_tokenizer` — whitespace tokens respelled with `▁`, merges
//!   ranked by position in the file, `GemmaTokenizer`'s pipeline (spaces → `▁` by a normalizer,
//!   split after each `▁`, no prefix space);
//! * `phi3`: `phi3_tokenizer` — `LlamaTokenizer`'s, with the prefix `▁` and the spaces written by a
//!   normalizer instead of the `Metaspace` pre-tokenizer;
//! * any other: `sentencepiece_tokenizer` with `LlamaTokenizer` — `Metaspace` (`▁` for spaces, one
//!   prepended to the first piece), decoder `▁` → space, bytes, fuse, strip the one leading space.
//!
//! `tokenizer.ggml.add_space_prefix` reaches none of them in transformers (the class is built
//! without it and keeps its default, a prefix space), so it is not read here either.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{DecoderWrapper, NormalizerWrapper, SplitDelimiterBehavior};

use super::{GgufVocab, MERGES, SCORES};
use crate::TokenizerError;

/// SentencePiece's visible space.
const SPACE: char = '\u{2581}';
const SPACE_STR: &str = "\u{2581}";

pub(super) fn build(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    match vocab.arch {
        "gemma" | "gemma2" | "gemma3" => gemma(vocab),
        "phi3" => phi3(vocab),
        _ => llama(vocab),
    }
}

/// transformers' `sentencepiece_tokenizer` with `LlamaTokenizer` (add_prefix_space left at its
/// default, true; legacy false: the prepend scheme is "first").
fn llama(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let model = bpe(vocab, &vocab.tokens, Ranking::Scores, None)?;
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Metaspace::new(SPACE, PrependScheme::First, false)));
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        replace_decoder()?,
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
        DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
    ])));
    Ok(tokenizer)
}

/// transformers' `phi3_tokenizer`: Llama's, with normalizer `Prepend("▁")` + `Replace(" ", "▁")`
/// and no pre-tokenizer.
fn phi3(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let mut tokenizer = llama(vocab)?;
    tokenizer.with_normalizer(Some(NormalizerSequence::new(vec![
        NormalizerWrapper::Prepend(Prepend::new(SPACE_STR.into())),
        NormalizerWrapper::Replace(space_replace()?),
    ])));
    tokenizer.with_pre_tokenizer(None::<Metaspace>);
    Ok(tokenizer)
}

/// transformers' `gemma_tokenizer` and `GemmaTokenizer`.
fn gemma(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    // A token of whitespace with a space in it ("  ") is stored as it reads; GemmaTokenizer looks
    // it up as "▁▁", one ▁ per character.
    let respelled: Vec<String> = vocab
        .tokens
        .iter()
        .map(|token| {
            if token.contains(' ') && token.chars().all(python_isspace) {
                SPACE_STR.repeat(token.chars().count())
            } else {
                token.to_string()
            }
        })
        .collect();
    let tokens: Vec<&str> = respelled.iter().map(String::as_str).collect();
    // GemmaTokenizer's own default, whatever the file's unknown token is.
    let model = bpe(vocab, &tokens, Ranking::Positions, Some("<unk>"))?;
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_normalizer(Some(space_replace()?));
    let split = Split::new(
        SplitPattern::String(" ".into()),
        SplitDelimiterBehavior::MergedWithPrevious,
        false,
    )
    .map_err(|e| TokenizerError::Gguf(format!("Gemma pre-tokenizer: {e}")))?;
    tokenizer.with_pre_tokenizer(Some(split));
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        replace_decoder()?,
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ])));
    Ok(tokenizer)
}

/// Python's `str.isspace` for one character: Unicode White_Space plus the information separators
/// U+001C..U+001F, which Python counts and Rust does not.
fn python_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn space_replace() -> Result<Replace, TokenizerError> {
    Replace::new(" ", SPACE_STR).map_err(|e| TokenizerError::Gguf(format!("normalizer: {e}")))
}

fn replace_decoder() -> Result<DecoderWrapper, TokenizerError> {
    Replace::new(SPACE_STR, " ")
        .map(DecoderWrapper::Replace)
        .map_err(|e| TokenizerError::Gguf(format!("decoder: {e}")))
}

/// How recovered merges are ranked: by the file's scores, or (Gemma) by the position of the
/// merged token in the file, earlier first.
#[derive(Clone, Copy)]
enum Ranking {
    Scores,
    Positions,
}

/// One distinct spelling of the vocabulary, as Python's `{token: ...}` dicts hold it: in the order
/// of its first occurrence, with the score of its last.
struct Entry<'a> {
    token: &'a str,
    score: f64,
}

/// The vocabulary's distinct spellings in first-occurrence order, and for each spelling its entry
/// and its id (the last one, as in `{token: index for index, token in enumerate(tokens)}`).
struct Spellings<'a> {
    entries: Vec<Entry<'a>>,
    lookup: HashMap<&'a str, (u32, u32), BuildHasherDefault<FxHasher>>,
}

impl<'a> Spellings<'a> {
    fn new(tokens: &[&'a str], score: impl Fn(u32) -> f64) -> Spellings<'a> {
        let mut entries: Vec<Entry> = Vec::with_capacity(tokens.len());
        let mut lookup =
            HashMap::with_capacity_and_hasher(tokens.len(), BuildHasherDefault::default());
        for (id, &token) in tokens.iter().enumerate() {
            let id = id as u32; // GgufVocab::read checked that ids fit in 32 bits
            let score = score(id);
            match lookup.get_mut(token) {
                Some((entry, last_id)) => {
                    *last_id = id;
                    entries[*entry as usize].score = score;
                }
                None => {
                    lookup.insert(token, (entries.len() as u32, id));
                    entries.push(Entry { token, score });
                }
            }
        }
        Spellings { entries, lookup }
    }

    fn id(&self, token: &str) -> Option<u32> {
        self.lookup.get(token).map(|&(_, id)| id)
    }
}

/// rustc's FxHash: a multiply-rotate hash, several times faster than SipHash on the short keys
/// of a vocabulary (recovering Gemma's merges looks up millions of token halves).
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(SEED);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The BPE model (`fuse_unk`, `byte_fallback`) over `tokens` (the file's, or respelled) and the
/// file's merges or the ones recovered from the vocabulary.
fn bpe(
    vocab: &GgufVocab,
    tokens: &[&str],
    ranking: Ranking,
    unk_token: Option<&str>,
) -> Result<BPE, TokenizerError> {
    let scores = vocab.scores.as_deref();
    let spellings = Spellings::new(tokens, |id| match ranking {
        Ranking::Positions => -f64::from(id),
        Ranking::Scores => scores
            .and_then(|scores| scores.get(id as usize))
            .map_or(0.0, |&s| f64::from(s)),
    });

    let merges = match &vocab.merges {
        Some(merges) => super::file_merges(merges)?,
        None => {
            if matches!(ranking, Ranking::Scores) && vocab.scores.is_none() {
                return Err(TokenizerError::Gguf(format!(
                    "the SentencePiece (tokenizer.ggml.model \"llama\") vocabulary has neither \
                     {MERGES} nor {SCORES}: its merges cannot be recovered"
                )));
            }
            generate_merges(&spellings)
        }
    };

    let ids: Vocab = spellings
        .lookup
        .iter()
        .map(|(&token, &(_, id))| (token.to_string(), id))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(ids, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = unk_token {
        builder = builder.unk_token(unk.into());
    }
    builder
        .build()
        .map_err(|e| TokenizerError::Gguf(format!("{MERGES}: {e}")))
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of every token into two
/// tokens of the vocabulary is a merge; a token's own splits in the order of (left id, right id),
/// then all of them stably sorted by (score, left length, right length), largest first. Lengths
/// count characters, as Python's do. Linear in the vocabulary's characters, plus the sort.
fn generate_merges(spellings: &Spellings) -> Vec<(String, String)> {
    struct Merge<'a> {
        left: &'a str,
        right: &'a str,
        score: f64,
        left_chars: u32,
        right_chars: u32,
    }
    let mut merges: Vec<Merge> = Vec::new();
    let mut local: Vec<(u32, u32, Merge)> = Vec::new();
    for entry in &spellings.entries {
        let token = entry.token;
        local.clear();
        let mut left_chars = 0u32;
        for (at, _) in token.char_indices().skip(1) {
            left_chars += 1;
            let (left, right) = token.split_at(at);
            let Some(l) = spellings.id(left) else {
                continue;
            };
            let Some(r) = spellings.id(right) else {
                continue;
            };
            local.push((
                l,
                r,
                Merge {
                    left,
                    right,
                    score: entry.score,
                    left_chars,
                    right_chars: 0, // set below, once the token's length is known
                },
            ));
        }
        let chars = left_chars + 1;
        local.sort_unstable_by_key(|&(l, r, _)| (l, r)); // distinct keys: a left half is unique
        merges.extend(local.drain(..).map(|(_, _, merge)| Merge {
            right_chars: chars - merge.left_chars,
            ..merge
        }));
    }
    // Python's sorted(..., reverse=True) keeps equal elements in their order: a stable sort on
    // the reversed comparison.
    merges.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(Ordering::Equal)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    merges
        .into_iter()
        .map(|m| (m.left.to_string(), m.right.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spellings<'a>(tokens: &[(&'a str, f64)]) -> Spellings<'a> {
        let texts: Vec<&str> = tokens.iter().map(|&(t, _)| t).collect();
        Spellings::new(&texts, |id| tokens[id as usize].1)
    }

    fn pairs(merges: &[(String, String)]) -> Vec<(&str, &str)> {
        merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect()
    }

    #[test]
    fn merges_follow_scores_then_lengths_then_order() {
        // Results checked against transformers' generate_merges.
        let spellings = spellings(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -1.0),
            ("bc", -1.0),
            ("abc", -1.0),
            ("ca", -3.0),
            ("é", 0.0),
            ("éa", -2.0),
        ]);
        let merges = generate_merges(&spellings);
        assert_eq!(
            pairs(&merges),
            [
                ("ab", "c"),
                ("a", "bc"),
                ("a", "b"),
                ("b", "c"),
                ("é", "a"),
                ("c", "a"),
            ]
        );
    }

    #[test]
    fn a_repeated_spelling_keeps_its_first_place_and_last_score() {
        // As dict(zip(tokens, scores)): "ba" keeps its first place but takes the last score, so
        // it ties with "ab" and comes first (checked against transformers).
        let spellings = spellings(&[
            ("a", 0.0),
            ("b", 0.0),
            ("ba", -2.0),
            ("ab", -1.0),
            ("ba", -1.0),
        ]);
        assert_eq!(spellings.entries.len(), 4);
        assert_eq!(spellings.entries[2].token, "ba");
        assert_eq!(spellings.id("ba"), Some(4));
        let merges = generate_merges(&spellings);
        assert_eq!(pairs(&merges), [("b", "a"), ("a", "b")]);
    }

    #[test]
    fn isspace_is_pythons() {
        for c in [
            '\t', '\n', '\u{b}', '\u{c}', '\r', '\u{1c}', '\u{1f}', ' ', '\u{85}', '\u{a0}',
            '\u{3000}',
        ] {
            assert!(python_isspace(c), "{c:?}");
        }
        for c in ['\u{200b}', '\u{2581}', 'a', '\u{feff}'] {
            assert!(!python_isspace(c), "{c:?}");
        }
    }
}
