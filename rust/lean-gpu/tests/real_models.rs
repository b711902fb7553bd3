//! The matvec and matmul kernels on real GGUF weights (real f16 scales, every type the test
//! models use) against an f64 dot of lean-quant's scalar dequantization, within the same
//! tolerance as the random tests. Reads only the header and the first rows of each tensor.
//!
//! Models come from env LEAN_MODELS (default: the workspace's models/); when a file is missing
//! the test fails under env CI and is skipped otherwise. Without a GPU adapter it is skipped
//! (or fails under CI) as well.

use lean_gguf::{Gguf, GgufError, TensorType};
use lean_gpu::{wgpu, GpuContext, GpuMatrix, Kernels, Plan};
use lean_quant::scalar;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

const TOLERANCE: f64 = 1e-5;
/// Rows taken from each tensor: enough for several workgroups and tiles, quick on lavapipe.
const ROWS: usize = 67;
const TOKENS: usize = 3;

fn model_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")));
    let path = dir.join(name);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI needs the test model {}",
        path.display()
    );
    eprintln!("skipping: {} not found", path.display());
    None
}

fn read_header(file: &mut std::fs::File) -> Gguf {
    let len = file.metadata().unwrap().len();
    let mut prefix = vec![0u8; 1 << 20];
    loop {
        file.seek(SeekFrom::Start(0)).unwrap();
        let n = (prefix.len() as u64).min(len) as usize;
        file.read_exact(&mut prefix[..n]).unwrap();
        match Gguf::parse_header(&prefix[..n], len) {
            Ok(gguf) => return gguf,
            Err(GgufError::NeedMoreBytes { needed, .. }) => prefix.resize(needed as usize * 2, 0),
            Err(e) => panic!("bad test model: {e}"),
        }
    }
}

fn splitmix(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// For every 2-D tensor type of the model (first tensor of each), the first rows through
/// matvec and matmul.
fn check_model(ctx: &GpuContext, kernels: &Kernels, name: &str) -> Vec<TensorType> {
    let Some(path) = model_path(name) else {
        return Vec::new();
    };
    let mut file = std::fs::File::open(&path).unwrap();
    let gguf = read_header(&mut file);
    let mut seen = Vec::new();
    let mut seed = 1u64;
    for t in gguf.tensors.iter().filter(|t| t.dims.len() == 2) {
        if seen.contains(&t.ty) || !lean_gpu::matvec_supports(t.ty) {
            continue;
        }
        seen.push(t.ty);
        let (rows, cols) = (ROWS.min(t.rows()), t.row_len());
        let mut w = vec![0u8; rows * t.row_bytes()];
        file.seek(SeekFrom::Start(t.offset as u64)).unwrap();
        file.read_exact(&mut w).unwrap();
        let x: Vec<f32> = (0..TOKENS * cols).map(|_| splitmix(&mut seed)).collect();
        let m = GpuMatrix::upload(ctx, t.ty, rows, cols, &w).unwrap();
        let xb = ctx.upload_f32("x", &x);
        let y_matvec = ctx.storage_f32("y", rows);
        let y_matmul = ctx.storage_f32("y", TOKENS * rows);
        let mut plan = Plan::new();
        kernels.matvec(ctx, &mut plan, &m, &xb, &y_matvec).unwrap();
        kernels
            .matmul(ctx, &mut plan, &m, &xb, &y_matmul, TOKENS)
            .unwrap();
        plan.submit(ctx);
        let (f1, f2) = (
            ctx.read_f32(&y_matvec, rows),
            ctx.read_f32(&y_matmul, TOKENS * rows),
        );
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap();
        let (got_matvec, got_matmul) = (
            pollster::block_on(f1).unwrap(),
            pollster::block_on(f2).unwrap(),
        );

        let mut weights = vec![0f32; cols];
        for r in 0..rows {
            scalar::dequantize(
                t.ty,
                &w[r * t.row_bytes()..(r + 1) * t.row_bytes()],
                &mut weights,
            );
            for tok in 0..TOKENS {
                let xs = &x[tok * cols..(tok + 1) * cols];
                let (want, abs) =
                    weights
                        .iter()
                        .zip(xs)
                        .fold((0f64, 0f64), |(s, a), (&wv, &xv)| {
                            let p = wv as f64 * xv as f64;
                            (s + p, a + p.abs())
                        });
                let got = got_matmul[tok * rows + r] as f64;
                assert!(
                    (got - want).abs() <= TOLERANCE * abs,
                    "{name} {} matmul token {tok} row {r}: {got} vs {want}",
                    t.name
                );
                if tok == 0 {
                    let got = got_matvec[r] as f64;
                    assert!(
                        (got - want).abs() <= TOLERANCE * abs,
                        "{name} {} matvec row {r}: {got} vs {want}",
                        t.name
                    );
                }
            }
        }
    }
    seen
}

#[test]
fn kernels_match_real_weights() {
    let ctx = match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => ctx,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a GPU adapter: {e}"
            );
            eprintln!("skipping GPU tests: {e}");
            return;
        }
    };
    let kernels = pollster::block_on(Kernels::new(&ctx)).unwrap();
    let mut covered = Vec::new();
    for name in [
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "smollm2-135m-instruct-q4_1.gguf",
        "smollm2-135m-instruct-q4_0.gguf",
    ] {
        covered.extend(check_model(&ctx, &kernels, name));
    }
    eprintln!("checked real tensors of types {covered:?}");
}
