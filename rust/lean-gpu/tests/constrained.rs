//! Constrained decoding on the GPU: greedy generation under a JSON schema picks each token with
//! the masked argmax on the device (the mask uploaded, 4 bytes read back per token) and gives
//! exactly the CPU's tokens, through the blocking and the awaiting loops alike.
//!
//! Without an adapter the tests are skipped, or fail when env CI is set.
#[path = "../../lean/tests/common.rs"]
mod common;

use lean::{ChatMessage, Engine, GenerateOptions, Generation, Model, Prompt, Session, Tokenizer};
use lean_constraint::ConstraintSpec;
use lean_gpu::{GpuContext, GpuSession, Kernels};
use std::sync::Arc;

const FILE: &str = "smollm2-135m-instruct-q4_0.gguf";

fn load() -> Option<(Model, Tokenizer)> {
    let models = common::models_dir()?;
    let model = Model::load_file(&models.join(FILE)).expect("model loads");
    let tokenizer =
        Tokenizer::from_path(&common::tokenizer_dir_for(&models, FILE)).expect("tokenizer");
    Some((model, tokenizer))
}

fn gpu() -> Option<(Arc<GpuContext>, Arc<Kernels>)> {
    match pollster::block_on(GpuContext::new()) {
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
            eprintln!("skipping constrained GPU decoding: {e}");
            None
        }
    }
}

/// A schema of the corpus (rust/lean-constraint/tests/schemas): its prompt and its options.
fn person(max_tokens: usize) -> (Prompt, GenerateOptions) {
    let dir = common::repo_root().join("rust/lean-constraint/tests/schemas");
    let case: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("person.json")).unwrap()).unwrap();
    let prompt = Prompt::Chat(vec![ChatMessage::new(
        "user",
        case["prompt"].as_str().unwrap(),
    )]);
    let options = GenerateOptions {
        max_tokens,
        constraint: Some(ConstraintSpec::JsonSchema(case["schema"].clone())),
        ..Default::default()
    };
    (prompt, options)
}

/// The test model on the GPU, and its vocabulary size.
fn gpu_engine(ctx: &Arc<GpuContext>, kernels: &Arc<Kernels>) -> (Engine, usize) {
    let (model, tokenizer) = load().unwrap();
    let vocab = model.config.vocab_size;
    let engine = Engine::with_backend(model, tokenizer, 512, |model, context| {
        let session = GpuSession::new(ctx.clone(), kernels.clone(), model, context)
            .map_err(|e| lean::LeanError::Backend(e.to_string()))?;
        Ok(Box::new(session) as Box<dyn Session>)
    })
    .unwrap();
    (engine, vocab)
}

/// `generate` through `begin_async` / `step_async` / `finish` (the browser's loop).
fn generate_async(engine: &mut Engine, prompt: &Prompt, options: &GenerateOptions) -> Generation {
    pollster::block_on(async {
        let mut active = engine.begin_async(prompt, options).await.unwrap();
        loop {
            let step = engine.step_async(&mut active).await.unwrap();
            if step.finished.is_some() {
                break;
            }
        }
        engine.finish(active).unwrap().generation
    })
}

#[test]
fn json_schema_greedy_equals_the_cpu_reading_back_only_ids() {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some((model, tokenizer)) = load() else {
        return;
    };
    let (prompt, options) = person(10);
    let mut cpu = Engine::new(model, tokenizer, 512).unwrap();
    let want = cpu.generate(&prompt, &options, |_| true).unwrap();
    eprintln!("CPU: {:?} ({:?})", want.text, want.finish_reason);
    assert!(want.token_ids.len() >= 8 && want.text.starts_with('{'));

    let (mut engine, vocab) = gpu_engine(&ctx, &kernels);
    assert_eq!(engine.bytes_read(), 0);
    let got = engine.generate(&prompt, &options, |_| true).unwrap();
    assert_eq!(got.token_ids, want.token_ids, "GPU: {:?}", got.text);
    // One pass per token (the prefill gives the first), each reading back its id alone.
    let per_pass = engine.bytes_read() as f64 / got.token_ids.len() as f64;
    assert_eq!(
        engine.bytes_read(),
        4 * got.token_ids.len() as u64,
        "{per_pass} bytes a token (the logits are {} bytes)",
        4 * vocab
    );

    // The awaiting loop (WebGPU's) takes the same path; from a fresh cache.
    engine.reset_cache();
    let before = engine.bytes_read();
    let again = generate_async(&mut engine, &prompt, &options);
    assert_eq!(again.token_ids, want.token_ids);
    assert_eq!(
        engine.bytes_read() - before,
        4 * want.token_ids.len() as u64
    );

    // The next turn reuses the cache up to the reply, free and constrained: the pass queued
    // behind the last masked argmax (fed an id nobody kept) must not count as cached, nor
    // leave its position behind.
    let Prompt::Chat(mut messages) = prompt.clone() else {
        unreachable!()
    };
    messages.push(ChatMessage::new("assistant", want.text.as_str()));
    messages.push(ChatMessage::new("user", "Now give another person."));
    let next = Prompt::Chat(messages);
    let free = GenerateOptions {
        max_tokens: 6,
        ..Default::default()
    };
    for options in [&free, &options] {
        cpu.generate(&prompt, &person(10).1, |_| true).unwrap();
        let want = cpu.generate(&next, options, |_| true).unwrap();
        engine.generate(&prompt, &person(10).1, |_| true).unwrap();
        let got = engine.generate(&next, options, |_| true).unwrap();
        assert!(got.timings.cached_tokens > 0, "the cache was reused");
        assert_eq!(got.timings.cached_tokens, want.timings.cached_tokens);
        assert_eq!(got.token_ids, want.token_ids, "GPU: {:?}", got.text);
    }
}

/// Speculative decoding under the schema: each verification pass is decode-shaped and each
/// row's masked argmax is taken on the device under the constraint's mask for it (only ids come
/// back), so the tokens are the CPU's plain constrained ones, through both loops, with guesses
/// kept (a prediction of the reply itself) and cut (one that leaves the schema halfway).
#[test]
fn speculating_under_a_schema_gives_the_cpu_tokens() {
    let Some((ctx, kernels)) = gpu() else { return };
    let Some((model, tokenizer)) = load() else {
        return;
    };
    let (prompt, options) = person(24);
    let mut cpu = Engine::new(model, tokenizer, 512).unwrap();
    let want = cpu.generate(&prompt, &options, |_| true).unwrap();
    let (mut engine, vocab) = gpu_engine(&ctx, &kernels);
    let text = &want.text;
    let broken = format!("{}x}}]] nonsense", &text[..text.len() / 2]);
    for prediction in [text.as_str(), broken.as_str()] {
        let ids = engine.tokenizer.encode(prediction, false).unwrap();
        let speculation = lean::Speculation::lookup(4)
            .without_cost_check()
            .with_prediction(ids);
        let options = GenerateOptions {
            speculation: Some(speculation),
            ..options.clone()
        };
        engine.reset_cache();
        let before = engine.bytes_read();
        let got = engine.generate(&prompt, &options, |_| true).unwrap();
        assert_eq!(got.token_ids, want.token_ids, "GPU: {:?}", got.text);
        let stats = got.timings.speculation;
        assert!(stats.accepted > 0, "{prediction}: {stats:?}");
        // Each pass's masked argmaxes are taken on the device: ids come back, never a row of
        // logits.
        let read = engine.bytes_read() - before;
        assert!(read < 4 * vocab as u64, "{read} bytes read back");
        engine.reset_cache();
        let again = generate_async(&mut engine, &prompt, &options);
        assert_eq!(
            again.token_ids, want.token_ids,
            "GPU, awaited: {:?}",
            again.text
        );
    }
}
