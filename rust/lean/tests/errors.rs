//! Bad input gets a clear error that names the problem, and the engine stays usable.
mod common;

use lean::{Engine, GenerateOptions, LeanError, Model, ModelBytes, Prompt, Tokenizer};

fn load(bytes: Vec<u8>) -> Result<Model, LeanError> {
    Model::load(ModelBytes::Owned(bytes))
}

/// The GGUF `bytes` with metadata `key` set to `value`, everything else as it was.
fn with_metadata(bytes: &[u8], key: &str, value: lean::gguf::Value) -> Vec<u8> {
    let gguf = lean::gguf::Gguf::parse(bytes).unwrap();
    let mut w = lean::gguf::GgufWriter::new();
    for (k, v) in gguf.metadata.iter() {
        w.add(k, if k == key { value.clone() } else { v.clone() });
    }
    for t in &gguf.tensors {
        w.add_tensor(&t.name, t.ty, &t.dims, gguf.tensor_data(bytes, t).to_vec());
    }
    w.finish().unwrap()
}

#[test]
fn corrupt_and_truncated_files_are_gguf_errors() {
    let err = load(b"not a gguf file at all".to_vec())
        .err()
        .expect("rejected");
    assert!(matches!(err, LeanError::Gguf(_)), "{err}");
    assert!(err.to_string().contains("magic"), "{err}");

    let Some(models) = common::models_dir() else {
        return;
    };
    let bytes = std::fs::read(models.join("smollm2-135m-instruct-q4_0.gguf")).unwrap();
    for cut in [10, 1000, 3_000_000, bytes.len() - 1] {
        let err = load(bytes[..cut].to_vec())
            .err()
            .expect("truncated file rejected");
        assert!(matches!(err, LeanError::Gguf(_)), "cut at {cut}: {err}");
    }
}

#[test]
fn missing_tensor_and_unknown_architecture_are_named() {
    let Some(models) = common::models_dir() else {
        return;
    };
    let bytes = std::fs::read(models.join("smollm2-135m-instruct-q4_0.gguf")).unwrap();
    let gguf = lean::gguf::Gguf::parse(&bytes).unwrap();
    // Rebuild the file without one tensor / with another architecture name.
    let rebuild = |skip: &str, arch: &str| {
        let mut w = lean::gguf::GgufWriter::new();
        for (k, v) in gguf.metadata.iter() {
            let v = if k == "general.architecture" {
                lean::gguf::Value::String(arch.into())
            } else {
                v.clone()
            };
            w.add(k, v);
        }
        for t in gguf.tensors.iter().filter(|t| t.name != skip) {
            w.add_tensor(&t.name, t.ty, &t.dims, gguf.tensor_data(&bytes, t).to_vec());
        }
        w.finish().unwrap()
    };
    let err = load(rebuild("blk.7.ffn_up.weight", "llama"))
        .err()
        .expect("missing tensor rejected");
    assert!(err.to_string().contains("blk.7.ffn_up.weight"), "{err}");
    let err = load(rebuild("", "mamba"))
        .err()
        .expect("unknown architecture rejected");
    assert!(err.to_string().contains("mamba"), "{err}");
}

/// A block count past the file's tensors is refused by name before anything is sized by it
/// (fuzzing found a file claiming ~4 billion blocks that made load abort on a 26 GB
/// allocation: `fuzz/corpus/model/block-count-past-tensors-*`).
#[test]
fn a_block_count_past_the_tensors_is_refused() {
    use lean::synthetic::{reduced_gguf, SyntheticShape, SyntheticWeights};
    for shape in [SyntheticShape::SmolLm2_360M, SyntheticShape::Qwen3_1_7B] {
        let bytes = reduced_gguf(shape, SyntheticWeights::Q8_0, 1, 7).unwrap();
        let gguf = lean::gguf::Gguf::parse(&bytes).unwrap();
        let arch = gguf.architecture().unwrap().to_string();
        for claimed in [4_000_000_000u32, gguf.tensors.len() as u32 + 1] {
            let key = format!("{arch}.block_count");
            let lying = with_metadata(&bytes, &key, lean::gguf::Value::U32(claimed));
            let err = load(lying).err().expect("rejected");
            let message = err.to_string();
            assert!(matches!(err, LeanError::Model(_)), "{message}");
            for part in ["block_count", &claimed.to_string()] {
                assert!(message.contains(part), "{message} should name {part}");
            }
        }
    }
}

#[test]
fn a_vocabulary_longer_than_the_embedding_is_refused() {
    let Some(models) = common::models_dir() else {
        return;
    };
    let bytes = std::fs::read(models.join("smollm2-135m-instruct-q4_0.gguf")).unwrap();
    let gguf = lean::gguf::Gguf::parse(&bytes).unwrap();
    let tokens = gguf.string_array("tokenizer.ggml.tokens").unwrap();
    let rows = gguf.tensor("token_embd.weight").unwrap().rows();
    assert_eq!(
        tokens.len(),
        rows,
        "the test model's vocabulary fills its embedding"
    );
    let mut longer: Vec<lean::gguf::Value> = tokens
        .iter()
        .map(|t| lean::gguf::Value::String((*t).into()))
        .collect();
    longer.push(lean::gguf::Value::String("<|one too many|>".into()));
    let longer = lean::gguf::Value::Array(longer);
    let err = load(with_metadata(&bytes, "tokenizer.ggml.tokens", longer))
        .err()
        .expect("rejected");
    let message = err.to_string();
    for part in [
        "token_embd.weight",
        &rows.to_string(),
        &(rows + 1).to_string(),
    ] {
        assert!(message.contains(part), "{message} should name {part}");
    }
}

#[test]
fn a_tokenizer_of_another_model_is_refused() {
    let Some(models) = common::models_dir() else {
        return;
    };
    let model = Model::load_file(&models.join("smollm2-135m-instruct-q4_0.gguf")).unwrap();
    let tokenizer = Tokenizer::from_path(&models.join("qwen2.5-coder-0.5b-instruct")).unwrap();
    let err = Engine::new(model, tokenizer, 256)
        .err()
        .expect("mismatched tokenizer rejected");
    assert!(matches!(err, LeanError::Tokenizer(_)), "{err}");
}

#[test]
fn oversized_prompt_is_refused_and_engine_stays_usable() {
    let Some(models) = common::models_dir() else {
        return;
    };
    let model = Model::load_file(&models.join("smollm2-135m-instruct-q4_0.gguf")).unwrap();
    let tokenizer = Tokenizer::from_path(&models.join("smollm2-135m-instruct")).unwrap();
    let mut engine = Engine::new(model, tokenizer, 64).unwrap();
    let options = GenerateOptions {
        max_tokens: 8,
        ..Default::default()
    };
    let long = Prompt::Raw("word ".repeat(200));
    let err = engine
        .generate(&long, &options, |_| true)
        .expect_err("too long");
    assert!(
        matches!(
            err,
            LeanError::PromptTooLong {
                context_length: 64,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("64"), "{err}");
    let err = engine
        .generate(&Prompt::Ids(vec![1, 999_999]), &options, |_| true)
        .expect_err("bad id");
    assert!(err.to_string().contains("999999"), "{err}");
    // still usable, and the context fills up cleanly instead of overflowing
    let g = engine
        .generate(
            &Prompt::Raw("The quick brown fox".into()),
            &GenerateOptions {
                max_tokens: 1000,
                stop_token_ids: Some(vec![]),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
    assert_eq!(g.finish_reason, lean::FinishReason::ContextFull);
    assert_eq!(g.prompt_ids.len() + g.token_ids.len(), 64 + 1);
}

#[test]
fn cancelling_stops_promptly_and_next_generation_is_exact() {
    let Some(models) = common::models_dir() else {
        return;
    };
    let model = Model::load_file(&models.join("smollm2-135m-instruct-q4_0.gguf")).unwrap();
    let tokenizer = Tokenizer::from_path(&models.join("smollm2-135m-instruct")).unwrap();
    let mut engine = Engine::new(model, tokenizer, 256).unwrap();
    let prompt = Prompt::Raw("Once upon a time".into());
    let options = GenerateOptions {
        max_tokens: 12,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    };
    let full = engine.generate(&prompt, &options, |_| true).unwrap();
    let mut n = 0;
    let cut = engine
        .generate(&prompt, &options, |_| {
            n += 1;
            n < 3
        })
        .unwrap();
    assert_eq!(cut.finish_reason, lean::FinishReason::Cancelled);
    assert_eq!(cut.token_ids[..], full.token_ids[..3]);
    let again = engine.generate(&prompt, &options, |_| true).unwrap();
    assert_eq!(again.token_ids, full.token_ids);
    assert_eq!(again.text, full.text);
}
