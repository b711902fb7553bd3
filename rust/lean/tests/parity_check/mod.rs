//! The token-exactness check shared by the CPU parity tests (here) and the GPU backend's
//! (lean-gpu/tests/parity.rs): prompt ids, greedy ids and teacher-forced logits against the HF
//! transformers float32 reference (fixtures/hf, made by scripts/gen_fixtures.py).
#![allow(dead_code)]
use crate::common;
use lean::{
    ChatMessage, Engine, GenerateOptions, Model, Prompt, SamplingParams, Speculation,
    SpeculationStats, Tokenizer,
};
use serde::Deserialize;

/// Logits may differ from the reference by float32 summation order only: measured worst
/// 2.1e-4 (SmolLM2 Q4_0), 5e-5 (Qwen2.5); a 10× margin.
pub const LOGIT_TOLERANCE: f32 = 2e-3;
/// A reference step whose top-1 minus top-2 logit is below this is a near-tie: summation order
/// alone can flip it. Failures there are reported as such.
pub const NEAR_TIE: f32 = 1e-2;

#[derive(Deserialize)]
pub struct Fixture {
    cases: Vec<Case>,
    /// The clock the reference's chat template saw (Llama 3.x's prints today's date).
    #[serde(default)]
    template_time: Option<i64>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    kind: String,
    messages: Option<Vec<ChatMessage>>,
    prompt: Option<String>,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    steps: Vec<Step>,
    positions: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    top_ids: Vec<u32>,
    top_logits: Vec<f32>,
}

impl Step {
    fn margin(&self) -> f32 {
        self.top_logits[0] - self.top_logits[1]
    }

    /// How a disagreement at this reference step is reported.
    fn mismatch_kind(&self) -> &'static str {
        if self.margin() < NEAR_TIE {
            "near-tie"
        } else {
            "REAL MISMATCH"
        }
    }
}

impl Fixture {
    /// The prompt ids and greedy ids of case `name`.
    pub fn ids(&self, name: &str) -> (&[u32], &[u32]) {
        let case = self
            .cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no fixture case {name}"));
        (&case.prompt_ids, &case.greedy_ids)
    }
}

pub fn fixture_for(file: &str) -> Fixture {
    let fixture_path = common::repo_root()
        .join("fixtures/hf")
        .join(file.replace(".gguf", ".json"));
    serde_json::from_slice(&std::fs::read(&fixture_path).expect("fixture")).expect("fixture json")
}

/// The model file and its tokenizer from the test models directory (None: skipped). The
/// tokenizer is the one the GGUF's own metadata describes: the fixtures pass with the file alone.
/// (The tokenizer.json path is checked against transformers by lean-tokenizer's tests, and
/// against the engine by steps.rs and errors.rs.)
pub fn load(file: &str) -> Option<(Model, Tokenizer)> {
    let models = common::models_dir()?;
    let model = Model::load_file(&models.join(file)).expect("model loads");
    let mut tokenizer =
        Tokenizer::from_gguf(&model.gguf, None, None).expect("tokenizer from the GGUF");
    tokenizer.set_template_time(fixture_for(file).template_time);
    Some((model, tokenizer))
}

/// Checks `engine` against the fixture cases of `file` that `include` accepts (by name):
/// prompt ids, the first `max_greedy` greedy ids (all with `None`), teacher-forced logits at
/// every position of the prompt and those ids.
pub fn check_engine(
    engine: &mut Engine,
    file: &str,
    include: impl Fn(&str) -> bool,
    max_greedy: Option<usize>,
) {
    check_engine_with(engine, file, include, max_greedy, |_| true)
}

/// [`check_engine`], with the teacher-forced logits only on the cases `forced` accepts (the
/// others: prompt and greedy ids).
pub fn check_engine_with(
    engine: &mut Engine,
    file: &str,
    include: impl Fn(&str) -> bool,
    max_greedy: Option<usize>,
    forced: impl Fn(&str) -> bool,
) {
    let fixture = fixture_for(file);
    let mut failures = Vec::new();
    let mut worst_logit_error = 0f32;
    let mut checked = 0;
    for case in fixture.cases.iter().filter(|c| include(&c.name)) {
        checked += 1;
        let greedy_ids = &case.greedy_ids
            [..max_greedy.map_or(case.greedy_ids.len(), |m| m.min(case.greedy_ids.len()))];
        let prompt = match case.kind.as_str() {
            "chat" => Prompt::Chat(case.messages.clone().unwrap()),
            _ => Prompt::Raw(case.prompt.clone().unwrap()),
        };
        // 1. prompt ids, through the tokenizer and chat template
        let ids = engine.encode(&prompt).unwrap();
        if ids != case.prompt_ids {
            failures.push(format!(
                "{file} {}: prompt ids differ\n  ours {ids:?}\n  ref  {:?}",
                case.name, case.prompt_ids
            ));
            continue;
        }
        // 2. greedy generation (no stop tokens, as the reference)
        let options = GenerateOptions {
            max_tokens: greedy_ids.len(),
            stop_token_ids: Some(vec![]),
            ..Default::default()
        };
        let generation = engine
            .generate(&Prompt::Ids(ids.clone()), &options, |_| true)
            .unwrap();
        if let Some(i) = generation
            .token_ids
            .iter()
            .zip(greedy_ids)
            .position(|(a, b)| a != b)
        {
            let step = &case.steps[i];
            let kind = step.mismatch_kind();
            failures.push(format!(
                "{file} {}: greedy step {i}: ours {} ref {} ({kind}: reference margin {:.4}, top ids {:?} logits {:?})",
                case.name, generation.token_ids[i], greedy_ids[i], step.margin(), &step.top_ids[..3], &step.top_logits[..3]
            ));
        } else if generation.token_ids.len() != greedy_ids.len() {
            failures.push(format!(
                "{file} {}: generated {} tokens, expected {}",
                case.name,
                generation.token_ids.len(),
                greedy_ids.len()
            ));
        }
        // 3. teacher-forced logits at every position of prompt + reference continuation
        if !forced(&case.name) {
            continue;
        }
        let all: Vec<u32> = case.prompt_ids.iter().chain(greedy_ids).copied().collect();
        let mut first_bad: Option<String> = None;
        engine
            .logits_all(&all, |p, logits| {
                let r = &case.positions[p];
                let ours_top = lean::sampling::argmax(logits);
                for (&id, &want) in r.top_ids.iter().zip(&r.top_logits) {
                    let err = (logits[id as usize] - want).abs();
                    worst_logit_error = worst_logit_error.max(err);
                    if err > LOGIT_TOLERANCE && first_bad.is_none() {
                        first_bad = Some(format!(
                            "position {p}: logit of {id} is {} want {want}",
                            logits[id as usize]
                        ));
                    }
                }
                if ours_top != r.top_ids[0] && first_bad.is_none() {
                    let kind = r.mismatch_kind();
                    first_bad = Some(format!(
                        "position {p}: top-1 ours {ours_top} ref {} ({kind}, margin {:.4})",
                        r.top_ids[0],
                        r.margin()
                    ));
                }
            })
            .unwrap();
        if let Some(msg) = first_bad {
            failures.push(format!("{file} {}: teacher-forced {msg}", case.name));
        }
    }
    eprintln!(
        "{file} on {}: {checked} cases, worst teacher-forced logit error {worst_logit_error:.2e}",
        engine.backend()
    );
    assert!(checked > 0, "no fixture case selected");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Speculative decoding (prompt lookup) gives the reference's tokens: (a) every case's greedy ids,
/// with guesses verified in batched passes, equal the HF reference as plain decoding's do (a
/// difference is reported as a near-tie where the reference's margin is small: a verification
/// pass sums like the prefill, not like one-token decoding). The guesses come from a prediction,
/// the reference ids with every fourth one wrong, so that runs are kept and refused in every
/// file (random weights repeat nothing for a plain lookup to find). (b) On a prompt that repeats
/// itself (the case's prompt and reference continuation, then the prompt again) plain prompt
/// lookup equals this engine's plain greedy output; with trained weights its guesses are
/// accepted. (c) The sampled verification path (every row's logits, `Sampler::sample_guess`)
/// on deterministic samplers equals their plain runs.
/// `include` and `max_greedy` select cases and ids as for [`check_engine`].
pub fn check_speculative(
    engine: &mut Engine,
    file: &str,
    include: impl Fn(&str) -> bool,
    max_greedy: Option<usize>,
) {
    let fixture = fixture_for(file);
    let options = |n| GenerateOptions {
        max_tokens: n,
        stop_token_ids: Some(vec![]),
        speculation: Some(Speculation::lookup(6).without_cost_check()),
        ..Default::default()
    };
    let mut failures = Vec::new();
    let mut on_reference = SpeculationStats::default();
    let mut on_repeats = SpeculationStats::default();
    let mut on_sampled = SpeculationStats::default();
    for case in fixture.cases.iter().filter(|c| include(&c.name)) {
        let n = max_greedy.map_or(case.greedy_ids.len(), |m| m.min(case.greedy_ids.len()));
        let greedy_ids = &case.greedy_ids[..n];
        // (a) against the reference
        let vocab = engine.model.config.vocab_size as u32;
        let prediction: Vec<u32> = greedy_ids
            .iter()
            .enumerate()
            .map(|(i, &id)| if i % 4 == 3 { (id + 1) % vocab } else { id })
            .collect();
        let predicted = GenerateOptions {
            speculation: Some(
                Speculation::lookup(6)
                    .with_prediction(prediction)
                    .without_cost_check(),
            ),
            ..options(n)
        };
        let g = engine
            .generate(&Prompt::Ids(case.prompt_ids.clone()), &predicted, |_| true)
            .unwrap();
        add(&mut on_reference, g.timings.speculation);
        failures.extend(greedy_failure(
            file,
            case,
            "speculative",
            &g.token_ids,
            greedy_ids,
        ));
        // (b) a prompt that repeats: plain and speculative from the same (fresh) cache state
        let repeats: Vec<u32> = case
            .prompt_ids
            .iter()
            .chain(greedy_ids)
            .chain(&case.prompt_ids)
            .copied()
            .collect();
        // As much of it as fits the context (its end).
        let fits = engine.context_length() - n - 1;
        let repeats = repeats[repeats.len().saturating_sub(fits)..].to_vec();
        engine.reset_cache();
        let (plain, _) = greedy(engine, &repeats, n);
        engine.reset_cache();
        let g = engine
            .generate(&Prompt::Ids(repeats.clone()), &options(n), |_| true)
            .unwrap();
        add(&mut on_repeats, g.timings.speculation);
        if g.token_ids != plain {
            let i = g
                .token_ids
                .iter()
                .zip(&plain)
                .position(|(a, b)| a != b)
                .unwrap_or(n);
            failures.push(format!(
                "{file} {}: speculative on the repeated prompt differs from plain at step {i}:\n  spec  {:?}\n  plain {plain:?}",
                case.name, g.token_ids
            ));
        }
        // (c) the sampled verification path (every row's logits, Sampler::sample_guess) on
        // deterministic samplers: a repetition penalty (greedy, which sees the accepted guesses)
        // and top-k 1 at a temperature; each must equal its plain run.
        for sampling in [
            SamplingParams {
                repetition_penalty: 1.3,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.7,
                top_k: 1,
                seed: 5,
                ..Default::default()
            },
        ] {
            let plain_options = GenerateOptions {
                sampling: sampling.clone(),
                ..options(n)
            };
            let plain_options = GenerateOptions {
                speculation: None,
                ..plain_options
            };
            engine.reset_cache();
            let p = engine
                .generate(&Prompt::Ids(repeats.clone()), &plain_options, |_| true)
                .unwrap();
            // Guesses from the plain output, every fourth one wrong: passes with runs kept and
            // guesses refused, whatever the weights.
            let prediction: Vec<u32> = p
                .token_ids
                .iter()
                .enumerate()
                .map(|(i, &id)| if i % 4 == 3 { (id + 1) % vocab } else { id })
                .collect();
            let spec_options = GenerateOptions {
                sampling: sampling.clone(),
                speculation: Some(
                    Speculation::lookup(6)
                        .with_prediction(prediction)
                        .without_cost_check(),
                ),
                ..options(n)
            };
            engine.reset_cache();
            let g = engine
                .generate(&Prompt::Ids(repeats.clone()), &spec_options, |_| true)
                .unwrap();
            add(&mut on_sampled, g.timings.speculation);
            if g.token_ids != p.token_ids {
                failures.push(format!(
                    "{file} {}: speculative sampling ({sampling:?}) differs from plain:\n  spec  {:?}\n  plain {:?}",
                    case.name, g.token_ids, p.token_ids
                ));
            }
        }
    }
    eprintln!(
        "{file} on {}: prompt lookup on the reference prompts: {} passes, {}/{} guesses accepted; \
         on repeated prompts: {} passes, {}/{} accepted",
        engine.backend(),
        on_reference.verifications,
        on_reference.accepted,
        on_reference.drafted,
        on_repeats.verifications,
        on_repeats.accepted,
        on_repeats.drafted
    );
    assert!(
        on_sampled.accepted > 0,
        "{file}: sampled verification kept no guess: {on_sampled:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        on_reference.accepted > 0 && on_reference.accepted < on_reference.drafted,
        "{file}: the predictions' guesses were not both kept and refused: {on_reference:?}"
    );
    // A random-weight model need not continue a repeat; a trained one does.
    if !file.contains("random") {
        assert!(
            on_repeats.accepted > 0,
            "{file}: no guess was accepted on repeated prompts"
        );
    }
}

/// Adds one generation's speculation counts to `total`.
fn add(total: &mut SpeculationStats, s: SpeculationStats) {
    total.verifications += s.verifications;
    total.drafted += s.drafted;
    total.accepted += s.accepted;
}

/// How a `how` (e.g. "drafted") generation's ids `ours` fail the case's first `greedy_ids`:
/// the first differing step with the reference's margin there, or a wrong length.
fn greedy_failure(
    file: &str,
    case: &Case,
    how: &str,
    ours: &[u32],
    greedy_ids: &[u32],
) -> Option<String> {
    if let Some(i) = ours.iter().zip(greedy_ids).position(|(a, b)| a != b) {
        let step = &case.steps[i];
        return Some(format!(
            "{file} {}: {how} greedy step {i}: ours {} ref {} ({}: reference margin {:.4})",
            case.name,
            ours[i],
            greedy_ids[i],
            step.mismatch_kind(),
            step.margin()
        ));
    }
    (ours.len() != greedy_ids.len()).then(|| {
        format!(
            "{file} {}: {how}: {} tokens, expected {}",
            case.name,
            ours.len(),
            greedy_ids.len()
        )
    })
}

/// Speculative decoding by the draft model `engine` was given (`Engine::set_draft_model`) on
/// the fixture cases that `include` accepts: the greedy ids equal the reference's (the first
/// `max_greedy` of them), and a repetition-penalized run (the sampled verification path) equals
/// its plain run. A draft model that is the target's sibling must have guesses accepted.
pub fn check_draft_model(
    engine: &mut Engine,
    file: &str,
    include: impl Fn(&str) -> bool,
    max_greedy: Option<usize>,
) {
    let fixture = fixture_for(file);
    let mut failures = Vec::new();
    let mut stats = SpeculationStats::default();
    let mut checked = 0;
    for case in fixture.cases.iter().filter(|c| include(&c.name)) {
        checked += 1;
        let n = max_greedy.map_or(case.greedy_ids.len(), |m| m.min(case.greedy_ids.len()));
        let greedy_ids = &case.greedy_ids[..n];
        let drafted = GenerateOptions {
            max_tokens: n,
            stop_token_ids: Some(vec![]),
            speculation: Some(Speculation::draft_model(6).without_cost_check()),
            ..Default::default()
        };
        engine.reset_cache();
        let g = engine
            .generate(&Prompt::Ids(case.prompt_ids.clone()), &drafted, |_| true)
            .unwrap();
        add(&mut stats, g.timings.speculation);
        failures.extend(greedy_failure(
            file,
            case,
            "drafted",
            &g.token_ids,
            greedy_ids,
        ));
        let penalized = SamplingParams {
            repetition_penalty: 1.3,
            ..Default::default()
        };
        let plain = GenerateOptions {
            sampling: penalized.clone(),
            speculation: None,
            ..drafted.clone()
        };
        let with_draft = GenerateOptions {
            sampling: penalized,
            ..drafted.clone()
        };
        let mut run = |options: &GenerateOptions| {
            engine.reset_cache();
            engine
                .generate(&Prompt::Ids(case.prompt_ids.clone()), options, |_| true)
                .unwrap()
                .token_ids
        };
        let (p, d) = (run(&plain), run(&with_draft));
        if p != d {
            failures.push(format!(
                "{file} {}: drafted with a repetition penalty differs from plain:\n  draft {d:?}\n  plain {p:?}",
                case.name
            ));
        }
    }
    eprintln!(
        "{file} on {} drafted by {}: {} passes, {}/{} guesses accepted",
        engine.backend(),
        engine.draft_model().unwrap_or_default(),
        stats.verifications,
        stats.accepted,
        stats.drafted
    );
    assert!(checked > 0, "no fixture case selected");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        stats.accepted > stats.drafted / 4,
        "{file}: the draft model's guesses were rarely accepted: {stats:?}"
    );
}

/// Greedy ids of `ids` continued for `n` tokens (no stop ids), and how many prompt tokens came
/// from the engine's cache.
fn greedy(engine: &mut Engine, ids: &[u32], n: usize) -> (Vec<u32>, usize) {
    let options = GenerateOptions {
        max_tokens: n,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    };
    let g = engine
        .generate(&Prompt::Ids(ids.to_vec()), &options, |_| true)
        .unwrap();
    (g.token_ids, g.timings.cached_tokens)
}

/// The KV cache carried across generations gives the reference's tokens: for every fixture case,
/// after whatever the previous case left in the cache (a diverging prompt: the common prefix is
/// kept), (a) the first half of the greedy ids; (b) the conversation going on — the prompt plus
/// that half, of which all but the last token come from the cache — gives the second half;
/// (c) a prompt that stops inside the cache (a roll back) gives the ids after it. Greedy ids
/// generated with reuse must equal the HF reference as a fresh engine's do (a difference is
/// reported as a near-tie where the reference's margin is small: prefill and decode sum in
/// different orders).
/// `include` and `max_greedy` select cases and ids as for [`check_engine`].
pub fn check_reuse(
    engine: &mut Engine,
    file: &str,
    include: impl Fn(&str) -> bool,
    max_greedy: Option<usize>,
) {
    let fixture = fixture_for(file);
    let mut failures = Vec::new();
    let mut compare = |case: &Case, what: &str, ours: &[u32], from: usize| {
        let want = &case.greedy_ids[from..from + ours.len()];
        if let Some(i) = ours.iter().zip(want).position(|(a, b)| a != b) {
            let step = &case.steps[from + i];
            let kind = step.mismatch_kind();
            failures.push(format!(
                "{file} {} ({what}): greedy step {}: ours {} ref {} ({kind}: reference margin {:.4})",
                case.name,
                from + i,
                ours[i],
                want[i],
                step.margin()
            ));
        }
    };
    let mut reused = 0;
    let mut checked = 0;
    for case in fixture.cases.iter().filter(|c| include(&c.name)) {
        checked += 1;
        let greedy_len = max_greedy.map_or(case.greedy_ids.len(), |m| m.min(case.greedy_ids.len()));
        let half = greedy_len / 2;
        let (first, _) = greedy(engine, &case.prompt_ids, half);
        compare(case, "first turn", &first, 0);

        let next: Vec<u32> = case
            .prompt_ids
            .iter()
            .chain(&case.greedy_ids[..half])
            .copied()
            .collect();
        let rest = greedy_len - half;
        let (second, cached) = greedy(engine, &next, rest);
        assert_eq!(
            cached,
            next.len() - 1,
            "{file} {}: the next turn reuses all but its last token",
            case.name
        );
        compare(case, "next turn from the cache", &second, half);
        reused += cached;

        let back = half / 2;
        let shorter: Vec<u32> = case
            .prompt_ids
            .iter()
            .chain(&case.greedy_ids[..back])
            .copied()
            .collect();
        let (third, cached) = greedy(engine, &shorter, 4);
        assert_eq!(
            cached,
            shorter.len() - 1,
            "{file} {}: a rolled-back prompt reuses its prefix",
            case.name
        );
        compare(case, "rolled back", &third, back);
        reused += cached;
    }
    eprintln!(
        "{file} on {}: reuse checked on {checked} cases, {reused} prompt tokens taken from the cache",
        engine.backend()
    );
    assert!(checked > 0, "no fixture case selected");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
