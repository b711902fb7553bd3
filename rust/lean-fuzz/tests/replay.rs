//! Replays every committed corpus file (fuzz/corpus/<target>/: the seeds and the inputs fuzzing
//! kept) and the freshly built seeds through their targets: none may panic. A crash that
//! fuzzing finds is fixed and its input added to the corpus, so it stays fixed.
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus")).join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).expect("a corpus file");
            (path, bytes)
        })
        .collect()
}

#[test]
fn every_corpus_file_runs_through_its_target() {
    for (target, body) in lean_fuzz::TARGETS {
        let files = corpus(target);
        assert!(!files.is_empty(), "fuzz/corpus/{target} is empty");
        for (path, bytes) in files {
            eprintln!("{target}: {}", path.display());
            body(&bytes);
        }
    }
}

#[test]
fn seeds_are_valid_inputs() {
    // The model seeds load and run a forward pass; their tokenizers build from the metadata.
    for (target, name, bytes) in lean_fuzz::seeds::all() {
        if target == "model" {
            let model = lean::Model::load(lean::ModelBytes::Owned(bytes.clone()))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            lean::Tokenizer::from_gguf(&model.gguf, None, None)
                .unwrap_or_else(|e| panic!("{name}: tokenizer: {e}"));
        }
        let body = lean_fuzz::TARGETS
            .iter()
            .find(|(t, _)| *t == target)
            .unwrap()
            .1;
        body(&bytes);
    }
    let json = lean_fuzz::seeds::tokenizer_json();
    lean::Tokenizer::from_bytes(json.as_bytes(), None, Some(lean_fuzz::seeds::CHATML))
        .expect("the seed tokenizer.json loads");
}
