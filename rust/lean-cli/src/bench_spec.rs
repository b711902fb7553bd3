//! `lean-cli bench-spec`: speculative decoding by prompt lookup (and by a draft model, with
//! `--draft`) against plain greedy decoding on four tasks (rewrite a given function, summarize a
//! given text, open chat, extract an order as JSON under a schema, plain and speculative alike;
//! the prompts are in scripts/bench-spec-tasks.json): decode tok/s of
//! each, the speed-up, the share of guesses accepted, and whether the tokens are the same (they
//! must be). Runs alternate plain and speculative, `--reps` times (which goes first alternates too),
//! from an empty cache each.
use crate::{init_threads, load_model, model_and_tokenizer, new_engine, CliResult, Common};
use clap::Args;
use lean::{ChatMessage, GenerateOptions, Generation, Prompt, Speculation};
use lean_constraint::ConstraintSpec;
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Args)]
pub struct BenchSpecArgs {
    #[command(flatten)]
    common: Common,
    /// tokenizer.json or its directory, or `gguf` (default: next to the model, else the GGUF's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Longest guess, in tokens.
    #[arg(long, default_value_t = 8)]
    lookup: usize,
    /// Also speculate with this draft model (same vocabulary), on the same backend.
    #[arg(long, value_name = "FILE")]
    draft: Option<PathBuf>,
    /// The draft model's longest guess, in tokens.
    #[arg(long, value_name = "N", default_value_t = 8)]
    draft_max: usize,
    /// Most tokens generated per task (a task may end sooner, at its end-of-turn token).
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Measured repetitions of each task and mode (the first run of all is a warm-up).
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// Guess at every step, even where passes cost more per token than plain steps (the
    /// default pauses guessing then: see `lean::speculative`).
    #[arg(long)]
    no_cost_check: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
struct Task {
    name: String,
    messages: Vec<ChatMessage>,
    /// Structured output: every mode of the task follows this JSON schema.
    #[serde(default)]
    schema: Option<serde_json::Value>,
}

fn tasks() -> Vec<Task> {
    serde_json::from_str(include_str!("../../../scripts/bench-spec-tasks.json"))
        .expect("scripts/bench-spec-tasks.json is a JSON array of tasks")
}

/// The median of `xs`.
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

pub fn run(args: BenchSpecArgs) -> CliResult {
    if args.reps == 0 || args.lookup == 0 || args.draft_max == 0 || args.gen_tokens < 2 {
        return Err(
            "--reps, --lookup and --draft-max must be at least 1, --gen-tokens at least 2".into(),
        );
    }
    let threads = init_threads(args.common.threads)?;
    let (_, tok_source) = model_and_tokenizer(&args.common, args.tokenizer.as_ref())?;
    let (model, _) = load_model(&args.common)?;
    let tokenizer = tok_source.load(&model.gguf)?;
    let mut engine = new_engine(&args.common, model, tokenizer, args.draft.as_deref())?;
    let plain = GenerateOptions {
        max_tokens: args.gen_tokens,
        ..Default::default()
    };
    let checked = |spec: Speculation| match args.no_cost_check {
        true => spec.without_cost_check(),
        false => spec,
    };
    let speculative = GenerateOptions {
        speculation: Some(checked(Speculation::lookup(args.lookup))),
        ..plain.clone()
    };
    let drafted = GenerateOptions {
        speculation: Some(checked(Speculation::draft_model(args.draft_max))),
        ..plain.clone()
    };
    let mut run = |prompt: &Prompt, options: &GenerateOptions| -> CliResult<Generation> {
        engine.reset_cache();
        Ok(engine.generate(prompt, options, |_| true)?)
    };
    let mut rows = Vec::new();
    for (t, task) in tasks().iter().enumerate() {
        let prompt = Prompt::Chat(task.messages.clone());
        if t == 0 {
            run(&prompt, &plain)?;
        }
        let constrained = |options: &GenerateOptions| GenerateOptions {
            constraint: task.schema.clone().map(ConstraintSpec::JsonSchema),
            ..options.clone()
        };
        let (plain, speculative, drafted) = (
            constrained(&plain),
            constrained(&speculative),
            constrained(&drafted),
        );
        let (mut plain_tps, mut spec_tps, mut draft_tps) = (Vec::new(), Vec::new(), Vec::new());
        let mut same = true;
        let (mut last, mut last_draft) = (None, None);
        for rep in 0..args.reps {
            // Which mode runs first alternates: on a small machine the second of two runs was
            // up to 5% slower or faster with both modes plain (BENCHMARKS.md, the A/A control).
            let (p, s) = if rep % 2 == 0 {
                let p = run(&prompt, &plain)?;
                (p, run(&prompt, &speculative)?)
            } else {
                let s = run(&prompt, &speculative)?;
                (run(&prompt, &plain)?, s)
            };
            same &= p.token_ids == s.token_ids;
            plain_tps.push(p.timings.decode_tokens_per_second());
            spec_tps.push(s.timings.decode_tokens_per_second());
            last = Some(s);
            if args.draft.is_some() {
                let d = run(&prompt, &drafted)?;
                same &= p.token_ids == d.token_ids;
                draft_tps.push(d.timings.decode_tokens_per_second());
                last_draft = Some(d);
            }
        }
        let s = last.expect("at least one rep");
        let (plain_tps, spec_tps) = (median(plain_tps), median(spec_tps));
        let stats = s.timings.speculation;
        let draft = last_draft.map(|d| {
            let stats = d.timings.speculation;
            let tps = median(draft_tps);
            serde_json::json!({
                "decode_tokens_per_second": tps,
                "speedup": tps / plain_tps.max(1e-9),
                "verifications": stats.verifications,
                "drafted_tokens": stats.drafted,
                "accepted_tokens": stats.accepted,
                "acceptance_rate": stats.acceptance_rate(),
                "paused_steps": stats.paused_steps,
            })
        });
        rows.push(serde_json::json!({
            "task": task.name,
            "prompt_tokens": s.timings.prompt_tokens,
            "generated_tokens": s.timings.generated_tokens,
            "plain_decode_tokens_per_second": plain_tps,
            "lookup_decode_tokens_per_second": spec_tps,
            "speedup": spec_tps / plain_tps.max(1e-9),
            "verifications": stats.verifications,
            "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted,
            "acceptance_rate": stats.acceptance_rate(),
            "paused_steps": stats.paused_steps,
            "draft_model": draft,
            "same_tokens": same,
        }));
    }
    let all_same = rows.iter().all(|r| r["same_tokens"] == true);
    if args.json {
        let out = serde_json::json!({
            "backend": engine.backend(), "threads": threads, "lookup": args.lookup,
            "draft_model": engine.draft_model(), "draft_max": args.draft_max,
            "gen_tokens": args.gen_tokens, "reps": args.reps,
            "cost_check": !args.no_cost_check, "tasks": rows,
        });
        println!("{out}");
    } else {
        println!(
            "{} · {} threads · prompt lookup, guesses of up to {} tokens · cost check {} · median \
             of {} reps",
            engine.backend(),
            threads,
            args.lookup,
            if args.no_cost_check { "off" } else { "on" },
            args.reps
        );
        if let Some(draft) = engine.draft_model() {
            println!(
                "draft model: {draft}, guesses of up to {} tokens",
                args.draft_max
            );
        }
        let draft_header = if args.draft.is_some() {
            "  draft tok/s  speed-up  accepted  paused"
        } else {
            ""
        };
        println!(
            "task      prompt  generated  plain tok/s  lookup tok/s  speed-up  accepted  paused{draft_header}  same tokens"
        );
        for r in &rows {
            let draft = &r["draft_model"];
            let draft_columns = if draft.is_null() {
                String::new()
            } else {
                format!(
                    "  {:>11.1}  {:>7.2}x  {:>4}/{:<4}  {:>6}",
                    draft["decode_tokens_per_second"].as_f64().unwrap_or(0.0),
                    draft["speedup"].as_f64().unwrap_or(0.0),
                    draft["accepted_tokens"].as_u64().unwrap_or(0),
                    draft["drafted_tokens"].as_u64().unwrap_or(0),
                    draft["paused_steps"].as_u64().unwrap_or(0),
                )
            };
            println!(
                "{:<8}  {:>6}  {:>9}  {:>11.1}  {:>12.1}  {:>7.2}x  {:>4}/{:<4}  {:>6}{}  {}",
                r["task"].as_str().unwrap_or(""),
                r["prompt_tokens"].as_u64().unwrap_or(0),
                r["generated_tokens"].as_u64().unwrap_or(0),
                r["plain_decode_tokens_per_second"].as_f64().unwrap_or(0.0),
                r["lookup_decode_tokens_per_second"].as_f64().unwrap_or(0.0),
                r["speedup"].as_f64().unwrap_or(0.0),
                r["accepted_tokens"].as_u64().unwrap_or(0),
                r["drafted_tokens"].as_u64().unwrap_or(0),
                r["paused_steps"].as_u64().unwrap_or(0),
                draft_columns,
                if r["same_tokens"] == true {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
    }
    if !all_same {
        return Err("speculative decoding changed the tokens (a bug, or a near-tie between the batched and one-token passes)".into());
    }
    Ok(())
}
