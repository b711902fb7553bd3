//! Token-exactness of the CPU backend against the HF transformers float32 reference on every
//! test model file and every fixture case (see parity_check.rs).
mod common;
mod parity_check;

use lean::Engine;

fn check_model(file: &str) {
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let mut engine = Engine::new(model, tokenizer, 1024).expect("engine");
    parity_check::check_engine(&mut engine, file, |_| true, None);
    parity_check::check_reuse(&mut engine, file, |_| true, None);
    parity_check::check_speculative(&mut engine, file, |_| true, None);
}

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
