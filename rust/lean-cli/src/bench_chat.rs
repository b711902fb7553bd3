//! `lean-cli bench-chat`: a multi-turn conversation's time to first token per turn, with the KV
//! cache carried across turns (the default) or dropped before each turn (`--no-reuse`), so the
//! two can be compared side by side. Each turn adds a user message of about 40 tokens and
//! generates `--gen-tokens` greedily (end-of-turn tokens ignored, so every turn is as long).
use crate::{init_threads, load_model, model_and_tokenizer, new_engine, CliResult, Common};
use clap::Args;
use lean::{ChatMessage, GenerateOptions, Prompt};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct BenchChatArgs {
    #[command(flatten)]
    common: Common,
    /// tokenizer.json or its directory, or `gguf` (default: next to the model, else the GGUF's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Turns of the conversation.
    #[arg(long, default_value_t = 10)]
    turns: usize,
    /// Tokens generated each turn.
    #[arg(long, default_value_t = 64)]
    gen_tokens: usize,
    /// Drop the KV cache before each turn (every turn prefills the whole conversation).
    #[arg(long)]
    no_reuse: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// The user's side of the conversation (about 40 tokens each, on one subject), shared with the
/// browser's run of this benchmark (scripts/bench-chat.sh).
fn questions() -> Vec<String> {
    serde_json::from_str(include_str!("../../../scripts/bench-chat-questions.json"))
        .expect("scripts/bench-chat-questions.json is a JSON array of strings")
}

pub fn run(args: BenchChatArgs) -> CliResult {
    let threads = init_threads(args.common.threads)?;
    let questions = questions();
    if args.turns == 0 || args.turns > questions.len() {
        return Err(format!("--turns must be 1 to {}", questions.len()).into());
    }
    let (_, tok_source) = model_and_tokenizer(&args.common, args.tokenizer.as_ref())?;
    let (model, _) = load_model(&args.common)?;
    let tokenizer = tok_source.load(&model.gguf)?;
    let mut engine = new_engine(&args.common, model, tokenizer, None)?;
    let options = GenerateOptions {
        max_tokens: args.gen_tokens,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    };
    let mut messages: Vec<ChatMessage> = Vec::new();
    let mut rows = Vec::new();
    for question in &questions[..args.turns] {
        messages.push(ChatMessage {
            role: "user".into(),
            content: question.clone(),
        });
        if args.no_reuse {
            engine.reset_cache();
        }
        let started = Instant::now();
        let mut first_token = None;
        let generation = engine.generate(&Prompt::Chat(messages.clone()), &options, |_| {
            first_token.get_or_insert_with(|| started.elapsed().as_secs_f64());
            true
        })?;
        let t = &generation.timings;
        rows.push(serde_json::json!({
            "prompt_tokens": t.prompt_tokens,
            "cached_tokens": t.cached_tokens,
            "ttft_seconds": first_token.unwrap_or(t.prefill_seconds),
            "decode_tokens_per_second": t.decode_tokens_per_second(),
        }));
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: generation.text,
        });
    }
    let ttft = |i: usize| rows[i]["ttft_seconds"].as_f64().unwrap_or(0.0);
    let ratio = ttft(rows.len() - 1) / ttft(0).max(1e-9);
    if args.json {
        let out = serde_json::json!({
            "backend": engine.backend(), "threads": threads, "reuse": !args.no_reuse,
            "gen_tokens": args.gen_tokens, "turns": rows, "last_over_first_ttft": ratio,
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} · {} threads · KV cache {}",
        engine.backend(),
        threads,
        if args.no_reuse {
            "dropped each turn"
        } else {
            "carried across turns"
        }
    );
    println!("turn  prompt  cached  ttft ms  decode tok/s");
    for (i, row) in rows.iter().enumerate() {
        println!(
            "{:>4}  {:>6}  {:>6}  {:>7.0}  {:>12.1}",
            i + 1,
            row["prompt_tokens"].as_u64().unwrap_or(0),
            row["cached_tokens"].as_u64().unwrap_or(0),
            ttft(i) * 1000.0,
            row["decode_tokens_per_second"].as_f64().unwrap_or(0.0)
        );
    }
    println!("last turn's time to first token / first turn's: {ratio:.2}x");
    Ok(())
}
