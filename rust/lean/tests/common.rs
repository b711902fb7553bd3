//! Where the test models and fixtures live. Tests that need the models fail under CI (env CI set)
//! when they are missing, and are skipped with a message elsewhere.
#![allow(dead_code)]
use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

pub fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"));
    if dir.join("smollm2-135m-instruct-q4_1.gguf").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "test models missing in {} (run scripts/fetch-test-models.sh)",
            dir.display()
        );
    }
    eprintln!(
        "skipping: test models missing in {} (run scripts/fetch-test-models.sh)",
        dir.display()
    );
    None
}

/// The tokenizer directory for a test model file.
pub fn tokenizer_dir_for(models: &std::path::Path, gguf: &str) -> PathBuf {
    if gguf.starts_with("smollm2-135m-instruct") {
        models.join("smollm2-135m-instruct")
    } else {
        models.join("qwen2.5-coder-0.5b-instruct")
    }
}

pub const MODEL_FILES: [&str; 5] = [
    "smollm2-135m-instruct-q4_1.gguf",
    "smollm2-135m-instruct-q4_0.gguf",
    "smollm2-135m-instruct-q8_0.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
];
