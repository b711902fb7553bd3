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

use lean::{Engine, GenerateOptions, Prompt, SamplingParams, Session, Tokenizer};
use lean_gpu::{GpuContext, GpuSession, Kernels, StreamedModel};
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
/// With `chunk`, prompts prefill (and teacher-forced logits come back) `chunk` tokens a submit.
fn check_model(
    file: &str,
    cases: &[&str],
    max_greedy: usize,
    max_part_bytes: Option<u64>,
    chunk: Option<usize>,
) {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let mut engine = Engine::with_backend(model, tokenizer, 1024, |model, context| {
        let mut session =
            GpuSession::with_binding_limit(ctx, kernels, model, context, max_part_bytes)
                .map_err(|e| lean::LeanError::Backend(e.to_string()))?;
        if let Some(tokens) = chunk {
            session.limit_prefill_chunk(tokens);
        }
        Ok(Box::new(session) as Box<dyn Session>)
    })
    .expect("engine");
    if full() {
        parity_check::check_engine(&mut engine, file, |_| true, None);
        parity_check::check_reuse(&mut engine, file, |_| true, None);
        parity_check::check_speculative(&mut engine, file, |_| true, None);
    } else {
        // Teacher-forced logits on every case but a long one's: 785 positions of Gemma 3's
        // 262k-row head were 4 of lavapipe's minutes. Its greedy ids still need the sliding
        // window right (turning it off changes logits by up to 41), and a real GPU runs all.
        parity_check::check_engine_with(
            &mut engine,
            file,
            |name| cases.contains(&name),
            Some(max_greedy),
            |name| !name.contains("sliding_window"),
        );
        // The cache carried across turns: one short case (lavapipe is slow).
        parity_check::check_reuse(&mut engine, file, |name| name == "raw_code", Some(8));
        // Speculative decoding's verification passes: the same short case on one file. What is
        // the GPU's own there (its every-row-logits pass and the plans it keeps) does not depend
        // on the file; lavapipe's minutes go to the plain checks above.
        if SPECULATIVE_FILES.contains(&file) {
            parity_check::check_speculative(&mut engine, file, |name| name == "raw_code", Some(8));
        }
    }
}

/// Speculative decoding by a draft model with both on the GPU: SmolLM2's Q4_0 file guessing
/// for its Q8_0 file keeps the reference's greedy ids (all cases on a real GPU, one short case
/// on lavapipe).
#[test]
fn smollm2_q8_0_drafted_by_q4_0() {
    let Some((ctx, kernels)) = gpu() else { return };
    let file = "smollm2-135m-instruct-q8_0.gguf";
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let Some((draft, _)) = parity_check::load("smollm2-135m-instruct-q4_0.gguf") else {
        return;
    };
    let session = |model: &lean::Model, context: usize| {
        let session = GpuSession::new(ctx.clone(), kernels.clone(), model, context)
            .map_err(|e| lean::LeanError::Backend(e.to_string()))?;
        Ok(Box::new(session) as Box<dyn Session>)
    };
    let mut engine = Engine::with_backend(model, tokenizer, 1024, session).expect("engine");
    engine
        .set_draft_model(draft, session)
        .expect("a sibling drafts");
    if full() {
        parity_check::check_draft_model(&mut engine, file, |_| true, None);
    } else {
        parity_check::check_draft_model(&mut engine, file, |name| name == "raw_code", Some(8));
    }
}

/// The files whose speculative check runs on lavapipe (all of them with `full`).
const SPECULATIVE_FILES: [&str; 1] = ["smollm2-135m-instruct-q4_0.gguf"];

#[test]
fn smollm2_q4_1() {
    check_model(
        "smollm2-135m-instruct-q4_1.gguf",
        &["raw_code", "chat_short"],
        8,
        None,
        None,
    );
}

#[test]
fn smollm2_q4_0() {
    check_model(
        "smollm2-135m-instruct-q4_0.gguf",
        &["raw_code"],
        8,
        None,
        None,
    );
}

#[test]
fn smollm2_q8_0_split_bindings() {
    // 8 MiB parts: the 47 MB Q8_0 embedding/head and every matrix over 8 MiB run split; and
    // the 18-token prompt prefills in chunks of 8 (8 + 8 + 2).
    check_model(
        "smollm2-135m-instruct-q8_0.gguf",
        &["raw_code"],
        8,
        Some(8 << 20),
        Some(8),
    );
}

#[test]
fn qwen25_coder_q4_k_m() {
    check_model(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        &["raw_code"],
        8,
        None,
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
        None,
    );
}

// Llama 3.x: rope_freqs factors, a 128k vocabulary, the tied head. Its 262M-weight head makes
// every teacher-forced position the slowest of any file on lavapipe (the two files took 6 of
// CI's minutes), so CI runs one case of one file; the Q8_0 file's kernels are SmolLM2's and
// Qwen3's, its graph the Q4_0 file's. Both files, and every case, with `LEAN_GPU_PARITY=full`.
#[test]
fn llama32_random_q4_0() {
    check_model(
        "llama-3.2-1b-random-q4_0.gguf",
        &["raw_code"],
        8,
        None,
        None,
    );
}

#[test]
fn llama32_random_q8_0() {
    if !full() {
        return;
    }
    check_model(
        "llama-3.2-1b-random-q8_0.gguf",
        &["raw_code"],
        8,
        None,
        None,
    );
}

// Qwen3: per-head q/k norms, an explicit head size (q is wider than the residual stream).
#[test]
fn qwen3_random_q4_0() {
    check_model(
        "qwen3-0.6b-random-q4_0.gguf",
        &["raw_code", "chat_short"],
        8,
        None,
        None,
    );
}

#[test]
fn qwen3_random_q8_0_chunked() {
    // The 13-token prompt prefills 5 + 5 + 3: the q/k norms of prefill chunks.
    check_model(
        "qwen3-0.6b-random-q8_0.gguf",
        &["raw_code"],
        8,
        None,
        Some(5),
    );
}

// Gemma 3: the scaled embedding, q/k norms, post-norms, GELU-tanh, two rotary tables, sliding
// windows (the 777-token prompt reaches past the 512-position window of five layers in six).
#[test]
fn gemma3_270m_q4_k_m() {
    check_model(
        "gemma-3-270m-q4_k_m.gguf",
        &["raw_code", "raw_sliding_window"],
        8,
        None,
        None,
    );
}

/// The browser's path: `begin_async` / `step_async`, whose readbacks are awaited instead of
/// blocked on, give the fixture's ids, reading back only the argmax (greedy) and the whole
/// logits row (top-k 1 sampling: the same tokens through the sampler).
#[test]
fn async_steps_equal_the_fixture() {
    let file = "smollm2-135m-instruct-q4_0.gguf";
    let Some((ctx, kernels)) = gpu() else { return };
    let Some((model, tokenizer)) = parity_check::load(file) else {
        return;
    };
    let mut engine = Engine::with_backend(model, tokenizer, 256, |model, context| {
        let session = GpuSession::new(ctx, kernels, model, context)
            .map_err(|e| lean::LeanError::Backend(e.to_string()))?;
        Ok(Box::new(session) as Box<dyn Session>)
    })
    .expect("engine");
    let fixture = parity_check::fixture_for(file);
    let (prompt, greedy) = fixture.ids("raw_code");
    let top_1 = SamplingParams {
        temperature: 1.0,
        top_k: 1,
        ..SamplingParams::default()
    };
    for (readback, sampling) in [("argmax", SamplingParams::default()), ("logits", top_1)] {
        let ids = generate_async(&mut engine, prompt, 6, sampling);
        assert_eq!(ids, greedy[..6], "{readback} readback");
    }
}

/// `max_tokens` ids generated from `prompt` through `begin_async` / `step_async`.
fn generate_async(
    engine: &mut Engine,
    prompt: &[u32],
    max_tokens: usize,
    sampling: SamplingParams,
) -> Vec<u32> {
    let options = GenerateOptions {
        max_tokens,
        sampling,
        stop_token_ids: Some(Vec::new()),
        ..Default::default()
    };
    pollster::block_on(async {
        let prompt = Prompt::Ids(prompt.to_vec());
        let mut active = engine.begin_async(&prompt, &options).await.expect("begin");
        while engine
            .step_async(&mut active)
            .await
            .expect("step")
            .finished
            .is_none()
        {}
        engine.finish(active).expect("finish").generation.token_ids
    })
}

/// A model streamed into the GPU in chunks of any size (a browser's download: the host never
/// holds the file, each matrix goes to the device once complete) is token-exact; the CPU
/// backend refuses such a model with an error instead of reading weights that are not there.
#[test]
fn streamed_model_equals_the_fixture() {
    check_streamed("smollm2-135m-instruct-q4_0.gguf", 8 << 20, 6);
}

/// The same for a Q4_K_M file, whose layers stack q|k|v, or q|k with v alone (attn_v of
/// another type), and gate|up, from tensors that arrive in another order (attn_k first). 4 MiB
/// parts split the 6 MB gate|up matrices inside gate.
#[test]
fn streamed_q4_k_m_model_equals_the_fixture() {
    check_streamed("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 4 << 20, 3);
}

/// Streams `file` (matrices split into parts of at most `max_part_bytes`) and checks `tokens`
/// greedy ids of the fixture's raw_code case.
fn check_streamed(file: &str, max_part_bytes: u64, tokens: usize) {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some(models) = common::models_dir() else {
        return;
    };
    let bytes = std::fs::read(models.join(file)).expect("model file");
    // Chunks of 65537 bytes split the header, the padding and the tensors at odd places.
    let mut stream = StreamedModel::new(ctx, bytes.len(), Some(max_part_bytes));
    for chunk in bytes.chunks(65_537) {
        stream.push(chunk).expect("push");
    }
    drop(bytes);
    let (model, session) =
        pollster::block_on(stream.into_session(kernels, 256)).expect("streamed session");
    assert!(!model.has_weight_data());
    // The header streamed first is all a lone GGUF needs for its tokenizer.
    let tokenizer = Tokenizer::from_gguf(&model.gguf, None, None).unwrap();
    let mut cpu = lean::cpu::CpuSession::new(&model, 16);
    let refused = Session::forward_argmax(&mut cpu, &model, &[1]).unwrap_err();
    assert!(
        refused.to_string().contains("streamed to a GPU"),
        "{refused}"
    );
    let mut engine = Engine::with_backend(model, tokenizer, 256, move |_, _| {
        Ok(Box::new(session) as Box<dyn Session>)
    })
    .expect("engine");
    let fixture = parity_check::fixture_for(file);
    let (prompt, greedy) = fixture.ids("raw_code");
    let ids = generate_async(&mut engine, prompt, tokens, SamplingParams::default());
    assert_eq!(ids, greedy[..tokens]);
}

/// Streaming errors name the problem: too many bytes, a truncated file, a corrupt header.
#[test]
fn streamed_model_errors() {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some(models) = common::models_dir() else {
        return;
    };
    let bytes = std::fs::read(models.join("smollm2-135m-instruct-q4_0.gguf")).expect("model");
    let mut long = StreamedModel::new(ctx.clone(), 1000, None);
    let err = long.push(&bytes[..1001]).unwrap_err().to_string();
    assert!(
        err.contains("longer than the announced 1000 bytes"),
        "{err}"
    );

    let mut short = StreamedModel::new(ctx.clone(), bytes.len(), None);
    short.push(&bytes[..bytes.len() / 2]).expect("first half");
    let err = pollster::block_on(short.into_session(kernels.clone(), 64))
        .err()
        .expect("an interrupted download fails")
        .to_string();
    assert!(err.contains("ended after"), "{err}");

    let mut corrupt = bytes[..4096].to_vec();
    corrupt[..4].copy_from_slice(b"GGUX");
    let mut bad = StreamedModel::new(ctx, bytes.len(), None);
    let err = bad.push(&corrupt).unwrap_err().to_string();
    assert!(err.contains("invalid GGUF file"), "{err}");
}

/// Greedy decoding queues each next pass before reading the id (`decode_argmax`): a stop token,
/// `max_tokens` or a full context then leaves a pass queued for nothing. The next generation,
/// blocking or async, must still be exact, and the context must end where the CPU's does.
#[test]
fn decoding_ahead_survives_stops_limits_and_restarts() {
    let file = "smollm2-135m-instruct-q4_0.gguf";
    let Some((ctx, kernels)) = gpu() else { return };
    let fixture = parity_check::fixture_for(file);
    let (prompt, greedy) = fixture.ids("raw_code");
    let engine_with_context = |context: usize| {
        let (model, tokenizer) = parity_check::load(file)?;
        let (ctx, kernels) = (ctx.clone(), kernels.clone());
        let engine = Engine::with_backend(model, tokenizer, context, |model, context| {
            let session = GpuSession::new(ctx, kernels, model, context)
                .map_err(|e| lean::LeanError::Backend(e.to_string()))?;
            Ok(Box::new(session) as Box<dyn Session>)
        });
        Some(engine.expect("engine"))
    };
    let Some(mut engine) = engine_with_context(256) else {
        return;
    };
    let generate = |engine: &mut Engine, max_tokens: usize, stop: Vec<u32>| {
        let options = GenerateOptions {
            max_tokens,
            stop_token_ids: Some(stop),
            ..GenerateOptions::default()
        };
        engine
            .generate(&Prompt::Ids(prompt.to_vec()), &options, |_| true)
            .expect("generate")
    };
    assert_eq!(generate(&mut engine, 5, Vec::new()).token_ids, greedy[..5]);
    let stop = greedy[2];
    let stop_at = greedy.iter().position(|&id| id == stop).unwrap();
    let stopped = generate(&mut engine, 6, vec![stop]);
    assert_eq!(stopped.token_ids, greedy[..=stop_at]);
    assert_eq!(stopped.finish_reason, lean::FinishReason::Stop);
    assert_eq!(
        generate_async(&mut engine, prompt, 4, SamplingParams::default()),
        greedy[..4]
    );

    // Room for the prompt and 3 more positions: the 4th token ends it, as on the CPU.
    let Some(mut small) = engine_with_context(prompt.len() + 3) else {
        return;
    };
    let full = generate(&mut small, 10, Vec::new());
    assert_eq!(full.finish_reason, lean::FinishReason::ContextFull);
    assert_eq!(full.token_ids, greedy[..4]);
}
