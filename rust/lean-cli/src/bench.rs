//! `lean-cli bench`: prefill and decode tokens per second over repetitions after a warm-up,
//! and peak memory — no tokenizer needed (synthetic token ids). `--synthetic SHAPE` benchmarks a
//! random-weight model of a real model's shape, built in memory (no model file to copy).
use crate::{init_threads, load_model, new_session, CliResult, Common};
use clap::Args;
use lean::model::Weights;
use lean::synthetic::{synthetic_gguf, SyntheticShape, SyntheticWeights};
use lean::{Model, ModelBytes};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

/// Seed of `--synthetic` weights: fixed, so that every run benchmarks the same model.
const SYNTHETIC_SEED: u64 = 0;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    common: Common,
    /// Instead of --model: a random-weight model of a real model's shape, built in memory
    /// (smollm2-360m, qwen2.5-0.5b, smollm2-1.7b, qwen2.5-3b, llama3.2-1b, qwen3-1.7b,
    /// gemma3-1b).
    #[arg(long, value_name = "SHAPE", conflicts_with = "model")]
    synthetic: Option<SyntheticShape>,
    /// Tensor types of the --synthetic model: q4_0 (Q6_K embedding where its rows allow, else
    /// Q8_0; the default) or q8_0.
    // conflicts_with as well: clap skips `requires` when the required arg conflicts with a
    // present one (clap-rs/clap#4520), so `--weights` with `--model` would pass silently.
    #[arg(long, requires = "synthetic", conflicts_with = "model")]
    weights: Option<SyntheticWeights>,
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

/// Bytes of weights a decoded token reads: every layer's matrices and the output head (the
/// embedding row it looks up is negligible).
fn weight_bytes_per_token(w: &Weights) -> usize {
    let layers: usize = w
        .layers
        .iter()
        .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
        .map(|m| m.len)
        .sum();
    layers + w.output.len
}

/// How many tensors of each type the file has, e.g. {"F32": 65, "Q4_0": 224, "Q8_0": 1}.
fn tensor_types(model: &Model) -> BTreeMap<&'static str, usize> {
    let mut types = BTreeMap::new();
    for t in &model.gguf.tensors {
        *types.entry(t.ty.name()).or_insert(0) += 1;
    }
    types
}

fn synthetic_weights(args: &BenchArgs) -> SyntheticWeights {
    args.weights.unwrap_or(SyntheticWeights::Q4_0)
}

/// The model to benchmark, the seconds it took to load (or build), and its name for the report.
fn open_model(args: &BenchArgs) -> CliResult<(Model, f64, String)> {
    match (args.synthetic, &args.common.model) {
        (Some(shape), _) => {
            let t = Instant::now();
            let weights = synthetic_weights(args);
            let bytes = synthetic_gguf(shape, weights, SYNTHETIC_SEED)?;
            let model = Model::load(ModelBytes::Owned(bytes))?;
            let name = format!("synthetic {shape} {weights}");
            Ok((model, t.elapsed().as_secs_f64(), name))
        }
        (None, Some(path)) => {
            let (model, seconds) = load_model(&args.common)?;
            Ok((model, seconds, path.display().to_string()))
        }
        (None, None) => {
            let shapes: Vec<&str> = SyntheticShape::ALL.iter().map(|s| s.name()).collect();
            Err(format!(
                "give --model FILE or --synthetic SHAPE (a random-weight model of one of: {})",
                shapes.join(", ")
            )
            .into())
        }
    }
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
    let (model, load_seconds, name) = open_model(&args)?;
    let ctx = args.prompt_tokens + args.gen_tokens;
    let mut session = new_session(&args.common.backend, &model, ctx)?;
    let vocab = model.config.vocab_size as u32;
    // Fixed pseudo-random ids: deterministic runs, no tokenizer needed.
    let prompt: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    // Greedy decoding, as the engine runs it: a GPU backend reads back only the token id.
    for rep in 0..args.warmup + args.reps {
        session.truncate(0);
        let t = Instant::now();
        let mut next = session.forward_argmax(&model, &prompt)?;
        let p = t.elapsed().as_secs_f64();
        let t = Instant::now();
        // As the engine's greedy loop runs it: passes queued before the previous id is read,
        // none past the last token.
        for i in 0..args.gen_tokens {
            next = session.decode_argmax(&model, next, args.gen_tokens - i - 1)?;
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
    let peak = peak_rss();
    let weight_bytes = weight_bytes_per_token(&model.weights);
    // The weight bandwidth decoding achieves: what bounds it on most hardware.
    let decode_gb_per_second = weight_bytes as f64 * decode_tps / 1e9;
    if args.json {
        let synthetic = args.synthetic.map(|shape| {
            serde_json::json!({
                "shape": shape.name(), "weights": synthetic_weights(&args).name(), "seed": SYNTHETIC_SEED,
            })
        });
        let out = serde_json::json!({
            "model": name, "synthetic": synthetic, "description": model.describe(),
            "tensor_types": tensor_types(&model),
            "backend": session.describe(), "isa": lean::quant::isa(), "threads": threads,
            "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "reps": args.reps,
            "load_seconds": load_seconds,
            "prefill_tokens_per_second": prefill_tps, "decode_tokens_per_second": decode_tps,
            "file_bytes": model.file_size(), "weight_bytes_per_token": weight_bytes,
            "decode_weight_gb_per_second": decode_gb_per_second,
            "kv_cache_bytes": session.kv_bytes(), "peak_rss_bytes": peak,
        });
        let _ = writeln!(std::io::stdout(), "{out}");
    } else {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let _ = writeln!(
            std::io::stdout(),
            "{name} ({}): {} · pp{} {:.1} tok/s · tg{} {:.1} tok/s ({:.1} GB/s of weights) · file {:.0} MiB · weights/token {:.0} MiB · kv {:.0} MiB · peak RSS {}",
            model.describe(),
            session.describe(),
            args.prompt_tokens,
            prefill_tps,
            args.gen_tokens,
            decode_tps,
            decode_gb_per_second,
            mib(model.file_size() as u64),
            mib(weight_bytes as u64),
            mib(session.kv_bytes() as u64),
            peak.map_or("n/a".into(), |b| format!("{:.0} MiB", mib(b)))
        );
    }
    Ok(())
}
