//! Times the constraint side of structured output for BENCHMARKS.md: building the vocabulary
//! (token bytes + trie) once, then per schema the compile and the masks of a walk through a
//! valid output.
//!
//! cargo run --release -p lean-constraint --example compile_time -- TOKENIZER_DIR SCHEMA.json...
//! (a schema file is a schema, or the test corpus's {"prompt", "schema"}).
use lean_constraint::{Constraint, ConstraintSpec, Vocabulary};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, schemas) = args.split_first().expect("TOKENIZER_DIR SCHEMA.json...");
    let tokenizer = lean_tokenizer::Tokenizer::from_path(std::path::Path::new(dir)).unwrap();
    let t = Instant::now();
    let vocab = Arc::new(
        Vocabulary::new(
            &tokenizer,
            tokenizer.vocab_size(),
            &tokenizer.eos_token_ids(),
        )
        .unwrap(),
    );
    println!(
        "vocabulary ({} tokens): {:.1} ms",
        vocab.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    for path in schemas {
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let schema = value.get("schema").cloned().unwrap_or(value);
        let spec = ConstraintSpec::JsonSchema(schema);
        let t = Instant::now();
        let mut c = Constraint::new(&vocab, &spec).unwrap();
        let compile = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        c.mask().unwrap();
        let first_mask = t.elapsed().as_secs_f64() * 1e3;
        println!("{path}: compile {compile:.2} ms, first mask {first_mask:.2} ms");
    }
}
