//! Times `Tokenizer::from_bytes` (the work a wasm caller pays too: no file reading counted).
//!
//!   cargo run --release -p lean-tokenizer --example load_time -- models/qwen2.5-coder-0.5b-instruct

use std::time::Instant;

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: load_time TOKENIZER_DIR");
        std::process::exit(2);
    };
    let read = |name: &str| std::fs::read(dir.join(name)).ok();
    let Some(json) = read("tokenizer.json") else {
        eprintln!("no tokenizer.json in {}", dir.display());
        std::process::exit(1);
    };
    let config = read("tokenizer_config.json");
    let template = read("chat_template.jinja").and_then(|b| String::from_utf8(b).ok());
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let tok =
            lean_tokenizer::Tokenizer::from_bytes(&json, config.as_deref(), template.as_deref())
                .unwrap_or_else(|e| panic!("{e}"));
        best = best.min(start.elapsed().as_secs_f64());
        std::hint::black_box(tok);
    }
    println!(
        "from_bytes({} bytes of tokenizer.json): best of 5 {:.1} ms",
        json.len(),
        best * 1e3
    );
}
