//! Time per input of each fuzz target on its committed corpus, without sanitizers: where a
//! target spends its time decides how many executions a long fuzz run reaches (issue 19's goal
//! is 10 M a target). `cargo run --release -p lean-fuzz --bin target-costs [ROUNDS]`
use std::time::Instant;

/// A fuzz target's body.
type Target = fn(&[u8]);

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let targets: [(&str, Target); 5] = [
        ("gguf", lean_fuzz::gguf),
        ("model", lean_fuzz::model),
        ("tokenizer_gguf", lean_fuzz::tokenizer_gguf),
        ("tokenizer_json", lean_fuzz::tokenizer_json),
        ("chat_template", lean_fuzz::chat_template),
    ];
    for (name, target) in targets {
        let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus.join(name))
            .expect("the committed corpus")
            .map(|e| {
                let path = e.expect("a corpus entry").path();
                let bytes = std::fs::read(&path).expect("a corpus file");
                (
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    bytes,
                )
            })
            .collect();
        inputs.sort();
        for (file, bytes) in &inputs {
            target(bytes); // warm (one-time initialisation)
            let start = Instant::now();
            for _ in 0..rounds {
                target(bytes);
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / rounds as f64;
            println!("{name:15} {file:30} {us:10.1} µs");
        }
    }
}
