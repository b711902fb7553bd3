//! The tokenizer bridge: every token's bytes, as llguidance needs them, for the byte-level
//! (SmolLM2, Qwen2.5) and SentencePiece (Gemma 3) tokenizers; then constraints compiled over them.
use lean_constraint::{
    is_allowed, token_bytes, Constraint, ConstraintSpec, TokenEncoding, Vocabulary,
};
use lean_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")));
    if dir.join("smollm2-135m-instruct").is_dir() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "test models missing in {} (run scripts/fetch-test-models.sh)",
            dir.display()
        );
    }
    eprintln!("skipping: test models missing in {}", dir.display());
    None
}

fn tokenizer(name: &str) -> Option<Tokenizer> {
    Some(Tokenizer::from_path(&models_dir()?.join(name)).unwrap())
}

const TEXTS: [&str; 5] = [
    "Hello, world! {\"name\": \"Ada\", \"age\": 36}",
    "  two spaces,\ttab and\nnewline\r\n",
    "Grüße, 日本語, emoji 🦀 and ∑ symbols",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "[1, -2.5e3, true, null]",
];

/// Concatenating the bytes of a text's tokens gives the text back (what llguidance relies on to
/// decide which tokens a constraint allows), and special tokens carry the 0xFF marker.
fn check_round_trip(tok: &Tokenizer, expect: TokenEncoding, strip_leading_space: bool) {
    let (words, encoding) = token_bytes(tok, tok.vocab_size()).unwrap();
    assert_eq!(encoding, expect);
    for text in TEXTS {
        let ids = tok.encode(text, false).unwrap();
        let mut bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| words[id as usize].clone())
            .collect();
        if strip_leading_space && bytes.first() == Some(&b' ') && !text.starts_with(' ') {
            bytes.remove(0);
        }
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            text,
            "ids {ids:?} of {text:?}"
        );
    }
    for id in tok.eos_token_ids() {
        assert_eq!(
            words[id as usize][0], 0xFF,
            "stop id {id} is marked special"
        );
    }
    // No ordinary token is empty or marked.
    let a = tok
        .token_to_id("a")
        .unwrap_or_else(|| tok.encode("a", false).unwrap()[0]);
    assert_eq!(words[a as usize], b"a");
}

#[test]
fn smollm2_byte_level() {
    let Some(tok) = tokenizer("smollm2-135m-instruct") else {
        return;
    };
    check_round_trip(&tok, TokenEncoding::ByteLevel, false);
    let (words, _) = token_bytes(&tok, tok.vocab_size()).unwrap();
    // `Ġ` is a space, `Ċ` a newline.
    assert_eq!(words[tok.token_to_id("Ġthe").unwrap() as usize], b" the");
    assert_eq!(words[tok.token_to_id("Ċ").unwrap() as usize], b"\n");
}

#[test]
fn qwen25_byte_level() {
    let Some(tok) = tokenizer("qwen2.5-coder-0.5b-instruct") else {
        return;
    };
    check_round_trip(&tok, TokenEncoding::ByteLevel, false);
    // Ids past the tokenizer's (a model's padded logits) are empty: never allowed.
    let (words, _) = token_bytes(&tok, 152_000).unwrap();
    assert!(words[151_999].is_empty());
    let im_start = tok.token_to_id("<|im_start|>").unwrap() as usize;
    assert_eq!(words[im_start], b"\xFF<|im_start|>");
}

#[test]
fn gemma3_sentencepiece() {
    let Some(tok) = tokenizer("gemma-3-270m") else {
        return;
    };
    check_round_trip(&tok, TokenEncoding::SentencePiece { space: '▁' }, true);
    let (words, _) = token_bytes(&tok, tok.vocab_size()).unwrap();
    // Byte-fallback tokens stand for their byte; `▁` is a space.
    assert_eq!(words[tok.token_to_id("<0x41>").unwrap() as usize], b"A");
    assert_eq!(words[tok.token_to_id("<0xE2>").unwrap() as usize], [0xE2]);
    assert_eq!(words[tok.token_to_id("▁the").unwrap() as usize], b" the");
}

/// Greedy walk through a constraint with a fixed preference order (the lowest allowed id of the
/// tokens that spell `want`, else any allowed): the masks must let `want` be written token by
/// token and end it with a stop id.
fn write_through(vocab: &Arc<Vocabulary>, tok: &Tokenizer, spec: ConstraintSpec, want: &str) {
    let mut c = Constraint::new(vocab, &spec).unwrap();
    let ids = tok.encode(want, false).unwrap();
    for &id in &ids {
        let mask = c.mask().unwrap().to_vec();
        assert!(is_allowed(&mask, id), "{want:?}: token {id} not allowed");
        let accepting = c.is_accepting();
        for &stop in vocab.stop_ids() {
            assert_eq!(
                is_allowed(&mask, stop),
                accepting,
                "{want:?}: the end only where it may end"
            );
        }
        c.accept(id).unwrap();
    }
    let mask = c.mask().unwrap().to_vec();
    for &stop in vocab.stop_ids() {
        assert!(
            is_allowed(&mask, stop),
            "{want:?}: the end is allowed at the end"
        );
    }
}

#[test]
fn constraints_allow_what_they_match_and_refuse_the_rest() {
    for dir in [
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "gemma-3-270m",
    ] {
        let Some(tok) = tokenizer(dir) else { return };
        let vocab =
            Arc::new(Vocabulary::new(&tok, tok.vocab_size(), &tok.eos_token_ids()).unwrap());
        write_through(
            &vocab,
            &tok,
            ConstraintSpec::Regex("[0-9]{3}-[a-z]+".into()),
            "123-abc",
        );
        write_through(
            &vocab,
            &tok,
            ConstraintSpec::JsonSchema(serde_json::json!({
                "type": "object",
                "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["name", "n"],
                "additionalProperties": false
            })),
            r#"{"name":"Ada","n":36}"#,
        );
        write_through(
            &vocab,
            &tok,
            ConstraintSpec::Lark("start: \"yes\" | \"no\"".into()),
            "no",
        );
        // A token the mask refuses is refused by accept too.
        let mut c = Constraint::new(&vocab, &ConstraintSpec::Regex("[0-9]+".into())).unwrap();
        let mask = c.mask().unwrap().to_vec();
        let letter = tok.encode("x", false).unwrap()[0];
        assert!(!is_allowed(&mask, letter));
        assert!(
            vocab.stop_ids().iter().all(|&s| !is_allowed(&mask, s)),
            "empty is not a number"
        );
        assert!(c.accept(letter).is_err());
    }
}

#[test]
fn rejected_constraints_say_why() {
    let Some(tok) = tokenizer("smollm2-135m-instruct") else {
        return;
    };
    let vocab = Arc::new(Vocabulary::new(&tok, tok.vocab_size(), &tok.eos_token_ids()).unwrap());
    let error = |spec| Constraint::new(&vocab, &spec).unwrap_err().to_string();
    let e = error(ConstraintSpec::JsonSchema(
        serde_json::json!({"type": "frobnicate"}),
    ));
    assert!(
        e.starts_with("invalid json_schema:") && e.contains("frobnicate"),
        "{e}"
    );
    let e = error(ConstraintSpec::JsonSchema(serde_json::json!(
        {"type": "integer", "minimum": 5, "maximum": 2}
    )));
    assert!(e.starts_with("invalid json_schema:"), "{e}");
    let e = error(ConstraintSpec::JsonSchema(serde_json::json!("object")));
    assert!(e.contains("a schema is a JSON object"), "{e}");
    let e = error(ConstraintSpec::Regex("[a-".into()));
    assert!(e.starts_with("invalid regex:"), "{e}");
    let e = error(ConstraintSpec::Lark("start: foo".into()));
    assert!(
        e.starts_with("invalid grammar:") && e.contains("foo"),
        "{e}"
    );
}

/// The masks a constraint meets following `ids` one token at a time from a fresh start, the
/// first `skip` of them accepted beforehand.
fn masks_followed(
    vocab: &Arc<Vocabulary>,
    spec: &ConstraintSpec,
    skip: &[u32],
    ids: &[u32],
) -> Vec<u32> {
    let mut c = Constraint::new(vocab, spec).unwrap();
    for &id in skip {
        c.accept(id).unwrap();
    }
    let mut masks = c.mask().unwrap().to_vec();
    for &id in ids {
        c.accept(id).unwrap();
        masks.extend_from_slice(c.mask().unwrap());
    }
    masks
}

/// How many of `ids` a fresh constraint takes one at a time (the first `skip` accepted first).
fn allowed_prefix(
    vocab: &Arc<Vocabulary>,
    spec: &ConstraintSpec,
    skip: &[u32],
    ids: &[u32],
) -> usize {
    let mut c = Constraint::new(vocab, spec).unwrap();
    for &id in skip {
        c.accept(id).unwrap();
    }
    ids.iter()
        .take_while(|&&id| is_allowed(c.mask().unwrap(), id) && c.accept(id).is_ok())
        .count()
}

#[test]
fn masks_along_a_guess_are_the_masks_of_following_it_and_change_nothing() {
    for dir in [
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "gemma-3-270m",
    ] {
        let Some(tok) = tokenizer(dir) else { return };
        let vocab =
            Arc::new(Vocabulary::new(&tok, tok.vocab_size(), &tok.eos_token_ids()).unwrap());
        let words = lean_constraint::mask_words(vocab.len());
        let spec = ConstraintSpec::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["name", "n"],
            "additionalProperties": false
        }));
        let ids = tok.encode(r#"{"name":"Ada","n":36}"#, false).unwrap();
        let letter = tok.encode("x", false).unwrap()[0];
        let eos = vocab.stop_ids()[0];
        let mut refused = 0;
        for start in 0..ids.len() {
            let mut c = Constraint::new(&vocab, &spec).unwrap();
            for &id in &ids[..start] {
                c.accept(id).unwrap();
            }
            let before = c.mask().unwrap().to_vec();
            let rest = &ids[start..];
            let mut masks = Vec::new();
            // The whole rest: followed to the end (the object completes it).
            assert_eq!(c.masks_along(rest, &mut masks).unwrap(), rest.len());
            assert_eq!(masks.len(), (rest.len() + 1) * words);
            assert_eq!(masks, masks_followed(&vocab, &spec, &ids[..start], rest));
            // Nothing follows a complete output, not even a stop id.
            let mut longer = rest.to_vec();
            longer.extend([eos, letter]);
            assert_eq!(c.masks_along(&longer, &mut masks).unwrap(), rest.len());
            // A refused token ends the guess: its mask is the last one.
            let mut wrong = rest[..rest.len() / 2].to_vec();
            wrong.extend([letter, rest[0]]);
            let kept = c.masks_along(&wrong, &mut masks).unwrap();
            let allowed = allowed_prefix(&vocab, &spec, &ids[..start], &wrong);
            assert_eq!(kept, allowed, "{dir}: a guess with 'x' from {start}");
            refused += usize::from(kept < wrong.len());
            assert_eq!(
                masks,
                masks_followed(&vocab, &spec, &ids[..start], &wrong[..kept])
            );
            // A stop id where the output may not end yet ends the guess too.
            assert_eq!(c.masks_along(&[eos, rest[0]], &mut masks).unwrap(), 0);
            assert_eq!(masks, before);
            // The constraint is where it was: same mask, and it goes on as before.
            assert_eq!(c.mask().unwrap(), &before[..], "{dir}: moved at {start}");
            c.accept(rest[0]).unwrap();
        }
        assert!(
            refused * 2 > ids.len(),
            "{dir}: 'x' is refused outside the string"
        );
        // A grammar that ends: its last token completes it, nothing after is followed.
        let spec = ConstraintSpec::Lark("start: \"yes\" | \"no\"".into());
        let mut c = Constraint::new(&vocab, &spec).unwrap();
        let no = tok.encode("no", false).unwrap();
        let mut masks = Vec::new();
        let mut draft = no.clone();
        draft.push(letter);
        assert_eq!(c.masks_along(&draft, &mut masks).unwrap(), no.len());
        assert_eq!(masks, masks_followed(&vocab, &spec, &[], &no));
        assert_eq!(c.masks_along(&[], &mut masks).unwrap(), 0);
        assert_eq!(masks, c.mask().unwrap());
        // Taking back more than was accepted is an error that says so.
        let e = c.rollback(1).unwrap_err().to_string();
        assert!(e.contains("cannot take back 1 tokens of 0"), "{e}");
    }
}
