//! The fuzz targets' bodies: each takes arbitrary bytes and runs one of lean's readers of
//! untrusted input on them. A body may return early on an error (that is the expected outcome
//! for most inputs) but must never panic, hang or allocate without bound. cargo-fuzz runs them
//! in `fuzz/` (scripts/fuzz.sh); `tests/replay.rs` replays the committed corpora
//! (`fuzz/corpus/<target>/`) on stable Rust in every `cargo test`.
use lean::cpu::CpuSession;
use lean::{ChatMessage, Logits, Model, ModelBytes, Tokenizer};
use lean_gguf::Gguf;

pub mod seeds;

/// A fuzz target: its name (the corpus directory and the cargo-fuzz binary) and its body.
pub type Target = (&'static str, fn(&[u8]));

pub const TARGETS: [Target; 5] = [
    ("gguf", gguf),
    ("model", model),
    ("tokenizer_gguf", tokenizer_gguf),
    ("tokenizer_json", tokenizer_json),
    ("chat_template", chat_template),
];

/// The GGUF parser: the whole file, and the header alone (as a stream reads it).
pub fn gguf(data: &[u8]) {
    if let Ok(gguf) = Gguf::parse(data) {
        for info in &gguf.tensors {
            let bytes = gguf.tensor_data(data, info);
            assert_eq!(bytes.len(), info.size, "{}", info.name);
        }
        let _ = gguf.architecture();
    }
    let _ = Gguf::parse_header(data, data.len() as u64);
}

/// Largest model (embedding + layers, in f32 elements) the `model` target runs a forward pass
/// of: a fuzzed file's tensors are tiny, but its hyper-parameters may claim anything.
const MAX_FORWARD_ELEMENTS: usize = 1 << 22;

/// Model construction from a GGUF (config, description, shapes, types, the vocabulary check),
/// then, for a small model, a forward pass of two tokens on the CPU. (The tokenizer from the same
/// metadata is `tokenizer_gguf`'s: building it here too made this target 4x slower.)
pub fn model(data: &[u8]) {
    let Ok(model) = Model::load(ModelBytes::Owned(data.to_vec())) else {
        return;
    };
    let c = &model.config;
    let elements = c.vocab_size.saturating_mul(c.n_embd).saturating_add(
        c.n_layers
            .saturating_mul(c.n_embd)
            .saturating_mul(c.n_ff.saturating_add(c.q_dim()).saturating_add(c.kv_dim())),
    );
    if elements <= MAX_FORWARD_ELEMENTS && c.vocab_size > 0 {
        let mut session = CpuSession::new(&model, 8);
        let tokens = [0, (c.vocab_size - 1) as u32];
        let vocab = c.vocab_size;
        let mut seen = 0;
        session
            .forward(&model, &tokens, Logits::Last, |_, logits| {
                assert_eq!(logits.len(), vocab);
                seen += 1;
            })
            .expect("a loaded model runs");
        assert_eq!(seen, 1);
        // Past the context: an error, not a panic.
        assert!(session
            .forward(&model, &[0; 7], Logits::Last, |_, _| {})
            .is_err());
    }
}

/// The tokenizer built from a GGUF's metadata alone.
pub fn tokenizer_gguf(data: &[u8]) {
    if let Ok(gguf) = Gguf::parse_header(data, data.len() as u64) {
        tokenize(Tokenizer::from_gguf(&gguf, None, None).ok());
    }
}

/// tokenizer.json loading.
pub fn tokenizer_json(data: &[u8]) {
    tokenize(Tokenizer::from_bytes(data, None, None).ok());
}

/// Chat-template rendering: the input is the template's source, run on a fixed conversation
/// (fuel, output size and recursion are bounded inside lean-tokenizer).
pub fn chat_template(data: &[u8]) {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    // One tokenizer for every input (parsing its JSON each time would be most of the work);
    // only the template changes.
    static TOKENIZER: std::sync::OnceLock<std::sync::Mutex<Tokenizer>> = std::sync::OnceLock::new();
    let mut tokenizer = TOKENIZER
        .get_or_init(|| {
            let json = seeds::tokenizer_json();
            let tokenizer = Tokenizer::from_bytes(json.as_bytes(), None, None)
                .expect("the fixed tokenizer.json loads");
            std::sync::Mutex::new(tokenizer)
        })
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    tokenizer.set_chat_template(source);
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hello <|im_end|> {{ 7*7 }}"),
        ChatMessage::new("assistant", "Hi."),
        ChatMessage::new("user", "Bye"),
    ];
    for add_generation_prompt in [true, false] {
        if let Ok(ids) = tokenizer.encode_chat(&messages, add_generation_prompt) {
            let _ = tokenizer.decode(&ids, false);
        }
    }
}

/// Encodes and decodes a few texts with a tokenizer that loaded.
fn tokenize(tokenizer: Option<Tokenizer>) {
    let Some(t) = tokenizer else { return };
    for text in [
        "Hello, world!",
        " spaces  and\ttabs\n",
        "ünïcödé 漢字 🦀",
        "",
    ] {
        for special in [false, true] {
            if let Ok(ids) = t.encode(text, special) {
                let _ = t.decode(&ids, false);
                let _ = t.decode(&ids, true);
            }
        }
    }
}
