//! Shared by the integration tests: a byte-level GGUF encoder that can write malformed files,
//! a deterministic PRNG, a sample file that exercises every feature, and model lookup.
#![allow(dead_code)] // each test binary uses a different subset

use lean_gguf::{GgufWriter, TensorType, Value};
use std::path::PathBuf;

/// Writes GGUF fields one by one, with no validation, so tests can build any broken file.
pub struct RawGguf {
    pub bytes: Vec<u8>,
}

impl RawGguf {
    /// Magic, version and the two counts.
    pub fn new(version: u32, tensor_count: u64, kv_count: u64) -> Self {
        let mut raw = RawGguf {
            bytes: b"GGUF".to_vec(),
        };
        raw.u32(version).u64(tensor_count).u64(kv_count);
        raw
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn string(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64);
        self.bytes.extend_from_slice(s);
        self
    }

    /// A metadata key and value type id; the caller appends the value.
    pub fn kv(&mut self, key: &str, type_id: u32) -> &mut Self {
        self.string(key.as_bytes()).u32(type_id)
    }

    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv(key, 4).u32(v)
    }

    pub fn tensor_info(
        &mut self,
        name: &str,
        dims: &[u64],
        type_id: u32,
        offset: u64,
    ) -> &mut Self {
        self.string(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }

    pub fn pad_to(&mut self, alignment: usize) -> &mut Self {
        let len = self.bytes.len().next_multiple_of(alignment);
        self.bytes.resize(len, 0);
        self
    }

    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.bytes.resize(self.bytes.len() + n, 0);
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }
}

/// SplitMix64: deterministic, good enough to pick mutations and fill test tensors.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Bytes of a tensor of `ty` with `dims`.
pub fn tensor_bytes(ty: TensorType, dims: &[u64]) -> usize {
    let rows: u64 = dims[1..].iter().product();
    ty.row_bytes(dims[0] as usize).unwrap() * rows as usize
}

/// A small valid file using every metadata value type, nested and empty arrays, and tensors
/// of three types (one per block family), for the truncation and mutation tests.
pub fn sample_file() -> Vec<u8> {
    let mut rng = Rng::new(7);
    let mut writer = GgufWriter::new();
    writer
        .add("general.architecture", "llama")
        .add("u8", 200u8)
        .add("i8", -100i8)
        .add("u16", 60000u16)
        .add("i16", -30000i16)
        .add("u32", 4_000_000_000u32)
        .add("i32", -2_000_000_000i32)
        .add("u64", u64::MAX)
        .add("i64", i64::MIN)
        .add("f32", 1.5f32)
        .add("f64", -2.25f64)
        .add("bool", true)
        .add("string", "héllo")
        .add("tokens", ["a", "bc", "", "日本"])
        .add("scores", [0.5f32, -1.0])
        .add(
            "nested",
            Value::Array(vec![
                Value::from([1u8, 2]),
                Value::from(["x"]),
                Value::Array(vec![]),
            ]),
        )
        .add("empty", Value::Array(vec![]));
    for (name, ty, dims) in [
        ("norm.weight", TensorType::F32, vec![8u64]),
        ("embd.weight", TensorType::Q8_0, vec![32, 3]),
        ("ffn.weight", TensorType::Q4_K, vec![256, 2, 1]),
    ] {
        let data = rng.bytes(tensor_bytes(ty, &dims));
        writer.add_tensor(name, ty, &dims, data);
    }
    writer.finish().expect("sample file is valid")
}

/// A real model file, or `None` (after saying why) when the models are not present, unless
/// env `CI` is set: then a missing model fails the test.
pub fn model_path(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")));
    let path = dir.join(file);
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!("model file {} is missing (CI is set)", path.display());
    }
    eprintln!(
        "skipping: model file {} not found (set LEAN_MODELS)",
        path.display()
    );
    None
}

/// Maps a model file read-only (the library takes bytes; mapping avoids reading 490 MB).
#[cfg(not(target_family = "wasm"))]
pub fn map_file(path: &std::path::Path) -> memmap2::Mmap {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: test models are not modified while the tests run.
    unsafe { memmap2::Mmap::map(&file) }.unwrap()
}
