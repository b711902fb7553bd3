//! The scalar dequantizers against gguf-py's `gguf.quants.dequantize`, bit for bit.
//! Vectors come from scripts/gen_quant_vectors.py (random, edge, gguf-py-quantized and real
//! model blocks of every tensor type).

use lean_quant::{scalar, TensorType};
use serde_json::Value;

const VECTORS_JSON: &str = include_str!("data/quant_vectors.json");

struct Vector {
    ty: TensorType,
    source: String,
    n_blocks: usize,
    bytes: Vec<u8>,
    expected: Vec<f32>,
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd-length hex string");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn load_vectors() -> Vec<Vector> {
    let root: Value = serde_json::from_str(VECTORS_JSON).expect("quant_vectors.json parses");
    let vectors = root["vectors"].as_array().expect("a vectors array");
    vectors
        .iter()
        .map(|v| {
            let ty: TensorType = v["type"]
                .as_str()
                .expect("type")
                .parse()
                .expect("known type");
            let expected = hex_bytes(v["expected"].as_str().expect("expected"))
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Vector {
                ty,
                source: v["source"].as_str().expect("source").to_string(),
                n_blocks: v["blocks"].as_u64().expect("blocks") as usize,
                bytes: hex_bytes(v["bytes"].as_str().expect("bytes")),
                expected,
            }
        })
        .collect()
}

fn dequantized(v: &Vector) -> Vec<f32> {
    let mut out = vec![f32::NAN; v.n_blocks * v.ty.block_len()];
    scalar::dequantize(v.ty, &v.bytes, &mut out);
    out
}

#[test]
fn vectors_are_well_formed_and_cover_every_type() {
    let vectors = load_vectors();
    for v in &vectors {
        assert_eq!(
            v.bytes.len(),
            v.n_blocks * v.ty.block_bytes(),
            "{} {}: byte count",
            v.ty,
            v.source
        );
        assert_eq!(
            v.expected.len(),
            v.n_blocks * v.ty.block_len(),
            "{} {}: element count",
            v.ty,
            v.source
        );
    }
    for ty in TensorType::ALL {
        let sources: Vec<&str> = vectors
            .iter()
            .filter(|v| v.ty == ty)
            .map(|v| v.source.as_str())
            .collect();
        assert!(sources.contains(&"random"), "{ty}: no random vector");
        if ty.is_quantized() {
            assert!(
                sources.iter().any(|s| s.starts_with("edge:")),
                "{ty}: no edge vectors"
            );
        }
    }
    // The types the test models use must be checked on real blocks too.
    for ty in [
        TensorType::F32,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q8_0,
        TensorType::Q4_K,
        TensorType::Q6_K,
    ] {
        assert!(
            vectors
                .iter()
                .any(|v| v.ty == ty && v.source.starts_with("real:")),
            "{ty}: no real-model vector"
        );
    }
}

#[test]
fn every_vector_is_bit_exact_with_gguf_py() {
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for v in load_vectors() {
        let got = dequantized(&v);
        let block_len = v.ty.block_len();
        let mismatch = got
            .iter()
            .zip(&v.expected)
            .position(|(g, w)| g.to_bits() != w.to_bits());
        if let Some(i) = mismatch {
            failures.push(format!(
                "{} [{}]: block {} element {}: got {:e} ({:#010x}), want {:e} ({:#010x})",
                v.ty,
                v.source,
                i / block_len,
                i % block_len,
                got[i],
                got[i].to_bits(),
                v.expected[i],
                v.expected[i].to_bits()
            ));
        }
        checked += got.len();
    }
    assert!(
        failures.is_empty(),
        "{} vector(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 60_000, "only {checked} elements checked");
}

/// `x` values in [-1, 1) from a fixed LCG, so the dot test needs no RNG crate.
fn pseudo_random_x(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn dot_is_the_plain_f32_sum_and_close_to_the_f64_dot() {
    let mut tested = 0;
    for (k, v) in load_vectors().iter().enumerate() {
        let weights = dequantized(v);
        // Vectors of infinities and f32::MAX are for dequantization, not for summing.
        if weights.iter().any(|w| !w.is_finite() || w.abs() > 1e30) {
            continue;
        }
        let x = pseudo_random_x(weights.len(), k as u64 + 1);
        let got = scalar::dot(v.ty, &v.bytes, &x);

        let mut plain = 0f32;
        for (w, xi) in weights.iter().zip(&x) {
            plain += w * xi;
        }
        assert_eq!(
            got.to_bits(),
            plain.to_bits(),
            "{} [{}]: dot {got} != in-order f32 sum {plain}",
            v.ty,
            v.source
        );

        let exact: f64 = weights
            .iter()
            .zip(&x)
            .map(|(&w, &xi)| w as f64 * xi as f64)
            .sum();
        let magnitude: f64 = weights
            .iter()
            .zip(&x)
            .map(|(&w, &xi)| (w as f64 * xi as f64).abs())
            .sum();
        // Worst-case error of n rounded products summed in order: about n * 2^-24 * sum|w x|.
        let n = weights.len() as f64;
        let bound = n * f32::EPSILON as f64 / 2.0 * magnitude * 1.01;
        assert!(
            (got as f64 - exact).abs() <= bound,
            "{} [{}]: dot {got} vs f64 {exact} (bound {bound:e})",
            v.ty,
            v.source
        );
        tested += 1;
    }
    assert!(tested > 40, "only {tested} vectors dotted");
}

#[test]
fn q4_0_layout_by_hand() {
    // d = 1.0; byte i holds element i (low nibble) and element 16 + i (high nibble).
    let mut block = vec![0x00, 0x3C];
    block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
    let mut out = [0f32; 32];
    scalar::dequantize_q4_0(&block, &mut out);
    for i in 0..16 {
        assert_eq!(out[i], i as f32 - 8.0, "element {i}");
        assert_eq!(out[16 + i], 7.0 - i as f32, "element {}", 16 + i);
    }
}

#[test]
fn q8_0_layout_by_hand() {
    // d = -0.5 (f16 0xB800); quants are signed bytes.
    let mut block = vec![0x00, 0xB8];
    block.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let mut out = [0f32; 32];
    scalar::dequantize_q8_0(&block, &mut out);
    for (i, &o) in out.iter().enumerate() {
        assert_eq!(o, (i as f32 - 16.0) * -0.5, "element {i}");
    }
}

#[test]
#[should_panic(expected = "Q4_K")]
fn dequantize_rejects_a_partial_block() {
    let mut out = vec![0f32; 256];
    scalar::dequantize(TensorType::Q4_K, &[0u8; 143], &mut out);
}

#[test]
#[should_panic(expected = "Q8_0")]
fn dot_rejects_mismatched_lengths() {
    scalar::dot(TensorType::Q8_0, &[0u8; 34], &[0f32; 64]);
}
