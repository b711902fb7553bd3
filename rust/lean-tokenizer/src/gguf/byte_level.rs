//! `tokenizer.ggml.model = gpt2`: byte-level BPE over the file's tokens and merges, split first by
//! the regex `tokenizer.ggml.pre` names (transformers' `byte_level_tokenizer`, `GPT2Tokenizer` and
//! `set_split_regex`).

use std::sync::OnceLock;

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::PreTokenizerWrapper;

use super::GgufVocab;
use crate::TokenizerError;

// transformers/integrations/gguf/gguf_tokenizer_mapping.py, GGUF_PRE_TOKENIZER_SPLITS.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of a `tokenizer.ggml.pre`, or `None` for the ones that keep GPT-2's own
/// (byte-level pre-tokenizer with its built-in regex). Names outside both lists are refused: we
/// do not guess how a vocabulary's merges were learned.
fn split_regex(pre: &str) -> Result<Option<&'static str>, ()> {
    Ok(Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "megrez" => crate::QWEN2_PRETOKENIZE_REGEX,
        // transformers has no split of its own for these: GPT-2's regex. (llama.cpp splits
        // SmolLM's digits one by one; transformers, our reference, does not.)
        "default" | "gpt-2" | "gpt2" | "smollm" => return Ok(None),
        _ => return Err(()),
    }))
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`): printable bytes stand for themselves,
/// the others for the characters from U+0100 on, in byte order.
pub fn byte_alphabet() -> &'static [char; 256] {
    static ALPHABET: OnceLock<[char; 256]> = OnceLock::new();
    ALPHABET.get_or_init(|| {
        let printable = |b: u32| {
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
        };
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..256u32 {
            table[b as usize] = if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            };
        }
        table
    })
}

/// Whether every character of `token` is one of the byte alphabet's.
pub(super) fn in_alphabet(token: &str) -> bool {
    token.chars().all(|c| {
        let code = c as u32;
        match code {
            0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff => true,
            // The 68 non-printable bytes take U+0100..U+0143.
            0x100..=0x143 => true,
            _ => false,
        }
    })
}

pub(super) fn build(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let split = match vocab.pre {
        None => None,
        Some(pre) => split_regex(pre).map_err(|()| {
            TokenizerError::Gguf(format!(
                "tokenizer.ggml.pre is {pre:?}, a pre-tokenizer lean does not know; known: \
                 default, gpt-2, smollm, qwen2, llama-bpe (llama3) and their aliases"
            ))
        })?,
    };
    let merges = vocab.merges.as_ref().ok_or_else(|| {
        TokenizerError::Gguf(
            "tokenizer.ggml.merges is missing: a byte-level (gpt2) vocabulary needs its merges"
                .into(),
        )
    })?;

    // A token outside the byte alphabet is respelled byte by byte, as transformers does; a later
    // token with the same spelling takes the id (a Python dict's last write).
    let alphabet = byte_alphabet();
    let mut ids: Vocab = Vocab::with_capacity(vocab.tokens.len());
    for (id, token) in vocab.tokens.iter().enumerate() {
        let spelled = if in_alphabet(token) {
            token.to_string()
        } else {
            token.bytes().map(|b| alphabet[b as usize]).collect()
        };
        ids.insert(spelled, id as u32);
    }
    let pairs = super::file_merges(merges)?;
    let model = BPE::builder()
        .vocab_and_merges(ids, pairs)
        .build()
        .map_err(|e| TokenizerError::Gguf(format!("tokenizer.ggml.merges: {e}")))?;

    let mut tokenizer = tokenizers::Tokenizer::new(model);
    match split {
        None => {
            tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
        Some(regex) => {
            let split = crate::constant_regex_split(regex)
                .map_err(|e| TokenizerError::Gguf(format!("pre-tokenizer regex: {e}")))?;
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
                PreTokenizerWrapper::Split(split),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ])));
        }
    }
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_gpt2s() {
        let alphabet = byte_alphabet();
        assert_eq!(alphabet[b'!' as usize], '!');
        assert_eq!(alphabet[b' ' as usize], 'Ġ');
        assert_eq!(alphabet[b'\n' as usize], 'Ċ');
        assert_eq!(alphabet[0], '\u{100}');
        assert_eq!(alphabet[0xad], '\u{143}');
        let mut chars: Vec<char> = alphabet.to_vec();
        chars.sort();
        chars.dedup();
        assert_eq!(chars.len(), 256);
        assert!(alphabet.iter().all(|c| in_alphabet(&c.to_string())));
        assert!(!in_alphabet(" "));
        assert!(!in_alphabet("\u{144}"));
    }
}
