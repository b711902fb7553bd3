//! `lean-cli bench`: prefill and decode tokens per second over repetitions after a warm-up,
//! and peak memory — no tokenizer needed (synthetic token ids).
use crate::{init_threads, load_model, CliResult, Common};
use clap::Args;
use lean::cpu::{CpuSession, Logits};
use lean::sampling::argmax;
use std::io::Write;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    common: Common,
    /// Prompt tokens to prefill.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to decode after the prompt.
    #[arg(long, default_value_t = 64)]
    gen_tokens: usize,
    /// Measured repetitions.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Unmeasured warm-up repetitions.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Peak resident memory of this process (Linux), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: BenchArgs) -> CliResult {
    let threads = init_threads(args.common.threads)?;
    if args.reps == 0 || args.prompt_tokens == 0 {
        return Err("--reps and --prompt-tokens must be at least 1".into());
    }
    let (model, load_seconds) = load_model(&args.common)?;
    let ctx = args.prompt_tokens + args.gen_tokens;
    let mut session = CpuSession::new(&model, ctx);
    let vocab = model.config.vocab_size as u32;
    // Fixed pseudo-random ids: deterministic runs, no tokenizer needed.
    let prompt: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut logits = vec![0f32; vocab as usize];
    for rep in 0..args.warmup + args.reps {
        session.truncate(0);
        let t = Instant::now();
        session.forward(&model, &prompt, Logits::Last, |_, l| {
            logits.copy_from_slice(l)
        })?;
        let p = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..args.gen_tokens {
            let next = argmax(&logits);
            session.forward(&model, &[next], Logits::Last, |_, l| {
                logits.copy_from_slice(l)
            })?;
        }
        let d = t.elapsed().as_secs_f64();
        if rep >= args.warmup {
            prefill.push(args.prompt_tokens as f64 / p);
            if args.gen_tokens > 0 {
                decode.push(args.gen_tokens as f64 / d);
            }
        }
    }
    let prefill_tps = median(prefill);
    let decode_tps = if decode.is_empty() {
        0.0
    } else {
        median(decode)
    };
    let path = args
        .common
        .model
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let peak = peak_rss();
    if args.json {
        let out = serde_json::json!({
            "model": path, "isa": lean::quant::isa(), "threads": threads,
            "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "reps": args.reps,
            "load_seconds": load_seconds,
            "prefill_tokens_per_second": prefill_tps, "decode_tokens_per_second": decode_tps,
            "file_bytes": model.file_size(), "kv_cache_bytes": session.kv_bytes(), "peak_rss_bytes": peak,
        });
        let _ = writeln!(std::io::stdout(), "{out}");
    } else {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let _ = writeln!(
            std::io::stdout(),
            "{path}: {} · {} threads · pp{} {:.1} tok/s · tg{} {:.1} tok/s · file {:.0} MiB · kv {:.0} MiB · peak RSS {}",
            lean::quant::isa(),
            threads,
            args.prompt_tokens,
            prefill_tps,
            args.gen_tokens,
            decode_tps,
            mib(model.file_size() as u64),
            mib(session.kv_bytes() as u64),
            peak.map_or("n/a".into(), |b| format!("{:.0} MiB", mib(b)))
        );
    }
    Ok(())
}
