//! The tokenizer built from a GGUF's own metadata (`Tokenizer::from_gguf`) against transformers
//! (tests/data/corpus*.json, written by scripts/gen_tokenizer_corpus.py from the tokenizer
//! directories transformers converts from these GGUFs) and against our tokenizer.json path, on
//! every test model file; and its errors on malformed metadata.

use std::io::Read;
use std::path::{Path, PathBuf};

use lean_gguf::{Gguf, GgufError, GgufWriter, Value};
use lean_tokenizer::{ChatMessage, Tokenizer, TokenizerError};
use serde::Deserialize;

/// (model file, tokenizer directory of its family).
const FILES: [(&str, &str); 5] = [
    ("smollm2-135m-instruct-q4_1.gguf", "smollm2-135m-instruct"),
    ("smollm2-135m-instruct-q4_0.gguf", "smollm2-135m-instruct"),
    ("smollm2-135m-instruct-q8_0.gguf", "smollm2-135m-instruct"),
    (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct",
    ),
    (
        "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
        "qwen2.5-coder-0.5b-instruct",
    ),
];

#[derive(Deserialize)]
struct CorpusIds {
    ids: Vec<Vec<u32>>,
    ids_with_special: Vec<Vec<u32>>,
    roundtrip: Vec<bool>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

fn data(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    if FILES.iter().all(|(file, _)| dir.join(file).is_file()) {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "test models missing in {} (run scripts/fetch-test-models.sh)",
        dir.display()
    );
    eprintln!("skipping: test models missing in {}", dir.display());
    None
}

/// The GGUF's metadata, read from the file's first bytes only (as a browser reads a download).
fn header(path: &Path) -> Gguf {
    let file_len = std::fs::metadata(path).unwrap().len();
    let mut prefix = Vec::new();
    let mut want = 1 << 20;
    loop {
        let mut file = std::fs::File::open(path).unwrap();
        prefix.clear();
        file.by_ref()
            .take(want as u64)
            .read_to_end(&mut prefix)
            .unwrap();
        match Gguf::parse_header(&prefix, file_len) {
            Ok(gguf) => return gguf,
            Err(GgufError::NeedMoreBytes { .. }) => want *= 2,
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }
}

fn ids_of(tok: &Tokenizer, text: &str, special: bool) -> Vec<u32> {
    tok.encode(text, special).unwrap()
}

/// The first string whose ids differ, with both lists, so a failure says what to look at.
fn assert_same_ids(
    what: &str,
    corpus: &[String],
    want: &[Vec<u32>],
    got: impl Fn(&str) -> Vec<u32>,
) {
    assert_eq!(
        corpus.len(),
        want.len(),
        "{what}: corpus and reference lengths"
    );
    let mut wrong = 0;
    let mut first = None;
    for (text, want) in corpus.iter().zip(want) {
        let got = got(text);
        if &got != want {
            wrong += 1;
            first.get_or_insert((text.clone(), want.clone(), got));
        }
    }
    if let Some((text, want, got)) = first {
        panic!(
            "{what}: {wrong} of {} strings differ; first {text:?}:\n  want {want:?}\n  got  {got:?}",
            corpus.len()
        );
    }
}

#[test]
fn corpus_ids_equal_transformers_from_the_gguf_alone() {
    let Some(models) = models_dir() else { return };
    let corpus: Vec<String> = serde_json::from_str(&data("corpus.json")).unwrap();
    let reference: std::collections::HashMap<String, CorpusIds> =
        serde_json::from_str(&data("corpus-ids.json")).unwrap();
    for (file, family) in FILES {
        let want = &reference[family];
        let gguf = Tokenizer::from_gguf(&header(&models.join(file)), None, None).unwrap();
        assert!(gguf.is_from_gguf());
        assert_same_ids(&format!("{file} (GGUF)"), &corpus, &want.ids, |t| {
            ids_of(&gguf, t, false)
        });
        assert_same_ids(
            &format!("{file} (GGUF, special)"),
            &corpus,
            &want.ids_with_special,
            |t| ids_of(&gguf, t, true),
        );
        for ((text, ids), roundtrip) in corpus.iter().zip(&want.ids).zip(&want.roundtrip) {
            let decoded = gguf.decode(ids, false).unwrap();
            if *roundtrip {
                assert_eq!(&decoded, text, "{file}: decode({ids:?})");
            }
        }
    }
    // The reference itself is what our tokenizer.json path gives (the fixtures' other half).
    for family in ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"] {
        let json = Tokenizer::from_path(&models.join(family)).unwrap();
        assert!(!json.is_from_gguf());
        assert_same_ids(
            &format!("{family} (tokenizer.json)"),
            &corpus,
            &reference[family].ids,
            |t| ids_of(&json, t, false),
        );
    }
}

#[test]
fn gguf_and_tokenizer_json_agree_on_decoding_specials_and_stops() {
    let Some(models) = models_dir() else { return };
    for (file, family) in [FILES[0], FILES[3]] {
        let gguf = Tokenizer::from_gguf(&header(&models.join(file)), None, None).unwrap();
        let json = Tokenizer::from_path(&models.join(family)).unwrap();
        assert_eq!(gguf.vocab_size(), json.vocab_size(), "{file}");
        assert_eq!(gguf.eos_token_ids(), json.eos_token_ids(), "{file}");
        assert_eq!(gguf.bos_token(), json.bos_token(), "{file}");
        assert_eq!(gguf.eos_token(), json.eos_token(), "{file}");
        // Every id decodes the same, alone and in runs that join multi-byte pieces, with and
        // without the special tokens.
        let n = gguf.vocab_size() as u32;
        for id in 0..n {
            assert_eq!(
                gguf.id_to_token(id),
                json.id_to_token(id),
                "{file}: id {id}"
            );
        }
        let mut state = 0x2545_f491_u64;
        for _ in 0..300 {
            let ids: Vec<u32> = (0..12)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % n as u64) as u32
                })
                .collect();
            for skip in [false, true] {
                assert_eq!(
                    gguf.decode(&ids, skip),
                    json.decode(&ids, skip),
                    "{file}: {ids:?}"
                );
            }
        }
    }
}

#[test]
fn chat_prompts_from_the_gguf_template_equal_transformers() {
    let Some(models) = models_dir() else { return };
    let chats: std::collections::HashMap<String, Vec<Chat>> =
        serde_json::from_str(&data("corpus-chats.json")).unwrap();
    for (file, family) in FILES {
        let mut tok = Tokenizer::from_gguf(&header(&models.join(file)), None, None).unwrap();
        tok.set_template_time(Some(1_764_633_600));
        assert!(tok.has_chat_template(), "{file}");
        for chat in &chats[family] {
            let rendered = tok
                .apply_chat_template(&chat.messages, chat.add_generation_prompt)
                .unwrap();
            assert_eq!(rendered, chat.rendered, "{file}: {:?}", chat.messages);
            let ids = tok
                .encode_chat(&chat.messages, chat.add_generation_prompt)
                .unwrap();
            assert_eq!(ids, chat.ids, "{file}: {:?}", chat.messages);
        }
    }
}

#[test]
fn explicit_config_and_template_win_over_the_gguf() {
    let Some(models) = models_dir() else { return };
    let gguf = header(&models.join(FILES[0].0));
    let config =
        br#"{"chat_template": "{{ messages[0]['content'] }}!", "eos_token": "<|endoftext|>"}"#;
    let tok = Tokenizer::from_gguf(&gguf, Some(config), None).unwrap();
    let hi = [ChatMessage::new("user", "hi")];
    assert_eq!(tok.apply_chat_template(&hi, false).unwrap(), "hi!");
    assert_eq!(tok.eos_token(), Some("<|endoftext|>"));
    assert_eq!(tok.eos_token_ids()[0], 0);
    let tok =
        Tokenizer::from_gguf(&gguf, Some(config), Some("[{{ messages[0]['content'] }}]")).unwrap();
    assert_eq!(tok.apply_chat_template(&hi, false).unwrap(), "[hi]");
}

// ---- malformed metadata: each gives an error that names the key, never a panic ----

/// A tiny byte-level vocabulary: the 256 byte characters plus "ab" (one merge) and a control
/// token, with `edit` changing the metadata before it is written.
fn tiny(edit: impl FnOnce(&mut Vec<(String, Value)>)) -> Result<Tokenizer, TokenizerError> {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into()];
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
    }
    tokens.push("ab".into());
    let mut types = vec![3i32];
    types.resize(tokens.len(), 1);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), "llama".into()),
        ("tokenizer.ggml.model".into(), "gpt2".into()),
        ("tokenizer.ggml.pre".into(), "smollm".into()),
        ("tokenizer.ggml.tokens".into(), tokens.into()),
        ("tokenizer.ggml.token_type".into(), types.into()),
        ("tokenizer.ggml.merges".into(), vec!["a b"].into()),
        ("tokenizer.ggml.eos_token_id".into(), 0u32.into()),
    ];
    edit(&mut kv);
    let mut writer = GgufWriter::new();
    for (key, value) in kv {
        writer.add(key, value);
    }
    let bytes = writer.finish().unwrap();
    Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap(), None, None)
}

fn byte_char(b: u8) -> char {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    if printable(b as u32) {
        return char::from_u32(b as u32).unwrap();
    }
    let rank = (0..b as u32).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap()
}

fn set(kv: &mut Vec<(String, Value)>, key: &str, value: Value) {
    kv.retain(|(k, _)| k != key);
    kv.push((key.into(), value));
}

fn message(result: Result<Tokenizer, TokenizerError>) -> String {
    match result {
        Ok(_) => panic!("malformed metadata was accepted"),
        Err(e) => {
            assert!(matches!(e, TokenizerError::Gguf(_)), "{e:?}");
            e.to_string()
        }
    }
}

#[test]
fn a_tiny_byte_level_vocabulary_works() {
    let tok = tiny(|_| {}).unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), vec![257]);
    assert_eq!(
        tok.encode("a<|endoftext|>b", false).unwrap(),
        vec![1 + b'a' as u32, 0, 1 + b'b' as u32]
    );
    assert_eq!(tok.decode(&[257, 0], true).unwrap(), "ab");
    assert_eq!(tok.eos_token_ids(), vec![0]);
    assert!(!tok.has_chat_template());
}

/// Edits a file's metadata into a malformed one.
type Corruption = Box<dyn FnOnce(&mut Vec<(String, Value)>)>;

#[test]
fn malformed_tokenizer_metadata_is_refused_by_name() {
    let cases: Vec<(&str, Corruption)> = vec![
        (
            "tokenizer.ggml.merges is missing",
            Box::new(|kv| kv.retain(|(k, _)| k != "tokenizer.ggml.merges")),
        ),
        (
            "\"unheard-of\"",
            Box::new(|kv| set(kv, "tokenizer.ggml.pre", "unheard-of".into())),
        ),
        (
            "\"bpe-xl\"",
            Box::new(|kv| set(kv, "tokenizer.ggml.model", "bpe-xl".into())),
        ),
        (
            "no tokenizer.ggml.model",
            Box::new(|kv| kv.retain(|(k, _)| k != "tokenizer.ggml.model")),
        ),
        (
            "tokenizer.ggml.token_type[1] is 9",
            Box::new(|kv| {
                let mut types = vec![3i32, 9];
                types.resize(258, 1);
                set(kv, "tokenizer.ggml.token_type", types.into());
            }),
        ),
        (
            "tokenizer.ggml.token_type has 3 entries",
            Box::new(|kv| set(kv, "tokenizer.ggml.token_type", vec![1i32, 1, 1].into())),
        ),
        (
            "tokenizer.ggml.eos_token_id is 4000",
            Box::new(|kv| set(kv, "tokenizer.ggml.eos_token_id", 4000u32.into())),
        ),
        (
            "tokenizer.ggml.merges[0] is \"a b c\"",
            Box::new(|kv| set(kv, "tokenizer.ggml.merges", vec!["a b c"].into())),
        ),
        (
            "tokenizer.ggml.merges",
            Box::new(|kv| set(kv, "tokenizer.ggml.merges", vec!["a zz"].into())),
        ),
        (
            "tokenizer.ggml.tokens is empty",
            Box::new(|kv| {
                set(kv, "tokenizer.ggml.tokens", Vec::<String>::new().into());
                kv.retain(|(k, _)| {
                    k != "tokenizer.ggml.token_type" && k != "tokenizer.ggml.eos_token_id"
                });
            }),
        ),
        (
            "tokenizer.ggml.tokens",
            Box::new(|kv| set(kv, "tokenizer.ggml.tokens", vec![1u32, 2].into())),
        ),
    ];
    for (want, edit) in cases {
        let text = message(tiny(edit));
        assert!(text.contains(want), "want {want:?} in: {text}");
    }
}
