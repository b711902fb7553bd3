//! Token-exactness of the GPU backend: the same fixture check as the CPU backend's
//! (lean/tests/parity_check) on every test model file, on whatever adapter wgpu finds (lavapipe
//! in CI). Lavapipe runs the kernels on the CPU and slowly, so the long-prompt case is left to
//! one model; every file and tensor type is still covered.
//!
//! Without an adapter the tests are skipped, or fail when env CI is set.
#[path = "../../lean/tests/common.rs"]
mod common;
#[path = "../../lean/tests/parity_check/mod.rs"]
mod parity_check;

use lean::{Engine, Session};
use lean_gpu::{GpuContext, GpuSession, Kernels};
use std::sync::{Arc, OnceLock};

fn gpu() -> Option<(Arc<GpuContext>, Arc<Kernels>)> {
    static GPU: OnceLock<Option<(Arc<GpuContext>, Arc<Kernels>)>> = OnceLock::new();
    GPU.get_or_init(|| match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => {
            eprintln!("adapter: {}", ctx.describe());
            let kernels = pollster::block_on(Kernels::new(&ctx)).expect("kernels compile");
            Some((Arc::new(ctx), Arc::new(kernels)))
        }
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a GPU adapter: {e}"
            );
            eprintln!("skipping GPU parity: {e}");
            None
        }
    })
    .clone()
}

/// Which fixture cases run, and how many greedy ids each checks. Lavapipe runs these kernels
/// at ~0.2 GB/s, so CI checks a prefill + 8 decoded tokens per model (teacher-forced logits at
/// every one of those positions) and one longer chat; `LEAN_GPU_PARITY=full` (a real GPU)
/// runs every case in full.
fn full() -> bool {
    std::env::var("LEAN_GPU_PARITY").is_ok_and(|v| v == "full")
}

/// The parity check on the GPU, weights split into parts of at most `max_part_bytes` if given.
fn check_model(file: &str, cases: &[&str], max_greedy: usize, max_part_bytes: Option<u64>) {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let mut engine = Engine::with_backend(model, tokenizer, 1024, |model, context| {
        let session = GpuSession::with_binding_limit(ctx, kernels, model, context, max_part_bytes)
            .map_err(|e| lean::LeanError::Backend(e.to_string()))?;
        Ok(Box::new(session) as Box<dyn Session>)
    })
    .expect("engine");
    if full() {
        parity_check::check_engine(&mut engine, file, |_| true, None);
    } else {
        parity_check::check_engine(
            &mut engine,
            file,
            |name| cases.contains(&name),
            Some(max_greedy),
        );
    }
}

#[test]
fn smollm2_q4_1() {
    check_model(
        "smollm2-135m-instruct-q4_1.gguf",
        &["raw_code", "chat_short"],
        8,
        None,
    );
}

#[test]
fn smollm2_q4_0() {
    check_model("smollm2-135m-instruct-q4_0.gguf", &["raw_code"], 8, None);
}

#[test]
fn smollm2_q8_0_split_bindings() {
    // 8 MiB parts: the 47 MB Q8_0 embedding/head and every matrix over 8 MiB run split.
    check_model(
        "smollm2-135m-instruct-q8_0.gguf",
        &["raw_code"],
        8,
        Some(8 << 20),
    );
}

#[test]
fn qwen25_coder_q4_k_m() {
    check_model(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        &["raw_code"],
        8,
        None,
    );
}

#[test]
fn qwen25_coder_q4_0() {
    check_model(
        "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
        &["raw_code"],
        8,
        None,
    );
}
