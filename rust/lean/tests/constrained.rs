//! Constrained decoding on real weights (CPU): greedy output under every schema of the corpus
//! (rust/lean-constraint/tests/schemas) parses and validates (an independent validator, the
//! `jsonschema` crate), ends with `stop` within max_tokens; the mask does not change the choice
//! wherever the unconstrained choice was allowed; a rejected schema is a clear error; an output
//! that cannot be finished within max_tokens ends with `length`.
mod common;

use lean::{
    ChatMessage, Engine, FinishReason, GenerateOptions, LeanError, Model, Prompt, Tokenizer,
};
use lean_constraint::ConstraintSpec;
use serde_json::Value;

const MODELS: [&str; 2] = [
    "smollm2-135m-instruct-q4_0.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
];

fn engine(file: &str) -> Option<Engine> {
    let models = common::models_dir()?;
    let model = Model::load_file(&models.join(file)).unwrap();
    let tokenizer = Tokenizer::from_path(&common::tokenizer_dir_for(&models, file)).unwrap();
    Some(Engine::new(model, tokenizer, 2048).unwrap())
}

fn corpus() -> Vec<(String, String, Value)> {
    let dir = common::repo_root().join("rust/lean-constraint/tests/schemas");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let case: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (
                name,
                case["prompt"].as_str().unwrap().to_string(),
                case["schema"].clone(),
            )
        })
        .collect();
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        cases.len() >= 10,
        "the schema corpus is in {}",
        dir.display()
    );
    cases
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::new("user", text)])
}

fn greedy(max_tokens: usize, constraint: Option<ConstraintSpec>) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        constraint,
        ..Default::default()
    }
}

#[test]
fn greedy_outputs_validate_against_every_schema_of_the_corpus() {
    for file in MODELS {
        let Some(mut engine) = engine(file) else {
            return;
        };
        for (name, prompt, schema) in corpus() {
            let validator = jsonschema::validator_for(&schema)
                .unwrap_or_else(|e| panic!("{name}: the validator rejects the schema: {e}"));
            let options = greedy(200, Some(ConstraintSpec::JsonSchema(schema.clone())));
            let generation = engine.generate(&chat(&prompt), &options, |_| true).unwrap();
            let text = &generation.text;
            assert_eq!(
                generation.finish_reason,
                FinishReason::Stop,
                "{file} {name}: not finished within max_tokens: {text}"
            );
            let value: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("{file} {name}: not JSON ({e}): {text}"));
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{file} {name}: {text} is invalid: {errors:?}"
            );
            eprintln!("{file} {name}: {text}");
        }
    }
}

#[test]
fn json_object_gives_an_object() {
    for file in MODELS {
        let Some(mut engine) = engine(file) else {
            return;
        };
        let options = greedy(200, Some(ConstraintSpec::JsonObject));
        let generation = engine
            .generate(
                &chat("Give a JSON object with the name and the age of a person."),
                &options,
                |_| true,
            )
            .unwrap();
        let text = &generation.text;
        if generation.finish_reason == FinishReason::Length {
            // Any object may go on forever: SmolLM2 135M repeats a key until max_tokens (no
            // schema bounds it). The text is still an object so far.
            assert!(
                file.starts_with("smollm2") && text.starts_with('{'),
                "{file}: {text}"
            );
            continue;
        }
        assert_eq!(generation.finish_reason, FinishReason::Stop);
        let value: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: not JSON ({e}): {text}"));
        assert!(value.is_object(), "{file}: {value}");
    }
}

/// A regex the model's own greedy text matches: runs of letters, digits and spaces become
/// classes, the rest stays literal. Many tokens are masked at every step, never the model's.
fn generalized(text: &str) -> String {
    let mut rx = String::new();
    let mut last = ' ';
    for c in text.chars() {
        let class = if c.is_ascii_alphabetic() {
            'a'
        } else if c.is_ascii_digit() {
            '0'
        } else if c == ' ' {
            ' '
        } else {
            '.'
        };
        match class {
            'a' if last != 'a' => rx.push_str("[A-Za-z]+"),
            '0' if last != '0' => rx.push_str("[0-9]+"),
            ' ' if last != ' ' || rx.is_empty() => rx.push_str(" +"),
            'a' | '0' | ' ' => {}
            _ => {
                let mut buf = [0u8; 4];
                for ch in c.encode_utf8(&mut buf).chars() {
                    rx.push_str(&format!("\\u{{{:x}}}", ch as u32));
                }
            }
        }
        last = class;
    }
    rx
}

#[test]
fn the_mask_does_not_change_a_choice_it_allows() {
    let prompts = [
        Prompt::Raw("The capital of France is".into()),
        chat("Count from 1 to 10, separated by commas."),
        chat("What is 12 times 7? Answer with the number first."),
    ];
    for file in MODELS {
        let Some(mut engine) = engine(file) else {
            return;
        };
        for prompt in &prompts {
            let free = engine
                .generate(prompt, &greedy(24, None), |_| true)
                .unwrap();
            let ids = free
                .token_ids
                .iter()
                .copied()
                .take_while(|id| !engine.tokenizer.eos_token_ids().contains(id))
                .collect::<Vec<_>>();
            let text = engine.tokenizer.decode(&ids, false).unwrap();
            assert!(
                text.is_ascii() && !text.is_empty(),
                "{file}: pick ASCII prompts: {text:?}"
            );
            let rx = generalized(&text);
            let constrained = engine
                .generate(
                    prompt,
                    &greedy(24, Some(ConstraintSpec::Regex(rx.clone()))),
                    |_| true,
                )
                .unwrap();
            assert_eq!(
                constrained.token_ids[..ids.len()],
                ids[..],
                "{file}: {text:?} under /{rx}/ gave {:?}",
                constrained.text
            );
        }
    }
}

#[test]
fn a_rejected_schema_is_a_clear_error() {
    let Some(mut engine) = engine(MODELS[0]) else {
        return;
    };
    let options = greedy(
        16,
        Some(ConstraintSpec::JsonSchema(
            serde_json::json!({"type": "strng"}),
        )),
    );
    match engine.generate(&chat("Hi"), &options, |_| true) {
        Err(LeanError::InvalidArgument(m)) => {
            assert!(
                m.starts_with("invalid json_schema") && m.contains("strng"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The engine goes on: the next generation runs.
    let generation = engine
        .generate(&chat("Hi"), &greedy(4, None), |_| true)
        .unwrap();
    assert_eq!(generation.token_ids.len(), 4);
}

#[test]
fn an_output_that_cannot_finish_within_max_tokens_ends_with_length() {
    let Some(mut engine) = engine(MODELS[0]) else {
        return;
    };
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"words": {"type": "array", "items": {"type": "string"}, "minItems": 20}},
        "required": ["words"]
    });
    let options = greedy(8, Some(ConstraintSpec::JsonSchema(schema)));
    let generation = engine
        .generate(&chat("List words."), &options, |_| true)
        .unwrap();
    assert_eq!(generation.finish_reason, FinishReason::Length);
    assert_eq!(generation.token_ids.len(), 8);
    // A regex that finishes: the generation stops there, without a stop token.
    let options = greedy(32, Some(ConstraintSpec::Regex("(yes|no)".into())));
    let generation = engine
        .generate(
            &chat("Is the sky blue? Answer yes or no."),
            &options,
            |_| true,
        )
        .unwrap();
    assert_eq!(generation.finish_reason, FinishReason::Stop);
    assert!(
        generation.text == "yes" || generation.text == "no",
        "{}",
        generation.text
    );
}

/// Runs `prompt` to the end through `begin_constrained`, returning the generated ids.
fn generate_constrained(
    engine: &mut Engine,
    prompt: &Prompt,
    options: &GenerateOptions,
    constraint: lean_constraint::Constraint,
) -> lean::Result<Vec<u32>> {
    let mut active = engine.begin_constrained(prompt, options, constraint)?;
    while engine.step(&mut active)?.finished.is_none() {}
    Ok(engine.finish(active)?.generation.token_ids)
}

#[test]
fn a_constraint_compiled_beforehand_gives_the_same_tokens_and_must_fit_the_generation() {
    let Some(mut engine) = engine(MODELS[0]) else {
        return;
    };
    let spec = ConstraintSpec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]
    }));
    let prompt = chat("Give the name and the age of a person as JSON.");
    let options = greedy(40, Some(spec.clone()));
    let expected = engine.generate(&prompt, &options, |_| true).unwrap();
    let eos = engine.tokenizer.eos_token_ids();
    let compiled = engine.compile_constraint(&spec, &eos).unwrap();
    // `options.constraint` is ignored: the compiled one is followed.
    let free = greedy(40, None);
    let ids = generate_constrained(&mut engine, &prompt, &free, compiled).unwrap();
    assert_eq!(ids, expected.token_ids);
    // Compiled for other stop ids than the generation's: refused, naming both.
    let other_stops = GenerateOptions {
        stop_token_ids: Some(vec![eos[0], 13]),
        ..greedy(40, None)
    };
    let compiled = engine.compile_constraint(&spec, &eos).unwrap();
    match generate_constrained(&mut engine, &prompt, &other_stops, compiled) {
        Err(LeanError::InvalidArgument(m)) => assert!(m.contains("compiled for"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The engine goes on.
    let again = engine.generate(&prompt, &options, |_| true).unwrap();
    assert_eq!(again.token_ids, expected.token_ids);
}

/// Speculative decoding under a constraint: guesses are cut where the constraint refuses them
/// and each row of a verification pass is checked against its own mask, so greedy output is
/// the plain constrained output, token for token, whatever is guessed: prompt lookup guessing
/// every step, a prediction of the very output (most guesses kept), a prediction that leaves the
/// schema halfway (guesses cut), and a grammar that ends (nothing guessed past its end).
#[test]
fn speculating_under_a_constraint_gives_the_plain_constrained_tokens() {
    for file in MODELS {
        let Some(mut engine) = engine(file) else {
            return;
        };
        let mut kept = 0;
        let cases = corpus();
        let lark = ConstraintSpec::Lark("start: \"yes\" | \"no\"".into());
        // Every third schema (the path is the same for each; the whole corpus costs a minute).
        let specs = cases
            .iter()
            .step_by(3)
            .map(|(name, prompt, schema)| {
                let spec = ConstraintSpec::JsonSchema(schema.clone());
                (name.as_str(), prompt.as_str(), spec)
            })
            .chain([("yes-no", "Is the sky blue? Answer yes or no.", lark)]);
        for (name, prompt, spec) in specs {
            let prompt = chat(prompt);
            let plain = engine
                .generate(&prompt, &greedy(120, Some(spec.clone())), |_| true)
                .unwrap();
            let text = &plain.text;
            // The output itself as the prediction, then the output broken off by a stray letter
            // and text the schema refuses.
            let mut broken = text[..text.len() / 2].to_string();
            broken.push_str("x}}]] nonsense");
            for prediction in [None, Some(text.clone()), Some(broken)] {
                let mut speculation = lean::Speculation::lookup(6).without_cost_check();
                if let Some(text) = &prediction {
                    let ids = engine.tokenizer.encode(text, false).unwrap();
                    speculation = speculation.with_prediction(ids);
                }
                let options = GenerateOptions {
                    speculation: Some(speculation),
                    ..greedy(120, Some(spec.clone()))
                };
                let guessed = engine.generate(&prompt, &options, |_| true).unwrap();
                assert_eq!(
                    guessed.token_ids, plain.token_ids,
                    "{file} {name}, prediction {prediction:?}: {} against {text}",
                    guessed.text
                );
                assert_eq!(guessed.finish_reason, plain.finish_reason, "{file} {name}");
                let stats = guessed.timings.speculation;
                if prediction.as_deref() == Some(text.as_str()) && plain.token_ids.len() > 4 {
                    assert!(stats.accepted > 0, "{file} {name}: {stats:?}");
                }
                kept += stats.accepted;
            }
        }
        assert!(kept > 40, "{file}: only {kept} guesses kept in all");
    }
}

/// A draft model guessing under a constraint (SmolLM2 Q4_0 for Q8_0): the target's greedy
/// constrained tokens, most guesses kept.
#[test]
fn a_draft_model_under_a_constraint_gives_the_plain_constrained_tokens() {
    let Some(mut engine) = engine("smollm2-135m-instruct-q8_0.gguf") else {
        return;
    };
    let models = common::models_dir().unwrap();
    let draft = Model::load_file(&models.join(MODELS[0])).unwrap();
    engine
        .set_draft_model(draft, |model, ctx| {
            Ok(Box::new(lean::cpu::CpuSession::new(model, ctx)))
        })
        .unwrap();
    let (_, prompt, schema) = corpus().into_iter().next().unwrap();
    let spec = ConstraintSpec::JsonSchema(schema);
    let prompt = chat(&prompt);
    let plain = engine
        .generate(&prompt, &greedy(120, Some(spec.clone())), |_| true)
        .unwrap();
    let options = GenerateOptions {
        speculation: Some(lean::Speculation::draft_model(4).without_cost_check()),
        ..greedy(120, Some(spec))
    };
    let drafted = engine.generate(&prompt, &options, |_| true).unwrap();
    assert_eq!(drafted.token_ids, plain.token_ids, "{}", drafted.text);
    let stats = drafted.timings.speculation;
    eprintln!("draft model under a constraint: {stats:?}");
    assert!(stats.accepted * 2 > stats.drafted, "{stats:?}");
    // A format the model would never write unasked: the draft model guesses under the
    // constraint too (its free guesses, English, would all be cut), so guesses are still kept.
    let spec = ConstraintSpec::Regex("[0-9]{3}-[a-z]{4}-[0-9]{3}".into());
    let prompt = chat("Tell me about cats.");
    let plain = engine
        .generate(&prompt, &greedy(40, Some(spec.clone())), |_| true)
        .unwrap();
    let options = GenerateOptions {
        speculation: Some(lean::Speculation::draft_model(4).without_cost_check()),
        ..greedy(40, Some(spec))
    };
    let drafted = engine.generate(&prompt, &options, |_| true).unwrap();
    assert_eq!(drafted.token_ids, plain.token_ids, "{}", drafted.text);
    let stats = drafted.timings.speculation;
    eprintln!(
        "draft model under a regex: {stats:?} for {:?}",
        drafted.text
    );
    // Measured: 5 of 9 kept; free guesses keep 1 of 3.
    assert!(stats.accepted >= 4, "{stats:?}");
}

/// Sampling under a constraint with speculation: every row of a pass is masked before the
/// rejection rule, so every output is inside the constraint, and the distribution is the plain
/// one's: three digits under `[0-9]{3}` at temperature 1, predicted "0123456789" (after any
/// digit, the next two are guessed), 300 seeds each way; the middle digit's counts must agree (chi-square
/// over ten digits, 9 degrees of freedom, 0.1% critical value 27.9).
#[test]
fn sampling_under_a_constraint_with_speculation_keeps_the_output_inside_and_its_distribution() {
    let Some(mut engine) = engine(MODELS[0]) else {
        return;
    };
    let spec = ConstraintSpec::Regex("[0-9]{3}".into());
    let prompt = chat("Write a number with three digits.");
    let prediction = engine.tokenizer.encode("0123456789", false).unwrap();
    let mut counts = [[0usize; 10]; 2];
    let mut guessed = 0;
    for (mode, counts) in counts.iter_mut().enumerate() {
        for seed in 0..300 {
            let speculation = (mode == 1).then(|| {
                lean::Speculation::lookup(3)
                    .without_cost_check()
                    .with_prediction(prediction.clone())
            });
            let options = GenerateOptions {
                max_tokens: 8,
                sampling: lean::SamplingParams {
                    temperature: 1.0,
                    seed,
                    ..Default::default()
                },
                constraint: Some(spec.clone()),
                speculation,
                ..Default::default()
            };
            let g = engine.generate(&prompt, &options, |_| true).unwrap();
            let digits = g.text.as_bytes();
            assert!(
                digits.len() == 3 && digits.iter().all(u8::is_ascii_digit),
                "mode {mode} seed {seed}: {:?}",
                g.text
            );
            counts[(digits[1] - b'0') as usize] += 1;
            guessed += g.timings.speculation.drafted;
        }
    }
    assert!(guessed > 300, "the prediction was guessed from: {guessed}");
    let chi2: f64 = (0..10)
        .filter(|&d| counts[0][d] + counts[1][d] > 0)
        .map(|d| {
            let (a, b) = (counts[0][d] as f64, counts[1][d] as f64);
            (a - b).powi(2) / (a + b)
        })
        .sum();
    assert!(
        chi2 < 27.9,
        "plain {:?} against speculative {:?}: chi2 {chi2}",
        counts[0],
        counts[1]
    );
}
