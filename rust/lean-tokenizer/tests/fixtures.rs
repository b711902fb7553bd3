//! lean-tokenizer against transformers' results on the real test models' tokenizers
//! (tests/data/*.json, written by scripts/gen_tokenizer_fixtures.py) and against the models' GGUF
//! vocabularies.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use lean_tokenizer::{ChatMessage, StreamDecoder, Tokenizer, TokenizerError};
use serde::Deserialize;
use sha2::{Digest, Sha256};

const SMOLLM2: &str = "smollm2-135m-instruct";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct";

#[derive(Deserialize)]
struct Fixture {
    vocab_size: usize,
    texts: Vec<TextCase>,
    random_ids: Vec<IdsCase>,
    chats: Vec<ChatCase>,
    gguf_vocab: GgufVocab,
}

#[derive(Deserialize)]
struct TextCase {
    text: String,
    ids: Vec<u32>,
    ids_with_special: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

#[derive(Deserialize)]
struct IdsCase {
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct GgufVocab {
    file: String,
    count: usize,
    sha256_newline_joined: String,
}

/// The models directory, or None (after saying so) when it is absent outside CI.
fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    if dir.join(SMOLLM2).join("tokenizer.json").is_file()
        && dir.join(QWEN).join("tokenizer.json").is_file()
    {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "test models missing in {} (run scripts/fetch-test-models.sh)",
        dir.display()
    );
    eprintln!(
        "skipping: test models missing in {} (run scripts/fetch-test-models.sh)",
        dir.display()
    );
    None
}

fn fixture(name: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn load(models: &Path, name: &str) -> Tokenizer {
    Tokenizer::from_path(&models.join(name)).unwrap()
}

/// `tokenizer.ggml.tokens` of a GGUF file (v2/v3, little-endian), reading only the metadata.
fn gguf_tokens(path: &Path) -> Vec<String> {
    struct Reader(BufReader<File>);
    impl Reader {
        fn bytes<const N: usize>(&mut self) -> [u8; N] {
            let mut b = [0; N];
            self.0.read_exact(&mut b).unwrap();
            b
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes(self.bytes())
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.bytes())
        }
        fn string(&mut self) -> String {
            let len = self.u64() as usize;
            let mut b = vec![0; len];
            self.0.read_exact(&mut b).unwrap();
            String::from_utf8(b).unwrap()
        }
        fn skip_value(&mut self, value_type: u32) {
            match value_type {
                0 | 1 | 7 => drop(self.bytes::<1>()),
                2 | 3 => drop(self.bytes::<2>()),
                4..=6 => drop(self.bytes::<4>()),
                10..=12 => drop(self.bytes::<8>()),
                8 => drop(self.string()),
                9 => {
                    let item_type = self.u32();
                    for _ in 0..self.u64() {
                        self.skip_value(item_type);
                    }
                }
                other => panic!("unknown GGUF value type {other}"),
            }
        }
    }
    let mut r = Reader(BufReader::new(File::open(path).unwrap()));
    assert_eq!(&r.bytes::<4>(), b"GGUF");
    assert!(matches!(r.u32(), 2 | 3));
    let _tensor_count = r.u64();
    for _ in 0..r.u64() {
        let key = r.string();
        let value_type = r.u32();
        if key == "tokenizer.ggml.tokens" {
            assert_eq!(
                (value_type, r.u32()),
                (9, 8),
                "tokens must be an array of strings"
            );
            return (0..r.u64()).map(|_| r.string()).collect();
        }
        r.skip_value(value_type);
    }
    panic!("{} has no tokenizer.ggml.tokens", path.display());
}

/// The GGUF vocabulary of a test model, checked against gguf-py's count and hash.
fn model_vocab(models: &Path, name: &str) -> Vec<String> {
    let expected = fixture(name).gguf_vocab;
    let tokens = gguf_tokens(&models.join(&expected.file));
    assert_eq!(tokens.len(), expected.count);
    let digest = Sha256::digest(tokens.join("\n").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex, expected.sha256_newline_joined,
        "GGUF token list differs from gguf-py's"
    );
    tokens
}

fn as_strs(tokens: &[String]) -> Vec<&str> {
    tokens.iter().map(String::as_str).collect()
}

fn stream_decode(tok: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> (Vec<String>, String) {
    let mut stream = StreamDecoder::new(skip_special_tokens);
    let mut chunks = Vec::new();
    for &id in ids {
        if let Some(chunk) = stream.push(tok, id).unwrap() {
            assert!(!chunk.is_empty());
            chunks.push(chunk);
        }
    }
    let rest = stream.finish(tok).unwrap();
    (chunks, rest)
}

/// Streaming `ids` gives `decode(ids)`, and no chunk shows U+FFFD that the full text lacks
/// (a character split across tokens is held back until complete).
fn assert_stream_matches_decode(tok: &Tokenizer, ids: &[u32]) {
    for skip_special_tokens in [false, true] {
        let expected = tok.decode(ids, skip_special_tokens).unwrap();
        let (chunks, rest) = stream_decode(tok, ids, skip_special_tokens);
        let streamed = chunks.concat() + &rest;
        assert_eq!(
            streamed, expected,
            "ids {ids:?} (skip_special_tokens {skip_special_tokens})"
        );
        if !expected.contains(char::REPLACEMENT_CHARACTER) {
            assert!(rest.is_empty(), "complete text held back: {rest:?}");
            for chunk in &chunks {
                assert!(
                    !chunk.contains(char::REPLACEMENT_CHARACTER),
                    "broken character emitted for ids {ids:?}"
                );
            }
        }
    }
}

fn check_texts(name: &str) {
    let Some(models) = models_dir() else { return };
    let tok = load(&models, name);
    let fixture = fixture(name);
    assert_eq!(tok.vocab_size(), fixture.vocab_size);
    for case in &fixture.texts {
        assert_eq!(
            tok.encode(&case.text, false).unwrap(),
            case.ids,
            "encode {:?}",
            case.text
        );
        assert_eq!(
            tok.encode(&case.text, true).unwrap(),
            case.ids_with_special,
            "encode+special {:?}",
            case.text
        );
        assert_eq!(
            tok.decode(&case.ids, false).unwrap(),
            case.decoded,
            "decode {:?}",
            case.ids
        );
        assert_eq!(
            tok.decode(&case.ids, true).unwrap(),
            case.decoded_skip_special,
            "decode skip {:?}",
            case.ids
        );
        assert_stream_matches_decode(&tok, &case.ids);
    }
    for case in &fixture.random_ids {
        assert_eq!(
            tok.decode(&case.ids, false).unwrap(),
            case.decoded,
            "decode {:?}",
            case.ids
        );
        assert_eq!(
            tok.decode(&case.ids, true).unwrap(),
            case.decoded_skip_special,
            "decode skip {:?}",
            case.ids
        );
        assert_stream_matches_decode(&tok, &case.ids);
    }
}

fn check_chats(name: &str) {
    let Some(models) = models_dir() else { return };
    let tok = load(&models, name);
    assert!(tok.has_chat_template());
    for case in fixture(name).chats {
        let rendered = tok
            .apply_chat_template(&case.messages, case.add_generation_prompt)
            .unwrap();
        assert_eq!(rendered, case.rendered, "messages {:?}", case.messages);
        assert_eq!(
            tok.encode_chat(&case.messages, case.add_generation_prompt)
                .unwrap(),
            case.ids
        );
        assert_stream_matches_decode(&tok, &case.ids);
    }
}

#[test]
fn smollm2_texts_match_transformers() {
    check_texts(SMOLLM2);
}

#[test]
fn qwen_texts_match_transformers() {
    check_texts(QWEN);
}

#[test]
fn smollm2_chats_match_transformers() {
    check_chats(SMOLLM2);
}

#[test]
fn qwen_chats_match_transformers() {
    check_chats(QWEN);
}

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn stream_decoder_matches_decode_on_random_ids() {
    let Some(models) = models_dir() else { return };
    for name in [SMOLLM2, QWEN] {
        let tok = load(&models, name);
        let vocab_size = tok.vocab_size();
        // Tokens that are pieces of a multi-byte character, tokens of whole multi-byte characters,
        // and the special tokens.
        let fragments: Vec<u32> = (0..vocab_size as u32)
            .filter(|&id| tok.decode(&[id], false).unwrap().contains('\u{fffd}'))
            .collect();
        assert!(
            fragments.len() > 50,
            "{name}: only {} fragment tokens",
            fragments.len()
        );
        let multibyte = tok
            .encode("中文 😀👨‍👩‍👧 e\u{301} Ελληνικά 𝔸 한국어", false)
            .unwrap();
        let specials: Vec<u32> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            .iter()
            .map(|t| tok.token_to_id(t).unwrap())
            .collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ vocab_size as u64);
        for _ in 0..400 {
            let len = 1 + rng.below(48);
            let ids: Vec<u32> = (0..len)
                .map(|_| match rng.below(10) {
                    0..=3 => fragments[rng.below(fragments.len())],
                    4..=5 => multibyte[rng.below(multibyte.len())],
                    6 => specials[rng.below(specials.len())],
                    _ => rng.below(vocab_size) as u32,
                })
                .collect();
            assert_stream_matches_decode(&tok, &ids);
        }
    }
}

#[test]
fn stream_decoder_holds_split_characters_back() {
    let Some(models) = models_dir() else { return };
    let tok = load(&models, QWEN);
    // A character that takes several byte-level tokens: nothing may come out before the last.
    let (character, ids) = ["𐍈", "𝔸", "🦀", "ꙮ"]
        .iter()
        .map(|c| (*c, tok.encode(c, false).unwrap()))
        .find(|(_, ids)| ids.len() > 1)
        .unwrap();
    let mut stream = StreamDecoder::new(false);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(stream.push(&tok, id).unwrap(), None);
    }
    assert_eq!(
        stream.push(&tok, ids[ids.len() - 1]).unwrap().as_deref(),
        Some(character)
    );
    assert_eq!(stream.finish(&tok).unwrap(), "");
    // An incomplete character at the end comes out of finish() as decode writes it.
    let mut stream = StreamDecoder::new(false);
    assert_eq!(stream.push(&tok, ids[0]).unwrap(), None);
    assert_eq!(
        stream.finish(&tok).unwrap(),
        tok.decode(&ids[..1], false).unwrap()
    );
}

#[test]
fn special_tokens_and_stop_ids() {
    let Some(models) = models_dir() else { return };
    let smollm2 = load(&models, SMOLLM2);
    assert_eq!(smollm2.bos_token(), Some("<|im_start|>"));
    assert_eq!(smollm2.eos_token(), Some("<|im_end|>"));
    assert_eq!(smollm2.eos_token_id(), Some(2));
    assert_eq!(smollm2.eos_token_ids(), vec![2, 0]);
    let qwen = load(&models, QWEN);
    assert_eq!(qwen.bos_token(), Some("<|endoftext|>"));
    assert_eq!(qwen.eos_token(), Some("<|im_end|>"));
    assert_eq!(qwen.eos_token_ids(), vec![151645, 151643]);
    assert_eq!(qwen.token_to_id("<|im_start|>"), Some(151644));
    assert_eq!(qwen.id_to_token(151644).as_deref(), Some("<|im_start|>"));
    assert_eq!(qwen.id_to_token(9707).as_deref(), Some("Hello"));
    assert_eq!(qwen.id_to_token(1_000_000), None);
}

#[test]
fn vocabularies_match_their_gguf_models() {
    let Some(models) = models_dir() else { return };
    for name in [SMOLLM2, QWEN] {
        let tokens = model_vocab(&models, name);
        load(&models, name).check_vocab(&as_strs(&tokens)).unwrap();
    }
}

#[test]
fn vocabulary_mismatches_are_reported() {
    let Some(models) = models_dir() else { return };
    let smollm2 = load(&models, SMOLLM2);
    let qwen = load(&models, QWEN);
    let smollm2_vocab = model_vocab(&models, SMOLLM2);
    let qwen_vocab = model_vocab(&models, QWEN);

    let err = smollm2.check_vocab(&as_strs(&qwen_vocab)).unwrap_err();
    assert_eq!(
        err,
        TokenizerError::VocabToken {
            id: 0,
            tokenizer: Some("<|endoftext|>".into()),
            model: "!".into()
        }
    );
    assert!(
        err.to_string().contains("at id 0") && err.to_string().contains("\"!\""),
        "{err}"
    );

    let err = qwen.check_vocab(&as_strs(&smollm2_vocab)).unwrap_err();
    assert_eq!(
        err,
        TokenizerError::VocabSize {
            tokenizer: 151_936,
            model: 49_152
        }
    );
    assert!(err.to_string().contains("49152"), "{err}");

    // Padding rows beyond the tokenizer's vocabulary are fine; one changed token is not.
    let mut padded = smollm2_vocab.clone();
    padded.extend((0..64).map(|i| format!("[PAD{i}]")));
    smollm2.check_vocab(&as_strs(&padded)).unwrap();
    let mut changed = smollm2_vocab.clone();
    changed[30_000] = "Ġsomething".into();
    let err = smollm2.check_vocab(&as_strs(&changed)).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::VocabToken { id: 30_000, model, .. } if model == "Ġsomething"),
        "{err}"
    );
    let err = smollm2
        .check_vocab(&as_strs(&smollm2_vocab[..49_000]))
        .unwrap_err();
    assert_eq!(
        err,
        TokenizerError::VocabSize {
            tokenizer: 49_152,
            model: 49_000
        }
    );
}

#[test]
fn chat_template_sources() {
    let Some(models) = models_dir() else { return };
    let dir = models.join(SMOLLM2);
    let json = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let template = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
    let messages = [ChatMessage::new("user", "Hi")];
    let expected = load(&models, SMOLLM2)
        .apply_chat_template(&messages, true)
        .unwrap();

    let config_with = |chat_template: serde_json::Value| {
        serde_json::to_vec(&serde_json::json!({"eos_token": {"content": "<|im_end|>"}, "chat_template": chat_template}))
            .unwrap()
    };
    // The template as a config string, and as the default of a named list.
    let tok =
        Tokenizer::from_bytes(&json, Some(&config_with(template.clone().into())), None).unwrap();
    assert_eq!(tok.apply_chat_template(&messages, true).unwrap(), expected);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    let list = serde_json::json!([{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]);
    let tok = Tokenizer::from_bytes(&json, Some(&config_with(list)), None).unwrap();
    assert_eq!(tok.apply_chat_template(&messages, true).unwrap(), expected);
    // chat_template.jinja wins over the config.
    let tok =
        Tokenizer::from_bytes(&json, Some(&config_with("config".into())), Some("file")).unwrap();
    assert_eq!(tok.apply_chat_template(&messages, true).unwrap(), "file");

    let tok = Tokenizer::from_bytes(&json, None, None).unwrap();
    assert!(!tok.has_chat_template());
    let err = tok.apply_chat_template(&messages, true).unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTemplate(_)), "{err}");
    let list = serde_json::json!([{"name": "tool_use", "template": "x"}]);
    let err = Tokenizer::from_bytes(&json, Some(&config_with(list)), None)
        .unwrap()
        .encode_chat(&messages, true);
    assert!(err.unwrap_err().to_string().contains("tool_use"));

    let tok = Tokenizer::from_bytes(&json, None, Some("{% if %}")).unwrap();
    assert!(!tok.has_chat_template());
    assert!(matches!(
        tok.apply_chat_template(&messages, true),
        Err(TokenizerError::Template(_))
    ));
    let tok = Tokenizer::from_bytes(
        &json,
        None,
        Some("{{ raise_exception('only user roles') }}"),
    )
    .unwrap();
    let err = tok.apply_chat_template(&messages, true).unwrap_err();
    assert!(err.to_string().contains("only user roles"), "{err}");
    let err = load(&models, SMOLLM2)
        .apply_chat_template(&[], true)
        .unwrap_err();
    assert!(err.to_string().contains("empty conversation"), "{err}");
}

#[test]
fn bad_inputs_give_named_errors() {
    let err = Tokenizer::from_bytes(b"{not json", None, None)
        .err()
        .unwrap();
    assert!(
        matches!(err, TokenizerError::TokenizerJson(_))
            && err.to_string().contains("tokenizer.json"),
        "{err}"
    );
    let err = Tokenizer::from_path(Path::new("/nonexistent/lean/tokenizer"))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("/nonexistent/lean/tokenizer"),
        "{err}"
    );

    let Some(models) = models_dir() else { return };
    let json = std::fs::read(models.join(SMOLLM2).join("tokenizer.json")).unwrap();
    let err = Tokenizer::from_bytes(&json, Some(b"[1, 2]"), None)
        .err()
        .unwrap();
    assert!(matches!(err, TokenizerError::Config(_)), "{err}");
    let err = Tokenizer::from_bytes(&json, Some(br#"{"eos_token": 5}"#), None)
        .err()
        .unwrap();
    assert!(err.to_string().contains("eos_token"), "{err}");
    // A tokenizer.json file path finds its sibling files.
    let tok = Tokenizer::from_path(&models.join(SMOLLM2).join("tokenizer.json")).unwrap();
    assert!(tok.has_chat_template());
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
}

#[test]
fn tokenizer_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
}

#[test]
fn chat_template_extra_variables_may_not_replace_the_conversation() {
    let Some(models) = models_dir() else { return };
    let tok = load(&models, "smollm2-135m-instruct");
    let hi = [ChatMessage::new("user", "hi")];
    for name in ["messages", "add_generation_prompt"] {
        let mut kwargs = serde_json::Map::new();
        kwargs.insert(name.into(), serde_json::json!([]));
        let err = tok.encode_chat_with(&hi, true, &kwargs).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
    // Variables the template does not read change nothing.
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("enable_thinking".into(), serde_json::json!(false));
    assert_eq!(
        tok.encode_chat_with(&hi, true, &kwargs).unwrap(),
        tok.encode_chat(&hi, true).unwrap()
    );
}
