//! The resumable generation API (`Engine::begin` / `step` / `finish`): the same tokens, text,
//! events and finish reasons as `Engine::generate`, and clear errors when it is misused.
mod common;

use lean::engine::{ActiveGeneration, Ended, Step};
use lean::{
    Engine, FinishReason, GenerateOptions, LeanError, Model, Prompt, SamplingParams, Tokenizer,
};

const MODEL: &str = "smollm2-135m-instruct-q4_0.gguf";

fn engine(context_length: usize) -> Option<Engine> {
    let models = common::models_dir()?;
    let model = Model::load_file(&models.join(MODEL)).unwrap();
    let tokenizer = Tokenizer::from_path(&common::tokenizer_dir_for(&models, MODEL)).unwrap();
    Some(Engine::new(model, tokenizer, context_length).unwrap())
}

/// One fixture case of the HF reference: the prompt and its greedy continuation.
struct Reference {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

fn reference(case: &str) -> Reference {
    let path = common::repo_root().join("fixtures/hf/smollm2-135m-instruct-q4_0.json");
    let fixture: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let case = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == case)
        .unwrap();
    let ids = |key: &str| serde_json::from_value(case[key].clone()).unwrap();
    Reference {
        prompt_ids: ids("prompt_ids"),
        greedy_ids: ids("greedy_ids"),
    }
}

/// Everything a caller sees of a generation: its token events (id, text) and the result.
struct Run {
    events: Vec<(u32, String)>,
    /// `Step::finished` of every step.
    finished: Vec<Option<FinishReason>>,
    generation: lean::Generation,
}

fn generate(engine: &mut Engine, prompt: &Prompt, options: &GenerateOptions) -> Run {
    let mut events = Vec::new();
    let generation = engine
        .generate(prompt, options, |t| {
            events.push((t.id, t.text.clone()));
            true
        })
        .unwrap();
    Run {
        events,
        finished: Vec::new(),
        generation,
    }
}

/// `begin`, then `step` until a step reports the end (at most `max_steps`: then cancelled),
/// then `finish`.
fn step_through(
    engine: &mut Engine,
    prompt: &Prompt,
    options: &GenerateOptions,
    max_steps: usize,
) -> Run {
    let mut active = engine.begin(prompt, options).unwrap();
    let mut events = Vec::new();
    let mut finished = Vec::new();
    for _ in 0..max_steps {
        let Step {
            token,
            finished: end,
        } = engine.step(&mut active).unwrap();
        events.extend(token.map(|t| (t.id, t.text)));
        finished.push(end);
        if end.is_some() {
            break;
        }
    }
    let Ended {
        held_back,
        generation,
    } = engine.finish(active).unwrap();
    events.extend(held_back.map(|t| (t.id, t.text)));
    Run {
        events,
        finished,
        generation,
    }
}

fn assert_same(stepped: &Run, generated: &Run) {
    let (s, g) = (&stepped.generation, &generated.generation);
    assert_eq!(s.prompt_ids, g.prompt_ids);
    assert_eq!(s.token_ids, g.token_ids);
    assert_eq!(s.text, g.text);
    assert_eq!(s.finish_reason, g.finish_reason);
    assert_eq!(stepped.events, generated.events);
    assert_eq!(s.timings.prompt_tokens, g.timings.prompt_tokens);
    assert_eq!(s.timings.generated_tokens, g.token_ids.len());
}

fn streamed_text(run: &Run) -> String {
    run.events.iter().map(|(_, text)| text.as_str()).collect()
}

fn no_stop_ids(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    }
}

#[test]
fn greedy_steps_give_the_reference_tokens_and_stop_at_eos() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let reference = reference("raw_short");
    let prompt = Prompt::Raw("The quick brown fox".into());
    let options = GenerateOptions {
        max_tokens: 60,
        ..Default::default()
    };
    let stepped = step_through(&mut engine, &prompt, &options, usize::MAX);
    let eos = engine.tokenizer.eos_token_ids();
    let stop_at = reference
        .greedy_ids
        .iter()
        .position(|id| eos.contains(id))
        .expect("the reference generates an eos id");
    let g = &stepped.generation;
    assert_eq!(g.prompt_ids, reference.prompt_ids);
    assert_eq!(g.token_ids, reference.greedy_ids[..=stop_at]);
    assert_eq!(g.finish_reason, FinishReason::Stop);
    // One step per token; the stop id's step streams nothing and reports the end.
    assert_eq!(stepped.finished.len(), stop_at + 1);
    assert!(stepped.finished[..stop_at].iter().all(Option::is_none));
    assert_eq!(stepped.finished[stop_at], Some(FinishReason::Stop));
    let streamed_ids: Vec<u32> = stepped.events.iter().map(|e| e.0).collect();
    assert_eq!(streamed_ids, reference.greedy_ids[..stop_at]);
    assert_eq!(streamed_text(&stepped), g.text);
    assert_eq!(
        g.text,
        engine
            .tokenizer
            .decode(&g.token_ids[..stop_at], true)
            .unwrap()
    );
    assert_same(&stepped, &generate(&mut engine, &prompt, &options));
}

#[test]
fn sampled_steps_equal_generate() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let reference = reference("chat_short");
    let prompt = Prompt::Ids(reference.prompt_ids);
    // The logits path: a repetition penalty needs the full logits even when greedy.
    for sampling in [
        SamplingParams {
            repetition_penalty: 1.3,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            repetition_penalty: 1.1,
            seed: 7,
            ..Default::default()
        },
    ] {
        let options = GenerateOptions {
            sampling,
            ..no_stop_ids(20)
        };
        let stepped = step_through(&mut engine, &prompt, &options, usize::MAX);
        let generated = generate(&mut engine, &prompt, &options);
        assert_same(&stepped, &generated);
        assert_eq!(stepped.generation.token_ids.len(), 20);
    }
    // The seed decides: another seed gives other tokens (so the comparison above is not vacuous).
    let reseeded = |seed| GenerateOptions {
        sampling: SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        },
        ..no_stop_ids(20)
    };
    let a = step_through(&mut engine, &prompt, &reseeded(1), usize::MAX);
    let b = step_through(&mut engine, &prompt, &reseeded(2), usize::MAX);
    assert_ne!(a.generation.token_ids, b.generation.token_ids);
}

#[test]
fn max_tokens_ends_with_the_last_token() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let reference = reference("chat_short");
    let prompt = Prompt::Ids(reference.prompt_ids);
    let stepped = step_through(&mut engine, &prompt, &no_stop_ids(5), usize::MAX);
    assert_eq!(stepped.generation.token_ids, reference.greedy_ids[..5]);
    assert_eq!(stepped.generation.finish_reason, FinishReason::Length);
    // The fifth step brings both the fifth token and the end.
    assert_eq!(
        stepped.finished,
        [None, None, None, None, Some(FinishReason::Length)]
    );
    assert_eq!(stepped.events.len(), 5);
    assert_same(&stepped, &generate(&mut engine, &prompt, &no_stop_ids(5)));

    // max_tokens 0: the first step ends the generation without a token.
    let mut active = engine.begin(&prompt, &no_stop_ids(0)).unwrap();
    let step = engine.step(&mut active).unwrap();
    assert!(step.token.is_none());
    assert_eq!(step.finished, Some(FinishReason::Length));
    let ended = engine.finish(active).unwrap();
    assert!(ended.generation.token_ids.is_empty());
    assert_eq!(ended.generation.finish_reason, FinishReason::Length);
}

#[test]
fn a_full_context_ends_with_the_last_token_that_fits() {
    let Some(mut engine) = engine(24) else {
        return;
    };
    let prompt = Prompt::Raw("The quick brown fox".into());
    let stepped = step_through(&mut engine, &prompt, &no_stop_ids(1000), usize::MAX);
    let g = &stepped.generation;
    assert_eq!(g.finish_reason, FinishReason::ContextFull);
    // Every position of the cache is used; the last token is generated but never run.
    assert_eq!(g.prompt_ids.len() + g.token_ids.len(), 24 + 1);
    assert_eq!(
        stepped.finished.last(),
        Some(&Some(FinishReason::ContextFull))
    );
    assert_eq!(
        stepped.events.last().unwrap().0,
        *g.token_ids.last().unwrap()
    );
    assert_same(
        &stepped,
        &generate(&mut engine, &prompt, &no_stop_ids(1000)),
    );
    // The greedy continuation is the one a large context gives, up to where this one ended.
    let mut large = self::engine(1024).unwrap();
    let unlimited = generate(&mut large, &prompt, &no_stop_ids(g.token_ids.len()));
    assert_eq!(unlimited.generation.token_ids, g.token_ids);
}

#[test]
fn a_step_after_the_end_is_an_error() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let prompt = Prompt::Raw("The quick brown fox".into());
    let mut active = engine.begin(&prompt, &no_stop_ids(2)).unwrap();
    assert!(engine.step(&mut active).unwrap().finished.is_none());
    assert_eq!(
        engine.step(&mut active).unwrap().finished,
        Some(FinishReason::Length)
    );
    assert_eq!(active.finish_reason(), Some(FinishReason::Length));
    let err = engine.step(&mut active).expect_err("a step after the end");
    assert!(matches!(err, LeanError::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("is over (length)"), "{err}");
    // The failed call changed nothing.
    assert_eq!(active.token_ids().len(), 2);
    let ended = engine.finish(active).unwrap();
    assert_eq!(ended.generation.finish_reason, FinishReason::Length);
    assert_eq!(ended.generation.token_ids.len(), 2);
}

#[test]
fn a_later_begin_or_logits_all_takes_the_session_over() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let reference = reference("chat_short");
    let prompt = Prompt::Ids(reference.prompt_ids.clone());
    let other = Prompt::Raw("Once upon a time".into());
    let superseded_error = |engine: &mut Engine, active: &mut ActiveGeneration| {
        let err = engine.step(active).expect_err("a superseded generation");
        assert!(err.to_string().contains("no longer continue"), "{err}");
    };

    let mut first = engine.begin(&other, &no_stop_ids(8)).unwrap();
    engine.step(&mut first).unwrap();
    let mut second = engine.begin(&prompt, &no_stop_ids(8)).unwrap();
    superseded_error(&mut engine, &mut first);
    for expected in &reference.greedy_ids[..3] {
        assert_eq!(
            engine.step(&mut second).unwrap().token.unwrap().id,
            *expected
        );
    }
    // Another engine's generation does not own this engine's session either.
    let mut elsewhere = self::engine(1024).unwrap();
    superseded_error(&mut elsewhere, &mut second);

    engine.logits_all(&[1, 2, 3], |_, _| {}).unwrap();
    superseded_error(&mut engine, &mut second);
    // The superseded generation still finishes, with what it had, as cancelled.
    let ended = engine.finish(second).unwrap();
    assert_eq!(ended.generation.token_ids, reference.greedy_ids[..3]);
    assert_eq!(ended.generation.finish_reason, FinishReason::Cancelled);
}

#[test]
fn a_failed_begin_leaves_no_generation_and_the_engine_usable() {
    let Some(mut engine) = engine(64) else {
        return;
    };
    let reference = reference("chat_short");
    let prompt = Prompt::Ids(reference.prompt_ids.clone());
    let mut active = engine.begin(&prompt, &no_stop_ids(8)).unwrap();
    engine.step(&mut active).unwrap();
    let err = engine
        .begin(&Prompt::Ids(vec![1, 999_999]), &no_stop_ids(8))
        .err()
        .expect("bad id");
    assert!(err.to_string().contains("999999"), "{err}");
    let err = engine
        .begin(&Prompt::Ids(vec![1; 64]), &no_stop_ids(8))
        .err()
        .expect("too long");
    assert!(matches!(err, LeanError::PromptTooLong { .. }), "{err}");
    let err = engine
        .begin(&Prompt::Ids(vec![]), &no_stop_ids(8))
        .err()
        .expect("empty");
    assert!(err.to_string().contains("the prompt is empty"), "{err}");
    // The failed begins took the session from the generation in progress.
    assert!(engine.step(&mut active).is_err());
    let again = step_through(&mut engine, &prompt, &no_stop_ids(8), usize::MAX);
    assert_eq!(again.generation.token_ids, reference.greedy_ids[..8]);
}

#[test]
fn cancelling_then_beginning_again_is_exact() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let reference = reference("chat_short");
    let prompt = Prompt::Ids(reference.prompt_ids.clone());
    // Finished early: cancelled, with the tokens so far.
    let cut = step_through(&mut engine, &prompt, &no_stop_ids(12), 3);
    assert_eq!(cut.generation.finish_reason, FinishReason::Cancelled);
    assert_eq!(cut.generation.token_ids, reference.greedy_ids[..3]);
    assert_eq!(streamed_text(&cut), cut.generation.text);
    let full = step_through(&mut engine, &prompt, &no_stop_ids(12), usize::MAX);
    assert_eq!(full.generation.token_ids, reference.greedy_ids[..12]);
    // Dropped without finish: the next begin is exact too.
    let mut dropped = engine.begin(&prompt, &no_stop_ids(12)).unwrap();
    engine.step(&mut dropped).unwrap();
    drop(dropped);
    let again = generate(&mut engine, &prompt, &no_stop_ids(12));
    assert_same(&full, &again);
}

#[test]
fn declining_the_last_token_in_generate_still_cancels() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    let prompt = Prompt::Raw("The quick brown fox".into());
    let mut calls = 0;
    let g = engine
        .generate(&prompt, &no_stop_ids(4), |_| {
            calls += 1;
            calls < 4
        })
        .unwrap();
    assert_eq!(g.token_ids.len(), 4);
    assert_eq!(g.finish_reason, FinishReason::Cancelled);
}

#[test]
fn text_held_back_at_the_end_comes_out_of_finish() {
    let Some(mut engine) = engine(1024) else {
        return;
    };
    // A crab emoji is three byte-level tokens, and the model goes on repeating it.
    let crab = engine.tokenizer.encode("🦀", false).unwrap();
    assert_eq!(crab.len(), 3);
    let prompt = Prompt::Ids(crab.repeat(6));
    // Cut after the crab's first byte token: nothing streams until finish flushes it.
    let cut = step_through(&mut engine, &prompt, &no_stop_ids(1), usize::MAX);
    assert_eq!(cut.generation.token_ids, crab[..1]);
    assert_eq!(cut.finished, [Some(FinishReason::Length)]);
    let held_back = engine.tokenizer.decode(&crab[..1], true).unwrap();
    assert!(
        held_back.ends_with(char::REPLACEMENT_CHARACTER),
        "{held_back:?}"
    );
    // The step's event has no text; the held-back text comes as one more event with the same id.
    assert_eq!(
        cut.events,
        [(crab[0], String::new()), (crab[0], held_back.clone())]
    );
    assert_eq!(cut.generation.text, held_back);
    assert_same(&cut, &generate(&mut engine, &prompt, &no_stop_ids(1)));
    // The model goes on with another four-byte emoji: it streams whole with its last token.
    let whole = step_through(&mut engine, &prompt, &no_stop_ids(3), usize::MAX);
    assert_eq!(whole.generation.token_ids[..2], crab[..2]);
    let emoji = engine
        .tokenizer
        .decode(&whole.generation.token_ids, true)
        .unwrap();
    assert_eq!(emoji.chars().count(), 1, "{emoji:?}");
    assert_ne!(emoji.chars().next(), Some(char::REPLACEMENT_CHARACTER));
    let texts: Vec<&str> = whole.events.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(texts, ["", "", emoji.as_str()]);
}
