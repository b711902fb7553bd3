//! `lean-cli inflate`: a model grown to a bigger model's tensor shapes, computing the same
//! function (`lean::inflate`). It benchmarks speculative decoding at the bigger model's cost per
//! step with the small model's guesses, where only small models can be brought (a rented GPU).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use lean::inflate::inflated_gguf;
use lean::synthetic::SyntheticShape;
use lean::Model;

use crate::CliResult;

#[derive(Args)]
pub struct InflateArgs {
    /// The GGUF model to grow (llama, qwen2 or qwen3 blocks).
    #[arg(long, short = 'm')]
    model: PathBuf,
    /// The shape to grow it to: a `bench --synthetic` shape, e.g. qwen2.5-3b.
    #[arg(long)]
    shape: SyntheticShape,
    /// Where to write the grown GGUF.
    #[arg(long, short = 'o')]
    output: PathBuf,
}

pub fn run(args: InflateArgs) -> CliResult {
    if !args.model.is_file() {
        return Err(format!("{}: no such model file", args.model.display()).into());
    }
    let t = Instant::now();
    let model = Model::load_file(&args.model)?;
    let bytes = inflated_gguf(&model, args.shape)?;
    std::fs::write(&args.output, &bytes)
        .map_err(|e| format!("{}: cannot write: {e}", args.output.display()))?;
    let c = &model.config;
    eprintln!(
        "{}: {} layers × {} wide ({:.0} MB) grown to {}'s shape ({:.0} MB) in {:.1} s → {}",
        args.model.display(),
        c.n_layers,
        c.n_embd,
        model.file_size() as f64 / 1e6,
        args.shape,
        bytes.len() as f64 / 1e6,
        t.elapsed().as_secs_f64(),
        args.output.display()
    );
    Ok(())
}
