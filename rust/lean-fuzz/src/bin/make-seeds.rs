//! Writes the fuzz targets' seed inputs into a corpus directory (default fuzz/corpus):
//! `cargo run -p lean-fuzz --bin make-seeds [DIR]`. Files already there (seeds and what fuzzing
//! found and was kept) stay.
fn main() -> std::io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus").into());
    for (target, name, bytes) in lean_fuzz::seeds::all() {
        let dir = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(&name), bytes)?;
    }
    println!("seeds written to {dir}");
    Ok(())
}
