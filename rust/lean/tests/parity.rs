//! Token-exactness of the CPU backend against the HF transformers float32 reference on every
//! test model file and every fixture case (see parity_check.rs).
mod common;
mod parity_check;

use lean::{Engine, LeanError};

fn check_model(file: &str) {
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let mut engine = Engine::new(model, tokenizer, 1024).expect("engine");
    parity_check::check_engine(&mut engine, file, |_| true, None);
    parity_check::check_reuse(&mut engine, file, |_| true, None);
    // Speculation runs seven generations a case (half of this file's time in CI when every file
    // ran it). Its logic (guesses, rollback of refused rows, the sampled path) is the same for
    // every file, so CI checks it on one file per architecture family and skips the long
    // prompts (their repeats are prefills of 500-700 tokens); Gemma's sliding-window case stays
    // in. `LEAN_PARITY=full` runs it on every file and case.
    if full() {
        parity_check::check_speculative(&mut engine, file, |_| true, None);
    } else if SPECULATIVE_FILES.contains(&file) {
        parity_check::check_speculative(&mut engine, file, |name| !name.contains("long"), None);
    }
}

/// `LEAN_PARITY=full`: the speculative check on every file and case.
fn full() -> bool {
    std::env::var("LEAN_PARITY").is_ok_and(|v| v == "full")
}

/// The files whose speculative check runs by default: Llama (SmolLM2) and Gemma 3 (its sliding
/// window). Qwen2.5's K-quant file took 4.5 minutes of CI for the same logic; it and the rest
/// run with `LEAN_PARITY=full`.
const SPECULATIVE_FILES: [&str; 2] = [
    "smollm2-135m-instruct-q4_0.gguf",
    "gemma-3-270m-q4_k_m.gguf",
];

#[test]
fn smollm2_q4_1() {
    check_model("smollm2-135m-instruct-q4_1.gguf");
}

#[test]
fn smollm2_q4_0() {
    check_model("smollm2-135m-instruct-q4_0.gguf");
}

#[test]
fn smollm2_q8_0() {
    check_model("smollm2-135m-instruct-q8_0.gguf");
}

#[test]
fn qwen25_coder_q4_k_m() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
}

#[test]
fn qwen25_coder_q4_0() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_0.gguf");
}

#[test]
fn llama32_random_q4_0() {
    check_model("llama-3.2-1b-random-q4_0.gguf");
}

#[test]
fn llama32_random_q8_0() {
    check_model("llama-3.2-1b-random-q8_0.gguf");
}

#[test]
fn qwen3_random_q4_0() {
    check_model("qwen3-0.6b-random-q4_0.gguf");
}

#[test]
fn qwen3_random_q8_0() {
    check_model("qwen3-0.6b-random-q8_0.gguf");
}

#[test]
fn gemma3_270m_q4_k_m() {
    check_model("gemma-3-270m-q4_k_m.gguf");
}

/// Speculative decoding by a draft model: the target's greedy ids stay the reference's with a
/// sibling of another tensor type guessing (the same network, so most guesses are kept).
fn check_drafted(file: &str, draft_file: &str, max_greedy: Option<usize>) {
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let Some((draft, _)) = parity_check::load(draft_file) else {
        return;
    };
    let mut engine = Engine::new(model, tokenizer, 1024).expect("engine");
    engine
        .set_draft_model(draft, |model, ctx| {
            Ok(Box::new(lean::cpu::CpuSession::new(model, ctx)))
        })
        .expect("a sibling drafts");
    // The long prompts only with `LEAN_PARITY=full` (each is two prefills of 500-700 tokens
    // for the target and two for the draft).
    parity_check::check_draft_model(
        &mut engine,
        file,
        |name| full() || !name.contains("long"),
        max_greedy,
    );
}

#[test]
fn smollm2_q8_0_drafted_by_q4_0() {
    check_drafted(
        "smollm2-135m-instruct-q8_0.gguf",
        "smollm2-135m-instruct-q4_0.gguf",
        None,
    );
}

/// With `LEAN_PARITY=full` only (two minutes of CI; SmolLM2's drafted test runs the same code).
#[test]
fn qwen25_coder_q4_k_m_drafted_by_q4_0() {
    if !full() {
        return;
    }
    check_drafted(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
        Some(16),
    );
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let Some((model, tokenizer)) = parity_check::load("smollm2-135m-instruct-q4_0.gguf") else {
        return;
    };
    let Some((draft, _)) = parity_check::load("qwen2.5-coder-0.5b-instruct-q4_0.gguf") else {
        return;
    };
    let mut engine = Engine::new(model, tokenizer, 256).expect("engine");
    let err = engine
        .set_draft_model(draft, |model, ctx| {
            Ok(Box::new(lean::cpu::CpuSession::new(model, ctx)))
        })
        .unwrap_err();
    assert!(
        matches!(&err, LeanError::InvalidArgument(m) if m.contains("vocabulary has 151936 tokens, the model's 49152")),
        "{err}"
    );
    // Without a draft model, asking for one is a clear error too; the engine stays usable.
    let options = lean::GenerateOptions {
        max_tokens: 4,
        speculation: Some(lean::Speculation::draft_model(4).without_cost_check()),
        ..Default::default()
    };
    let prompt = lean::Prompt::Raw("Hello".into());
    let err = engine.generate(&prompt, &options, |_| true).unwrap_err();
    assert!(err.to_string().contains("needs one"), "{err}");
    let plain = lean::GenerateOptions {
        max_tokens: 4,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    };
    assert_eq!(
        engine
            .generate(&prompt, &plain, |_| true)
            .unwrap()
            .token_ids
            .len(),
        4
    );
}
