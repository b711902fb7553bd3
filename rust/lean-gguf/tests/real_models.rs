//! The real model files in models/ parse, agree with gguf-py on everything, and parse fast.
#![cfg(not(target_family = "wasm"))]

mod common;

use common::{map_file, model_path};
use lean_gguf::{Gguf, GgufError, TensorType, Value};
use std::time::Instant;

/// Facts checked per model; `digest` is `tests/gguf_py_digest.py FILE` (gguf-py 0.19).
struct Expected {
    file: &'static str,
    gguf_py_digest: u64,
    architecture: &'static str,
    block_count: u32,
    tensors: usize,
    data_offset: usize,
    token_embd: (TensorType, [u64; 2], usize),
    output: Option<TensorType>,
    n_tokens: usize,
    first_token: &'static str,
    output_norm_head: [u32; 3],
}

const SMOLLM2_Q4_1: Expected = Expected {
    file: "smollm2-135m-instruct-q4_1.gguf",
    gguf_py_digest: 0xd8724ea1f5d62ff7,
    architecture: "llama",
    block_count: 30,
    tensors: 272,
    data_offset: 1785664,
    token_embd: (TensorType::Q8_0, [576, 49152], 1785664),
    output: None, // tied to token_embd
    n_tokens: 49152,
    first_token: "<|endoftext|>",
    output_norm_head: [0x3fe10000, 0x3fe90000, 0x3fe40000],
};

const QWEN_Q4_K_M: Expected = Expected {
    file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    gguf_py_digest: 0x97e0e1c231cacc55,
    architecture: "qwen2",
    block_count: 24,
    tensors: 291,
    data_offset: 5947776,
    token_embd: (TensorType::Q5_0, [896, 151936], 150590848),
    output: Some(TensorType::Q8_0),
    n_tokens: 151936,
    first_token: "!",
    output_norm_head: [0x40e20000, 0x40e40000, 0x40e00000],
};

fn check_model(expected: &Expected) {
    let Some(path) = model_path(expected.file) else {
        return;
    };
    let bytes = map_file(&path);
    let gguf = Gguf::parse(&bytes).unwrap();

    assert_eq!(gguf.version, 3);
    assert_eq!(gguf.alignment, 32);
    assert_eq!(gguf.data_offset, expected.data_offset);
    let arch = gguf.architecture().unwrap();
    assert_eq!(arch, expected.architecture);
    assert_eq!(
        gguf.u32(&format!("{arch}.block_count")).unwrap(),
        expected.block_count
    );
    assert_eq!(gguf.tensors.len(), expected.tensors);

    let embd = gguf.require_tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ty, embd.dims.as_slice(), embd.offset),
        (
            expected.token_embd.0,
            &expected.token_embd.1[..],
            expected.token_embd.2
        )
    );
    assert_eq!(
        (embd.row_len(), embd.rows()),
        (
            expected.token_embd.1[0] as usize,
            expected.token_embd.1[1] as usize
        )
    );
    assert_eq!(
        embd.size,
        embd.rows() * embd.ty.row_bytes(embd.row_len()).unwrap()
    );
    assert_eq!(gguf.tensor("output.weight").map(|t| t.ty), expected.output);

    let tokens = gguf.string_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(
        (tokens.len(), tokens[0]),
        (expected.n_tokens, expected.first_token)
    );

    let norm = gguf.require_tensor("output_norm.weight").unwrap();
    let head: Vec<u32> = gguf.tensor_data(&bytes, norm)[..12]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(head, expected.output_norm_head);

    let digest = fnv1a64(&canonical(&gguf));
    if digest != expected.gguf_py_digest {
        let dump = std::env::temp_dir().join(format!("{}.lean-gguf.canonical", expected.file));
        std::fs::write(&dump, canonical(&gguf)).unwrap();
        panic!(
            "{}: digest {digest:016x} differs from gguf-py's {:016x}; compare {} with \
             `python tests/gguf_py_digest.py --dump {}`",
            expected.file,
            expected.gguf_py_digest,
            dump.display(),
            path.display()
        );
    }
}

#[test]
fn smollm2_q4_1() {
    check_model(&SMOLLM2_Q4_1);
}

#[test]
fn qwen2_5_coder_q4_k_m() {
    check_model(&QWEN_Q4_K_M);
}

#[test]
fn the_other_models_agree_with_gguf_py() {
    for (file, gguf_py_digest) in [
        ("smollm2-135m-instruct-q4_0.gguf", 0xbeb0c74ee3f1495c),
        ("smollm2-135m-instruct-q8_0.gguf", 0x66f8957d27894023),
        ("qwen2.5-coder-0.5b-instruct-q4_0.gguf", 0x78ea7ec323d0d042),
    ] {
        let Some(path) = model_path(file) else { return };
        let gguf = Gguf::parse(&map_file(&path)).unwrap();
        assert_eq!(fnv1a64(&canonical(&gguf)), gguf_py_digest, "{file}");
    }
}

/// The 490 MB qwen file has two ~150k-string arrays; parsing must stay in milliseconds.
#[test]
fn parsing_the_largest_model_is_fast() {
    let Some(path) = model_path(QWEN_Q4_K_M.file) else {
        return;
    };
    let bytes = map_file(&path);
    Gguf::parse(&bytes).unwrap(); // page the header in
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let gguf = Gguf::parse(&bytes).unwrap();
        best = best.min(start.elapsed().as_secs_f64());
        assert_eq!(gguf.tensors.len(), QWEN_Q4_K_M.tensors);
    }
    eprintln!(
        "parsed {} ({} bytes) in {:.1} ms (best of 5)",
        QWEN_Q4_K_M.file,
        bytes.len(),
        best * 1e3
    );
    // Generous, for a loaded shared machine; a quadratic slip would take seconds.
    assert!(best < 1.0, "parse took {best:.3} s");
}

#[test]
fn streaming_a_real_header_from_growing_prefixes() {
    let Some(path) = model_path(QWEN_Q4_K_M.file) else {
        return;
    };
    let bytes = map_file(&path);
    let file_len = bytes.len() as u64;
    let mut have = 64 * 1024;
    let streamed = loop {
        match Gguf::parse_header(&bytes[..have], file_len) {
            Ok(gguf) => break gguf,
            Err(GgufError::NeedMoreBytes { needed, .. }) => have = (needed as usize).max(2 * have),
            Err(e) => panic!("{e}"),
        }
    };
    assert!(have >= streamed.data_offset - 32 && have < bytes.len());
    assert_eq!(streamed, Gguf::parse(&bytes).unwrap());
}

/// The canonical form gguf_py_digest.py produces (see there).
fn canonical(gguf: &Gguf) -> Vec<u8> {
    let mut out = format!(
        "version {}\nalignment {}\ndata_offset {}\n",
        gguf.version, gguf.alignment, gguf.data_offset
    )
    .into_bytes();
    for (key, value) in gguf.metadata.iter() {
        out.extend_from_slice(format!("kv {key} ").as_bytes());
        encode(&mut out, value);
        out.push(b'\n');
    }
    for t in &gguf.tensors {
        let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        let line = format!(
            "tensor {} {} {} {} {}\n",
            t.name,
            t.ty.ggml_id(),
            dims.join(","),
            t.offset,
            t.size
        );
        out.extend_from_slice(line.as_bytes());
    }
    out
}

fn encode(out: &mut Vec<u8>, value: &Value) {
    let id = value.value_type().id();
    let text = match value {
        Value::F32(v) => format!("{id}:{:08x}", v.to_bits()),
        Value::F64(v) => format!("{id}:{:016x}", v.to_bits()),
        Value::Bool(v) => format!("{id}:{}", u8::from(*v)),
        Value::String(s) => {
            out.extend_from_slice(format!("{id}:{}:", s.len()).as_bytes());
            out.extend_from_slice(s.as_bytes());
            return;
        }
        Value::Array(items) => {
            out.extend_from_slice(format!("{id}:{}[", items.len()).as_bytes());
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                encode(out, item);
            }
            out.push(b']');
            return;
        }
        integer => format!("{id}:{}", integer.as_i128().unwrap()),
    };
    out.extend_from_slice(text.as_bytes());
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}
