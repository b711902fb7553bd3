//! A generation whose GPU device is lost continues on the CPU with the same tokens: the engine
//! makes a CPU session, prefills the ids the lost session held and runs the failed pass again
//! (`Engine::set_device_loss_fallback`). The loss is real: the test hook destroys the wgpu
//! device (`GpuContext::lose_device_after`) before a given pass, and the device's lost callback
//! reports it. On lavapipe in CI; without an adapter the tests are skipped (fail when CI is set).
#[path = "../../lean/tests/common.rs"]
mod common;
#[path = "../../lean/tests/parity_check/mod.rs"]
mod parity_check;

use lean::{Engine, GenerateOptions, LeanError, Prompt, Session};
use lean_gpu::{GpuContext, GpuSession, Kernels};
use std::sync::{Arc, Mutex};

const FILE: &str = "smollm2-135m-instruct-q4_0.gguf";
const MAX_TOKENS: usize = 16;

/// A fresh device (each test loses its own) and its kernels.
fn gpu() -> Option<(Arc<GpuContext>, Arc<Kernels>)> {
    match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => {
            let kernels = pollster::block_on(Kernels::new(&ctx)).expect("kernels compile");
            Some((Arc::new(ctx), Arc::new(kernels)))
        }
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a GPU adapter: {e}"
            );
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// The raw_code case's prompt ids and its first MAX_TOKENS greedy ids (the HF reference).
fn reference() -> (Vec<u32>, Vec<u32>) {
    let fixture = parity_check::fixture_for(FILE);
    let (prompt, greedy) = fixture.ids("raw_code");
    (prompt.to_vec(), greedy[..MAX_TOKENS].to_vec())
}

fn gpu_engine(ctx: &Arc<GpuContext>, kernels: &Arc<Kernels>) -> Option<Engine> {
    let (model, tokenizer) = parity_check::load(FILE)?;
    let engine = Engine::with_backend(model, tokenizer, 256, |model, context| {
        let session = GpuSession::new(ctx.clone(), kernels.clone(), model, context)
            .map_err(lean_gpu::session_error)?;
        Ok(Box::new(session) as Box<dyn Session>)
    })
    .expect("engine");
    Some(engine)
}

fn options() -> GenerateOptions {
    GenerateOptions {
        max_tokens: MAX_TOKENS,
        stop_token_ids: Some(vec![]),
        ..GenerateOptions::default()
    }
}

/// Loses the device before pass `passes` (0: the prefill) and checks the ids, the text and the
/// report of the switch. Returns the generation's BackendChange.
fn generate_losing_the_device_after(passes: usize) -> Option<lean::BackendChange> {
    let (ctx, kernels) = gpu()?;
    let mut engine = gpu_engine(&ctx, &kernels)?;
    assert!(engine.backend().starts_with("gpu"), "{}", engine.backend());
    let (prompt, want) = reference();
    let reported = Arc::new(Mutex::new(Vec::new()));
    let hook = reported.clone();
    engine.on_backend_change(Box::new(move |change| {
        hook.lock().unwrap().push(change.clone())
    }));

    // The text an uninterrupted run streams, on the CPU (the same ids as the GPU's, the HF
    // reference's): the streamed pieces must add up to it too.
    let (model, tokenizer) = parity_check::load(FILE)?;
    let mut cpu = Engine::new(model, tokenizer, 256).expect("cpu engine");
    let uninterrupted = cpu
        .generate(&Prompt::Ids(prompt.clone()), &options(), |_| true)
        .expect("cpu generation");
    assert_eq!(
        uninterrupted.token_ids, want,
        "the CPU gives the reference ids"
    );

    ctx.lose_device_after(passes);
    let mut streamed = String::new();
    let mut streamed_ids = Vec::new();
    let generation = engine
        .generate(&Prompt::Ids(prompt.clone()), &options(), |t| {
            streamed.push_str(&t.text);
            streamed_ids.push(t.id);
            true
        })
        .expect("the generation survives the device's loss");
    assert_eq!(generation.token_ids, want, "ids after losing the device");
    assert_eq!(streamed_ids, want, "streamed ids: none repeated or dropped");
    assert_eq!(generation.text, uninterrupted.text);
    assert_eq!(streamed, uninterrupted.text);
    assert!(ctx.lost_reason().is_some(), "the device is lost");
    let change = generation
        .backend_change
        .clone()
        .expect("the generation says the backend changed");
    assert!(change.from.starts_with("gpu"), "{change:?}");
    assert!(change.to.starts_with("cpu"), "{change:?}");
    assert!(engine.backend().starts_with("cpu"), "{}", engine.backend());
    assert_eq!(
        *reported.lock().unwrap(),
        vec![change.clone()],
        "the hook ran once"
    );
    eprintln!("{change:?}");

    // The engine goes on, on the CPU: the next turn reuses the cache the fallback filled.
    let mut next = prompt.clone();
    next.extend_from_slice(&generation.token_ids);
    let again = engine
        .generate(&Prompt::Ids(next), &options(), |_| true)
        .expect("a later generation runs on the CPU");
    assert!(again.timings.cached_tokens > 0);
    assert!(again.backend_change.is_none());
    Some(change)
}

#[test]
fn a_device_lost_during_the_prefill_continues_on_the_cpu_with_the_same_ids() {
    let Some(change) = generate_losing_the_device_after(0) else {
        return;
    };
    assert_eq!(change.generated_tokens, 0);
    assert_eq!(change.replayed_tokens, 0);
}

#[test]
fn a_device_lost_mid_generation_continues_on_the_cpu_with_the_same_ids() {
    // The prefill is one pass, then greedy decode passes (queued ahead up to DECODE_AHEAD).
    let Some(change) = generate_losing_the_device_after(8) else {
        return;
    };
    assert!(
        change.generated_tokens > 0 && change.generated_tokens < MAX_TOKENS,
        "{change:?}"
    );
    // The CPU session was filled with the prompt and the tokens that ran before the loss.
    assert_eq!(
        change.replayed_tokens,
        reference().0.len() + change.generated_tokens - 1
    );
}

#[test]
fn without_the_fallback_a_lost_device_is_a_device_lost_error() {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some(mut engine) = gpu_engine(&ctx, &kernels) else {
        return;
    };
    engine.set_device_loss_fallback(false);
    ctx.lose_device_after(1);
    let (prompt, _) = reference();
    let err = engine
        .generate(&Prompt::Ids(prompt), &options(), |_| true)
        .expect_err("no fallback");
    assert!(matches!(err, LeanError::DeviceLost(_)), "{err}");
    assert!(engine.backend().starts_with("gpu"));
}
