//! The SentencePiece (`tokenizer.ggml.model = "llama"`) tokenizers lean builds from a GGUF's
//! metadata, against transformers' `AutoTokenizer.from_pretrained(dir, gguf_file=...)` on the
//! corpus (tests/data/sentencepiece-ids.json, written by scripts/gen_sentencepiece_fixtures.py):
//! * tests/data/tiny-sentencepiece.gguf (scripts/gen_sentencepiece_gguf.py), always, as its own
//!   architecture ("llama") and rewritten as "phi3" and "gemma3";
//! * Gemma 3 270M (262,144 tokens, no merges) where the test models are present (they must be
//!   when CI is set), from the GGUF and from the tokenizer.json transformers saves from it.
//!
//! And the errors malformed metadata gets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use lean_gguf::{Gguf, GgufWriter, Value};
use lean_tokenizer::{Tokenizer, TokenizerError};
use serde::Deserialize;

const TINY: &str = "tiny-sentencepiece.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

#[derive(Deserialize)]
struct Reference {
    ids: Vec<Vec<u32>>,
    ids_with_special: Vec<Vec<u32>>,
    /// `None` where the decode is the corpus string itself.
    decoded: Vec<Option<String>>,
    decoded_with_special: Vec<String>,
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn corpus() -> Vec<String> {
    serde_json::from_slice(&std::fs::read(data("corpus.json")).unwrap()).unwrap()
}

fn reference(case: &str) -> Reference {
    let mut all: HashMap<String, Reference> =
        serde_json::from_slice(&std::fs::read(data("sentencepiece-ids.json")).unwrap()).unwrap();
    all.remove(case)
        .unwrap_or_else(|| panic!("sentencepiece-ids.json has no case {case:?}"))
}

/// The models directory holding the Gemma GGUF: $LEAN_MODELS, else the repository's models/ (as
/// tests/fixtures.rs) or ~/.cache/lean/models (the fixture scripts'). None (after saying so) when
/// there is none, outside CI.
fn models_dir() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("LEAN_MODELS") {
        Some(dir) => vec![dir.into()],
        None => std::iter::once(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"))
            .chain(std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/lean/models")))
            .collect(),
    };
    if let Some(dir) = candidates.iter().find(|dir| dir.join(GEMMA).is_file()) {
        return Some(dir.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
    assert!(
        std::env::var_os("CI").is_none(),
        "{GEMMA} missing in {} (run scripts/fetch-test-models.sh)",
        looked.join(" and ")
    );
    eprintln!(
        "skipping: {GEMMA} missing in {} (run scripts/fetch-test-models.sh)",
        looked.join(" and ")
    );
    None
}

/// The same metadata with `general.architecture` replaced (the file has no tensors).
fn with_architecture(gguf: &Gguf, arch: &str) -> Vec<u8> {
    let mut writer = GgufWriter::new();
    for (key, value) in gguf.metadata.iter() {
        if key == "general.architecture" {
            writer.add(key, arch);
        } else if key != "general.alignment" {
            writer.add(key, value.clone());
        }
    }
    writer.finish().unwrap()
}

struct Tally {
    ids: usize,
    ids_with_special: usize,
    decoded: usize,
    decoded_with_special: usize,
}

/// Every corpus string through `tok`, against the reference: how many of each kind match, and
/// the first mismatch of each kind printed.
fn compare(case: &str, tok: &Tokenizer) -> Tally {
    let corpus = corpus();
    let expected = reference(case);
    assert_eq!(expected.ids.len(), corpus.len());
    let mut tally = Tally {
        ids: 0,
        ids_with_special: 0,
        decoded: 0,
        decoded_with_special: 0,
    };
    let mut reported = [false; 4];
    let mut report = |kind: usize,
                      what: &str,
                      text: &str,
                      ours: &dyn std::fmt::Debug,
                      theirs: &dyn std::fmt::Debug| {
        if !std::mem::replace(&mut reported[kind], true) {
            eprintln!(
                "{case}: first {what} mismatch, for {text:?}\n  lean:         {ours:?}\n  transformers: {theirs:?}"
            );
        }
    };
    for (i, text) in corpus.iter().enumerate() {
        let ids = tok.encode(text, false).unwrap();
        if ids == expected.ids[i] {
            tally.ids += 1;
        } else {
            report(0, "ids", text, &ids, &expected.ids[i]);
        }
        let ids_special = tok.encode(text, true).unwrap();
        if ids_special == expected.ids_with_special[i] {
            tally.ids_with_special += 1;
        } else {
            report(
                1,
                "ids (add_special_tokens)",
                text,
                &ids_special,
                &expected.ids_with_special[i],
            );
        }
        let decoded = tok.decode(&expected.ids[i], false).unwrap();
        let want = expected.decoded[i].as_deref().unwrap_or(text);
        if decoded == want {
            tally.decoded += 1;
        } else {
            report(2, "decode", text, &decoded, &want);
        }
        let decoded = tok.decode(&expected.ids_with_special[i], false).unwrap();
        if decoded == expected.decoded_with_special[i] {
            tally.decoded_with_special += 1;
        } else {
            report(
                3,
                "decode (with special tokens)",
                text,
                &decoded,
                &expected.decoded_with_special[i],
            );
        }
    }
    eprintln!(
        "{case}: of {} strings, ids match for {} / {} (add_special_tokens false / true), decodes for {} / {}",
        corpus.len(),
        tally.ids,
        tally.ids_with_special,
        tally.decoded,
        tally.decoded_with_special
    );
    tally
}

fn assert_all_match(case: &str, tok: &Tokenizer) {
    let n = corpus().len();
    let tally = compare(case, tok);
    assert_eq!(
        [
            tally.ids,
            tally.ids_with_special,
            tally.decoded,
            tally.decoded_with_special
        ],
        [n; 4],
        "{case}: not all of the corpus matches transformers (first mismatches above)"
    );
}

fn tiny() -> Gguf {
    Gguf::parse(&std::fs::read(data(TINY)).unwrap()).unwrap()
}

#[test]
fn tiny_llama_matches_transformers() {
    let gguf = tiny();
    let tok = Tokenizer::from_gguf(&gguf, None, None).unwrap();
    assert!(tok.is_from_gguf());
    assert_eq!(tok.bos_token(), Some("<s>"));
    assert_eq!(tok.eos_token(), Some("</s>"));
    // A repeated spelling: the later id is the token's.
    assert_eq!(tok.token_to_id("\u{2581}the"), Some(921));
    assert_all_match(TINY, &tok);
}

#[test]
fn tiny_as_phi3_matches_transformers() {
    let gguf = Gguf::parse(&with_architecture(&tiny(), "phi3")).unwrap();
    let tok = Tokenizer::from_gguf(&gguf, None, None).unwrap();
    assert_all_match(&format!("{TINY} as phi3"), &tok);
}

#[test]
fn tiny_as_gemma3_matches_transformers() {
    let gguf = Gguf::parse(&with_architecture(&tiny(), "gemma3")).unwrap();
    let tok = Tokenizer::from_gguf(&gguf, None, None).unwrap();
    // "  " is looked up as "▁▁".
    assert!(tok.token_to_id("\u{2581}\u{2581}").is_some());
    assert_eq!(tok.token_to_id("  "), None);
    assert_all_match(&format!("{TINY} as gemma3"), &tok);
}

#[test]
fn add_space_prefix_changes_nothing_as_in_transformers() {
    let gguf = tiny();
    let mut writer = GgufWriter::new();
    for (key, value) in gguf.metadata.iter() {
        writer.add(key, value.clone());
    }
    writer.add("tokenizer.ggml.add_space_prefix", false);
    let flagged = Gguf::parse(&writer.finish().unwrap()).unwrap();
    let plain = Tokenizer::from_gguf(&gguf, None, None).unwrap();
    let flagged = Tokenizer::from_gguf(&flagged, None, None).unwrap();
    for text in ["Hello world", " two  spaces", "\nline"] {
        assert_eq!(
            flagged.encode(text, true).unwrap(),
            plain.encode(text, true).unwrap()
        );
    }
}

#[test]
fn gemma3_matches_transformers() {
    let Some(models) = models_dir() else { return };
    let bytes = std::fs::read(models.join(GEMMA)).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let start = Instant::now();
    let tok = Tokenizer::from_gguf(&gguf, None, None).unwrap();
    eprintln!("{GEMMA}: tokenizer built in {:?}", start.elapsed());
    assert_eq!(tok.bos_token(), Some("<bos>"));
    assert_eq!(tok.eos_token(), Some("<eos>"));
    assert_eq!(tok.vocab_size(), 262_144);
    let tokens = gguf.string_array("tokenizer.ggml.tokens").unwrap();
    tok.check_vocab(&tokens).unwrap();
    assert_all_match(GEMMA, &tok);
}

/// The tokenizer.json transformers saves from the Gemma GGUF (`derive_test_models.py tokenizer`),
/// through lean's tokenizer.json path: the same ids.
#[test]
fn gemma3_saved_tokenizer_json_matches_too() {
    let Some(models) = models_dir() else { return };
    let dir = models.join("gemma-3-270m");
    if !dir.join("tokenizer.json").is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} missing",
            dir.display()
        );
        eprintln!("skipping: {} missing", dir.display());
        return;
    }
    let tok = Tokenizer::from_path(&dir).unwrap();
    assert_all_match(GEMMA, &tok);
    // It belongs to the GGUF although whitespace tokens are spelled "▁▁" there and "  " here.
    let bytes = std::fs::read(models.join(GEMMA)).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let tokens = gguf.string_array("tokenizer.ggml.tokens").unwrap();
    assert!(tokens.contains(&"  "));
    tok.check_vocab(&tokens).unwrap();
    let mut other = tokens.clone();
    other[138] = " \t";
    assert!(
        tok.check_vocab(&other).is_ok(),
        "a whitespace token is respelled whole"
    );
    other[138] = "x";
    assert!(tok.check_vocab(&other).is_err());
}

// --- errors -----------------------------------------------------------------------------------

/// A small SentencePiece vocabulary's metadata, `edit`ed, through `from_gguf`.
fn build_with(
    edit: impl FnOnce(&mut Vec<(&'static str, Value)>),
) -> Result<Tokenizer, TokenizerError> {
    let tokens = [
        "<unk>",
        "<s>",
        "</s>",
        "\u{2581}",
        "a",
        "b",
        "\u{2581}a",
        "ab",
    ];
    let mut metadata: Vec<(&'static str, Value)> = vec![
        ("general.architecture", "llama".into()),
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", tokens.to_vec().into()),
        (
            "tokenizer.ggml.scores",
            vec![0f32, 0., 0., -1., -2., -3., -4., -5.].into(),
        ),
        (
            "tokenizer.ggml.token_type",
            vec![2i32, 3, 3, 1, 1, 1, 1, 1].into(),
        ),
        ("tokenizer.ggml.bos_token_id", 1u32.into()),
        ("tokenizer.ggml.eos_token_id", 2u32.into()),
    ];
    edit(&mut metadata);
    let mut writer = GgufWriter::new();
    for (key, value) in metadata {
        writer.add(key, value);
    }
    let gguf = Gguf::parse(&writer.finish().unwrap()).unwrap();
    Tokenizer::from_gguf(&gguf, None, None)
}

fn remove(metadata: &mut Vec<(&'static str, Value)>, key: &str) {
    metadata.retain(|(k, _)| *k != key);
}

fn set(metadata: &mut Vec<(&'static str, Value)>, key: &'static str, value: Value) {
    remove(metadata, key);
    metadata.push((key, value));
}

fn gguf_error(result: Result<Tokenizer, TokenizerError>) -> String {
    match result {
        Err(TokenizerError::Gguf(message)) => message,
        Err(other) => panic!("expected a GGUF error, got {other:?}"),
        Ok(_) => panic!("expected a GGUF error, got a tokenizer"),
    }
}

#[test]
fn the_small_vocabulary_builds() {
    // Ids checked against transformers on the same metadata.
    let tok = build_with(|_| {}).unwrap();
    assert_eq!(tok.encode("a ab", true).unwrap(), [1, 6, 6, 5]);
    assert_eq!(tok.decode(&[1, 6, 6, 5], true).unwrap(), "a ab");
    // Merges given are used instead of the scores' (none: the characters stay apart).
    let tok = build_with(|m| set(m, "tokenizer.ggml.merges", Value::Array(vec![]))).unwrap();
    assert_eq!(tok.encode("a ab", false).unwrap(), [3, 4, 3, 4, 5]);
    let tok = build_with(|m| set(m, "tokenizer.ggml.merges", vec!["a b"].into())).unwrap();
    assert_eq!(tok.encode("a ab", false).unwrap(), [3, 4, 3, 7]);
}

#[test]
fn neither_merges_nor_scores_is_an_error() {
    let message = gguf_error(build_with(|m| remove(m, "tokenizer.ggml.scores")));
    assert!(message.contains("tokenizer.ggml.scores"), "{message}");
    assert!(message.contains("tokenizer.ggml.merges"), "{message}");
    // Gemma ranks by position and needs no scores.
    build_with(|m| {
        remove(m, "tokenizer.ggml.scores");
        set(m, "general.architecture", "gemma3".into());
    })
    .unwrap();
}

#[test]
fn scores_of_the_wrong_length_are_an_error() {
    let message = gguf_error(build_with(|m| {
        set(m, "tokenizer.ggml.scores", vec![0f32; 5].into())
    }));
    assert!(message.contains("tokenizer.ggml.scores"), "{message}");
    assert!(message.contains('5') && message.contains('8'), "{message}");
}

#[test]
fn scores_that_are_not_numbers_are_an_error() {
    let message = gguf_error(build_with(|m| {
        set(m, "tokenizer.ggml.scores", vec!["x"; 8].into())
    }));
    assert!(message.contains("tokenizer.ggml.scores[0]"), "{message}");
}

#[test]
fn token_types_out_of_range_are_an_error() {
    let message = gguf_error(build_with(|m| {
        set(
            m,
            "tokenizer.ggml.token_type",
            vec![2i32, 3, 3, 1, 7, 1, 1, 1].into(),
        )
    }));
    assert!(
        message.contains("tokenizer.ggml.token_type[4]"),
        "{message}"
    );
    assert!(message.contains('7'), "{message}");
}

#[test]
fn malformed_merges_are_an_error() {
    let message = gguf_error(build_with(|m| {
        set(m, "tokenizer.ggml.merges", vec!["a b", "a b c"].into())
    }));
    assert!(message.contains("tokenizer.ggml.merges[1]"), "{message}");
    let message = gguf_error(build_with(|m| {
        set(m, "tokenizer.ggml.merges", vec!["a x"].into())
    }));
    assert!(message.contains("tokenizer.ggml.merges"), "{message}");
}

#[test]
fn a_special_id_past_the_vocabulary_is_an_error() {
    let message = gguf_error(build_with(|m| {
        set(m, "tokenizer.ggml.unknown_token_id", 99u32.into())
    }));
    assert!(
        message.contains("tokenizer.ggml.unknown_token_id"),
        "{message}"
    );
}
