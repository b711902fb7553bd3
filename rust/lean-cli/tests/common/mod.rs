//! What the lean-cli integration tests share.
use std::path::PathBuf;

/// The test models directory ($LEAN_MODELS, default the repository's models/) when it holds
/// SmolLM2-135M Q4_0; None skips the test, except under CI, where missing models fail it.
pub fn models() -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")));
    if dir.join("smollm2-135m-instruct-q4_0.gguf").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "test models missing in {}",
        dir.display()
    );
    eprintln!("skipping: test models missing in {}", dir.display());
    None
}
