//! Every kernel against a CPU reference on random inputs of awkward sizes (rows not a multiple
//! of the workgroup's, one-block rows, weights at unaligned byte offsets). Matvec results must
//! lie within `TOLERANCE` of an f64 dot of lean-quant's scalar dequantization, relative to
//! sum |w * x| (only the f32 summation order may differ, so one wrong weight shows).
//!
//! Needs a wgpu adapter (natively: Vulkan, e.g. lavapipe from mesa-vulkan-drivers). Without one
//! the tests print a skip message, or fail when env CI is set.

use half::f16;
use lean_gpu::wgpu;
use lean_gpu::{
    argmax_len, argmax_masked_len, fresh_rope_supported, mask_words, rope_cos_sin, Activation,
    AttentionShape, FreshTokens, GpuContext, GpuError, GpuMatrix, Kernels, MatmulExtras,
    MatvecExtras, Plan, Rope, RopePairing, RowField, StepBuffer, MATVEC_MAX_TOKENS, NO_TOKEN,
};
use lean_quant::{scalar, TensorType};
use std::sync::OnceLock;

const TOLERANCE: f64 = 1e-5;

/// splitmix64: deterministic test data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Byte offsets of the f16 scale fields inside one block of the types under test.
fn f16_fields(ty: TensorType) -> &'static [usize] {
    match ty {
        TensorType::Q4_0 | TensorType::Q5_0 | TensorType::Q8_0 => &[0],
        TensorType::Q4_1 | TensorType::Q4_K => &[0, 2],
        TensorType::Q6_K => &[208],
        _ => &[],
    }
}

/// Random quant bits with finite scales (some negative, some tiny); F32 elements in [-4, 4).
fn random_matrix(rng: &mut Rng, ty: TensorType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols).expect("whole blocks");
    if ty == TensorType::F32 {
        return rng
            .floats(rows * cols, 4.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    }
    let mut w: Vec<u8> = (0..rows * row_bytes)
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in w.chunks_exact_mut(ty.block_bytes()) {
        for &at in f16_fields(ty) {
            // one scale in 8 tiny (f16 subnormal range), the rest up to 0.1
            let scale = if rng.next_u64().is_multiple_of(8) {
                1e-6
            } else {
                0.1
            };
            block[at..at + 2].copy_from_slice(&f16::from_f32(rng.unit() * scale).to_le_bytes());
        }
    }
    w
}

fn gpu() -> Option<(&'static GpuContext, &'static Kernels)> {
    gpu_with_subgroup_kernels().map(|(ctx, kernels, _)| (ctx, kernels))
}

/// The device, its kernels, and where the device has subgroups its kernels whose matvec reduces
/// with them (None elsewhere; the test fails on a CI adapter without them, as lavapipe has them).
fn gpu_with_subgroup_kernels() -> Option<&'static (GpuContext, Kernels, Option<Kernels>)> {
    static GPU: OnceLock<Option<(GpuContext, Kernels, Option<Kernels>)>> = OnceLock::new();
    GPU.get_or_init(|| match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => {
            let info = ctx.adapter_info();
            eprintln!(
                "adapter: {}; subgroups of {}..={}",
                ctx.describe(),
                info.subgroup_min_size,
                info.subgroup_max_size
            );
            let kernels = pollster::block_on(Kernels::new(&ctx)).expect("kernels compile");
            assert!(!kernels.uses_subgroups());
            let subgroup = match pollster::block_on(Kernels::with_subgroup_matvec(&ctx)) {
                Ok(k) => Some(k),
                Err(GpuError::MissingFeatures(_)) => {
                    assert!(
                        std::env::var_os("CI").is_none(),
                        "CI's adapter should have subgroups"
                    );
                    eprintln!("no subgroups: the subgroup matvec is not tested");
                    None
                }
                Err(e) => panic!("subgroup kernels compile: {e}"),
            };
            assert!(subgroup.as_ref().is_none_or(|k| k.uses_subgroups()));
            Some((ctx, kernels, subgroup))
        }
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a GPU adapter: {e}"
            );
            eprintln!("skipping GPU tests: {e}");
            None
        }
    })
    .as_ref()
}

/// The kernels whose matvec reduces with subgroups, where the device has them.
fn subgroup_kernels() -> Option<&'static Kernels> {
    gpu_with_subgroup_kernels().and_then(|(_, _, subgroup)| subgroup.as_ref())
}

/// Records the commands of `f` into a plan and submits it.
fn submit(ctx: &GpuContext, f: impl FnOnce(&mut Plan) -> lean_gpu::Result<()>) {
    let mut plan = Plan::new();
    f(&mut plan).expect("dispatch accepted");
    plan.submit(ctx);
}

fn read_f32(ctx: &GpuContext, buffer: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let future = ctx.read_f32(buffer, len);
    // Tests may block: wait for the copy so the future resolves on its first poll.
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("device alive");
    pollster::block_on(future).expect("readback")
}

/// f64 reference of W·x from the scalar dequantizer, with sum |w * x| per row.
fn reference_matvec(
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Vec<(f64, f64)> {
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut weights = vec![0f32; cols];
    (0..rows)
        .map(|r| {
            scalar::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut weights);
            weights
                .iter()
                .zip(x)
                .fold((0.0, 0.0), |(s, a), (&wv, &xv)| {
                    let p = wv as f64 * xv as f64;
                    (s + p, a + p.abs())
                })
        })
        .collect()
}

/// matvec (n_tokens = None; with the default kernels and the subgroup ones) or matmul of n
/// tokens against the reference, optionally with the weights split into parts of at most
/// `max_part_bytes`.
fn check_linear(
    ty: TensorType,
    rows: usize,
    cols: usize,
    n_tokens: Option<usize>,
    max_part_bytes: Option<u64>,
    seed: u64,
) {
    let Some((ctx, kernels, subgroup)) = gpu_with_subgroup_kernels() else {
        return;
    };
    let mut rng = Rng(seed);
    let w = random_matrix(&mut rng, ty, rows, cols);
    let n = n_tokens.unwrap_or(1);
    let x = rng.floats(n * cols, 1.0);
    let m = match max_part_bytes {
        Some(limit) => GpuMatrix::upload_split(ctx, ty, rows, cols, &w, limit),
        None => GpuMatrix::upload(ctx, ty, rows, cols, &w),
    }
    .expect("upload");
    if let Some(limit) = max_part_bytes {
        assert!(
            m.parts().len() > 1,
            "{ty}: a limit of {limit} bytes should split {rows} rows"
        );
        assert!(
            m.parts().iter().all(|p| p.buffer.size() <= limit),
            "{ty}: a part exceeds {limit} bytes"
        );
    }
    let xb = ctx.upload_f32("x", &x);
    let want: Vec<Vec<(f64, f64)>> = (0..n)
        .map(|t| reference_matvec(ty, &w, rows, cols, &x[t * cols..(t + 1) * cols]))
        .collect();
    let mut variants = vec![("default", kernels)];
    if let (None, Some(subgroup)) = (n_tokens, subgroup) {
        variants.push(("subgroup", subgroup));
    }
    for (variant, kernels) in variants {
        let yb = ctx.storage_f32("y", n * rows);
        submit(ctx, |e| match n_tokens {
            None => kernels.matvec(ctx, e, &m, &xb, &yb),
            Some(n) => kernels.matmul(ctx, e, &m, &xb, &yb, n),
        });
        let y = read_f32(ctx, &yb, n * rows);
        for (t, want_row) in want.iter().enumerate() {
            for (r, (&got, &(want, abs))) in
                y[t * rows..(t + 1) * rows].iter().zip(want_row).enumerate()
            {
                let err = (got as f64 - want).abs();
                assert!(err <= TOLERANCE * abs + 1e-30, "{ty} {rows}x{cols} ({variant} kernels) token {t}/{n_tokens:?} row {r}: {got} vs {want} (sum |wx| {abs})");
            }
        }
    }
}

fn check_matvec(ty: TensorType, rows: usize, cols: usize, max_part_bytes: Option<u64>, seed: u64) {
    check_linear(ty, rows, cols, None, max_part_bytes, seed);
}

const QUANT_TYPES: [TensorType; 6] = [
    TensorType::Q4_0,
    TensorType::Q4_1,
    TensorType::Q5_0,
    TensorType::Q8_0,
    TensorType::Q4_K,
    TensorType::Q6_K,
];

#[test]
fn matvec_one_block_rows() {
    for (i, ty) in QUANT_TYPES.into_iter().enumerate() {
        // a single row, then rows of one block whose byte offsets are odd multiples of 2
        check_matvec(ty, 1, ty.block_len(), None, 10 + i as u64);
        check_matvec(ty, 13, ty.block_len(), None, 20 + i as u64);
    }
}

#[test]
fn matvec_awkward_shapes() {
    for (i, ty) in QUANT_TYPES.into_iter().enumerate() {
        // rows not a multiple of 8 rows per workgroup; more items than the 32 threads of a row
        check_matvec(ty, 61, ty.block_len() * 3, None, 30 + i as u64);
        check_matvec(ty, 259, ty.block_len() * 11, None, 40 + i as u64);
    }
}

/// Rows of 1 to 344 units: row groups of 1 to 256 threads (the subgroup reduction from the
/// adapter's largest subgroup up), threads with several units (more units than 256 threads),
/// rows not a multiple of a workgroup's; the shapes of real models' matrices.
#[test]
fn matvec_row_group_sizes() {
    for (i, ty) in [TensorType::Q4_0, TensorType::Q8_0, TensorType::Q6_K]
        .into_iter()
        .enumerate()
    {
        let seed = 200 + 10 * i as u64;
        let block = ty.block_len();
        for (j, (rows, cols)) in [
            (5, 256usize),
            (130, 896),
            (37, 2048),
            (3, 4864),
            (21, 11008),
            (9, 9984),
        ]
        .into_iter()
        .enumerate()
        {
            check_matvec(
                ty,
                rows,
                cols.next_multiple_of(block),
                None,
                seed + j as u64,
            );
        }
    }
    for (j, cols) in [32, 96, 352, 800].into_iter().enumerate() {
        check_matvec(TensorType::Q4_0, 67, cols, None, 250 + j as u64);
    }
}

/// More workgroups (of 2 rows) than one dispatch dimension holds: a 2-D dispatch whose groups
/// past the last row must leave without writing.
#[test]
fn matvec_rows_beyond_one_dispatch_dimension() {
    let Some((ctx, _)) = gpu() else { return };
    let max_dim = ctx.limits().max_compute_workgroups_per_dimension as usize;
    check_matvec(TensorType::Q8_0, 2 * max_dim + 3, 32, None, 260);
}

#[test]
fn matvec_f32() {
    check_matvec(TensorType::F32, 1, 1, None, 50);
    check_matvec(TensorType::F32, 37, 77, None, 51);
    check_matvec(TensorType::F32, 130, 576, None, 52);
    // rows ending inside a unit, with more units than a row group has threads
    check_matvec(TensorType::F32, 11, 8200, None, 53);
}

#[test]
fn matvec_split_across_bindings() {
    for (i, ty) in QUANT_TYPES.into_iter().chain([TensorType::F32]).enumerate() {
        // F32: rows padded on the device to 64 elements
        let cols = if ty == TensorType::F32 {
            40
        } else {
            ty.block_len() * 2
        };
        // parts of about 5 rows (row sizes not multiples of 16 leave padded parts)
        let limit = (ty.row_bytes(cols).unwrap() * 5 + 3) as u64;
        check_matvec(ty, 23, cols, Some(limit), 60 + i as u64);
    }
}

/// The matmul's tile is 128 rows × 64 tokens with K in steps of 16 (kernels/matmul.rs: MATMUL_TILE):
/// shapes on both sides of each edge, and the fewest tokens the session sends it.
#[test]
fn matmul_tiles_with_ragged_edges() {
    for (i, ty) in QUANT_TYPES.into_iter().chain([TensorType::F32]).enumerate() {
        let i = 10 * i as u64;
        let unit = ty.block_len().max(32);
        // one to three tokens, a K of one block, rows fewer than a tile
        for n in 1..=3 {
            check_linear(ty, 45, ty.block_len(), Some(n), None, 130 + i + n as u64);
        }
        // rows and tokens just past a tile (and below a token quad), K of several blocks
        check_linear(ty, 129, unit * 3, Some(65), None, 134 + i);
        // a whole tile, and two row tiles with the second ending inside a row quad
        check_linear(ty, 128, unit, Some(64), None, 135 + i);
        check_linear(ty, 250, unit * 2, Some(37), None, 136 + i);
    }
    // F32 with K not a multiple of the K step nor of a slice
    check_linear(TensorType::F32, 40, 77, Some(9), None, 200);
    check_linear(TensorType::F32, 131, 19, Some(70), None, 201);
}

/// Few tiles over a long K: K is split into ranges (kernels/matmul.rs: matmul_split) whose partial
/// sums a second pass adds up; 800 = 25 units makes ranges of 288, 288 and 224 elements, F32's
/// 777 a last range ending inside a slice.
#[test]
fn matmul_splits_long_rows() {
    for (i, ty) in QUANT_TYPES.into_iter().chain([TensorType::F32]).enumerate() {
        let i = 10 * i as u64;
        let cols = if ty.block_len() == 256 { 1280 } else { 800 };
        for n in [2, 33] {
            check_linear(ty, 45, cols, Some(n), None, 300 + i + n as u64);
        }
        // a part per 20 rows, each split
        let limit = (ty.row_bytes(cols).unwrap() * 20) as u64;
        check_linear(ty, 45, cols, Some(3), Some(limit), 305 + i);
    }
    check_linear(TensorType::F32, 70, 777, Some(5), None, 400);
}

#[test]
fn matmul_split_across_bindings() {
    for (i, ty) in QUANT_TYPES.into_iter().enumerate() {
        let cols = ty.block_len() * 2;
        let limit = (ty.row_bytes(cols).unwrap() * 11) as u64;
        check_linear(ty, 50, cols, Some(6), Some(limit), 170 + i as u64);
    }
}

/// matvec_add / matmul_add: y += W·x, exactly the separate product then an f32 add.
#[test]
fn linear_add_fuses_the_residual() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(180);
    // K of 96: one pass; of 800: K split, the residual added by the second pass
    for (ty, rows, cols) in [(TensorType::Q4_0, 45, 96), (TensorType::Q4_0, 45, 800)] {
        let w = random_matrix(&mut rng, ty, rows, cols);
        let m = GpuMatrix::upload_split(
            ctx,
            ty,
            rows,
            cols,
            &w,
            (ty.row_bytes(cols).unwrap() * 20) as u64,
        )
        .unwrap();
        for n in [1, 7] {
            let x = ctx.upload_f32("x", &rng.floats(n * cols, 1.0));
            let residual = rng.floats(n * rows, 3.0);
            let (plain, fused) = (
                ctx.storage_f32("plain", n * rows),
                ctx.upload_f32("fused", &residual),
            );
            submit(ctx, |p| match n {
                1 => kernels
                    .matvec(ctx, p, &m, &x, &plain)
                    .and_then(|_| kernels.matvec_add(ctx, p, &m, &x, &fused)),
                _ => kernels
                    .matmul(ctx, p, &m, &x, &plain, n)
                    .and_then(|_| kernels.matmul_add(ctx, p, &m, &x, &fused, n)),
            });
            let product = read_f32(ctx, &plain, n * rows);
            let want: Vec<f32> = residual.iter().zip(&product).map(|(r, p)| r + p).collect();
            assert_eq!(
                read_f32(ctx, &fused, n * rows),
                want,
                "{n} tokens, K {cols}"
            );
        }
    }
}

/// The bias fused in (matvec_at for one token, matmul_with for several) equals the plain
/// product then the bias added on the CPU, bit for bit: on matrices split into parts (each
/// part's bias entries), for two types' pipelines, the matmul in one pass and with K split (the
/// second pass adds it), and at an offset in wider rows (only that field written).
#[test]
fn linear_fuses_the_bias_add() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(181);
    // K of 800 with 3 tokens: K split
    for (ty, rows, cols, n) in [
        (TensorType::Q4_0, 45, 96, 1),
        (TensorType::Q8_0, 130, 64, 1),
        (TensorType::Q4_0, 45, 96, 7),
        (TensorType::Q8_0, 130, 64, 70),
        (TensorType::Q4_0, 45, 800, 3),
    ] {
        let w = random_matrix(&mut rng, ty, rows, cols);
        let part_rows = 20;
        // room for the padding to 16 bytes
        let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64 + 16;
        let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
        assert_eq!(m.parts().len(), rows.div_ceil(part_rows));
        let x = ctx.upload_f32("x", &rng.floats(n * cols, 1.0));
        for at in [
            RowField::whole(rows),
            RowField {
                width: rows + 10,
                offset: 7,
            },
        ] {
            let bias = rng.floats(at.width, 3.0);
            let b = ctx.upload_f32("bias", &bias);
            let before = rng.floats(n * at.width, 1.0);
            let (plain, fused) = (
                ctx.storage_f32("plain", n * rows),
                ctx.upload_f32("fused", &before),
            );
            submit(ctx, |p| match n {
                1 => {
                    kernels.matvec(ctx, p, &m, &x, &plain)?;
                    kernels.matvec_at(ctx, p, &m, &x, &fused, at, Some(&b))
                }
                _ => {
                    kernels.matmul(ctx, p, &m, &x, &plain, n)?;
                    let extras = MatmulExtras {
                        bias: Some(&b),
                        ..Default::default()
                    };
                    kernels.matmul_with(ctx, p, &m, &x, (&fused, at), n, extras)
                }
            });
            let product = read_f32(ctx, &plain, n * rows);
            let mut want = before.clone();
            for t in 0..n {
                for r in 0..rows {
                    let c = at.offset + r;
                    want[t * at.width + c] = product[t * rows + r] + bias[c];
                }
            }
            let got = read_f32(ctx, &fused, n * at.width);
            assert_eq!(got, want, "{ty} {n} tokens {at:?}");
        }
    }
}

/// A matmul of interleaved (gate, up) rows writing silu(gate) · up (SWIGLU) equals the plain
/// matmul then silu_mul_pairs, bit for bit: ragged tiles, K split (the second pass applies it),
/// parts of whole pairs, and at an offset in wider rows; odd rows, a bias or accumulating with
/// it are refused.
#[test]
fn matmul_fuses_swiglu() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(198);
    for (ty, pairs, cols, n, part_rows) in [
        (TensorType::Q4_0, 75, 96, 65, 1000),
        (TensorType::Q8_0, 40, 64, 9, 34),
        (TensorType::F32, 5, 70, 3, 3),
        (TensorType::Q6_K, 70, 256, 70, 1000),
        // K split
        (TensorType::Q4_0, 23, 800, 3, 18),
    ] {
        let rows = 2 * pairs;
        let w = random_matrix(&mut rng, ty, rows, cols);
        let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64 + 16;
        let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
        assert!(
            m.parts().iter().all(|p| p.rows % 2 == 0),
            "{ty}: parts of pairs"
        );
        let x = ctx.upload_f32("x", &rng.floats(n * cols, 2.0));
        let at = RowField {
            width: pairs + 6,
            offset: 5,
        };
        let before = rng.floats(n * at.width, 1.0);
        let (y, plain, fused) = (
            ctx.storage_f32("y", n * rows),
            ctx.storage_f32("plain", n * pairs),
            ctx.upload_f32("fused", &before),
        );
        submit(ctx, |p| {
            kernels.matmul(ctx, p, &m, &x, &y, n)?;
            kernels.silu_mul_pairs(ctx, p, &y, &plain, pairs, n)?;
            let extras = MatmulExtras {
                swiglu: true,
                ..Default::default()
            };
            kernels.matmul_with(ctx, p, &m, &x, (&fused, at), n, extras)
        });
        let product = read_f32(ctx, &plain, n * pairs);
        let mut want = before.clone();
        for t in 0..n {
            want[t * at.width + at.offset..][..pairs]
                .copy_from_slice(&product[t * pairs..][..pairs]);
        }
        assert_eq!(
            read_f32(ctx, &fused, n * at.width),
            want,
            "{ty} {rows}x{cols}, {n} tokens"
        );
    }
    let w = random_matrix(&mut rng, TensorType::Q4_0, 4, 32);
    let m = GpuMatrix::upload(ctx, TensorType::Q4_0, 4, 32, &w).unwrap();
    let odd = GpuMatrix::upload(ctx, TensorType::Q4_0, 3, 32, &w[..3 * 18]).unwrap();
    let (x, y) = (ctx.storage_f32("x", 64), ctx.storage_f32("y", 8));
    let swiglu = MatmulExtras {
        swiglu: true,
        ..Default::default()
    };
    for (m, extras) in [
        (&odd, swiglu),
        (
            &m,
            MatmulExtras {
                bias: Some(&y),
                ..swiglu
            },
        ),
        (
            &m,
            MatmulExtras {
                accumulate: true,
                ..swiglu
            },
        ),
    ] {
        let mut plan = Plan::new();
        let at = RowField::whole(2);
        assert!(matches!(
            kernels.matmul_with(ctx, &mut plan, m, &x, (&y, at), 2, extras),
            Err(GpuError::Shape(_))
        ));
    }
}

/// One matrix of q, k, v (or gate, up) stacked by rows computes exactly what the members do
/// alone, and members writing side by side at their offsets (matvec_at, matmul_at) fill the
/// same rows: the same dot per row. The stacked matrix is split into parts that cross the
/// members' boundaries. (The shapes keep each kernel's choice of workgroup size and K split
/// equal between stacked and separate: those set the f32 summation order.)
#[test]
fn stacked_matrix_equals_its_members() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(182);
    for (ty, members, cols) in [
        (TensorType::Q8_0, [45, 13, 13], 96),
        (TensorType::Q4_K, [40, 8, 8], 256),
        (TensorType::F32, [21, 30, 9], 40),
        (TensorType::Q4_0, [70, 70, 0], 800),
    ] {
        let members: Vec<usize> = members.into_iter().filter(|&r| r > 0).collect();
        let width: usize = members.iter().sum();
        let row_bytes = ty.row_bytes(cols).unwrap();
        let weights: Vec<Vec<u8>> = members
            .iter()
            .map(|&rows| random_matrix(&mut rng, ty, rows, cols))
            .collect();
        let alone: Vec<GpuMatrix> = weights
            .iter()
            .zip(&members)
            .map(|(w, &rows)| GpuMatrix::upload(ctx, ty, rows, cols, w).unwrap())
            .collect();
        let limit = (row_bytes * 20) as u64;
        let stacked = GpuMatrix::upload_split(ctx, ty, width, cols, &weights.concat(), limit)
            .expect("stacked upload");
        assert!(stacked.parts().len() > 2);
        let offsets: Vec<usize> = members
            .iter()
            .scan(0, |at, &rows| {
                *at += rows;
                Some(*at - rows)
            })
            .collect();
        for n in [1, 5] {
            let x = ctx.upload_f32("x", &rng.floats(n * cols, 1.0));
            let linear = |p: &mut Plan, m: &GpuMatrix, y: &wgpu::Buffer| match n {
                1 => kernels.matvec(ctx, p, m, &x, y),
                _ => kernels.matmul(ctx, p, m, &x, y, n),
            };
            // Each alone into its own buffer; the stacked one; each at its offset, in rows
            // with 3 more elements than the fields (left as they were).
            let own: Vec<wgpu::Buffer> = members
                .iter()
                .map(|&rows| ctx.storage_f32("alone", n * rows))
                .collect();
            let stacked_y = ctx.storage_f32("stacked", n * width);
            let wide = width + 3;
            let before = rng.floats(n * wide, 1.0);
            let side_by_side = ctx.upload_f32("side by side", &before);
            submit(ctx, |p| {
                for (m, y) in alone.iter().zip(&own) {
                    linear(p, m, y)?;
                }
                linear(p, &stacked, &stacked_y)?;
                for (m, &offset) in alone.iter().zip(&offsets) {
                    let at = RowField {
                        width: wide,
                        offset,
                    };
                    match n {
                        1 => kernels.matvec_at(ctx, p, m, &x, &side_by_side, at, None)?,
                        _ => kernels.matmul_at(ctx, p, m, &x, &side_by_side, at, n)?,
                    }
                }
                Ok(())
            });
            let own: Vec<Vec<f32>> = own
                .iter()
                .zip(&members)
                .map(|(y, &rows)| read_f32(ctx, y, n * rows))
                .collect();
            let mut want = Vec::with_capacity(n * width);
            for t in 0..n {
                for (y, &rows) in own.iter().zip(&members) {
                    want.extend_from_slice(&y[t * rows..(t + 1) * rows]);
                }
            }
            assert_eq!(
                read_f32(ctx, &stacked_y, n * width),
                want,
                "{ty} {members:?}: stacked, {n} tokens"
            );
            let mut want_wide = before.clone();
            for t in 0..n {
                want_wide[t * wide..t * wide + width]
                    .copy_from_slice(&want[t * width..(t + 1) * width]);
            }
            assert_eq!(
                read_f32(ctx, &side_by_side, n * wide),
                want_wide,
                "{ty} {members:?}: side by side, {n} tokens"
            );
        }
    }
}

/// A matvec with the RMS norm fused in equals rms_norm then matvec: the normalized x is the
/// same (to the sum's rounding), on split parts, ragged F32 rows and every workgroup size, with
/// a bias and a residual add fused in too.
#[test]
fn matvec_fuses_the_rms_norm() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(191);
    for (ty, rows, cols, part_rows) in [
        (TensorType::Q4_0, 45, 96, 20),
        (TensorType::Q6_K, 33, 512, 33),
        (TensorType::F32, 7, 1000, 3),
        (TensorType::Q8_0, 300, 2048, 300),
        (TensorType::Q4_K, 4, 4096, 4),
    ] {
        let w = random_matrix(&mut rng, ty, rows, cols);
        let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64;
        let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
        let x = rng.floats(cols, 2.0);
        let norm = rng.floats(cols, 1.5);
        let mut padded = norm.clone();
        padded.resize(cols.next_multiple_of(32), 0.0);
        let bias = rng.floats(rows, 1.0);
        let residual = rng.floats(rows, 1.0);
        let (xb, nb, pb, bb) = (
            ctx.upload_f32("x", &x),
            ctx.upload_f32("norm", &norm),
            ctx.upload_f32("norm padded", &padded),
            ctx.upload_f32("bias", &bias),
        );
        let (hb, plain, fused) = (
            ctx.storage_f32("h", cols),
            ctx.upload_f32("plain", &residual),
            ctx.upload_f32("fused", &residual),
        );
        let eps = 1e-6;
        submit(ctx, |p| {
            kernels.rms_norm(ctx, p, &xb, &nb, &hb, cols, 1, eps)?;
            kernels.matvec(ctx, p, &m, &hb, &plain)?;
            let extras = MatvecExtras {
                norm: Some((&pb, eps)),
                bias: Some(&bb),
                accumulate: true,
                ..Default::default()
            };
            kernels.matvec_with(ctx, p, &m, &xb, (&fused, RowField::whole(rows)), extras)
        });
        let h = read_f32(ctx, &hb, cols);
        let want = reference_matvec(ty, &w, rows, cols, &h);
        let product = read_f32(ctx, &plain, rows);
        let got = read_f32(ctx, &fused, rows);
        for r in 0..rows {
            let (exact, abs) = want[r];
            assert!(
                (product[r] as f64 - exact).abs() <= TOLERANCE * abs + 1e-30,
                "{ty} {rows}x{cols} row {r}: unfused {} vs {exact}",
                product[r]
            );
            let expected = residual[r] as f64 + bias[r] as f64 + exact;
            let err = (got[r] as f64 - expected).abs();
            let bound = TOLERANCE * abs + 1e-6 * (residual[r].abs() + bias[r].abs()) as f64;
            assert!(
                err <= bound,
                "{ty} {rows}x{cols} row {r}: fused {} vs {expected}",
                got[r]
            );
        }
    }
}

/// A matvec reading silu(gate) · up straight from a [gate | up] row equals silu_mul then the
/// matvec, bit for bit (the same expressions in the same order), whatever the gap between them.
#[test]
fn matvec_fuses_silu_mul() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(193);
    for (ty, rows, cols, part_rows, gap) in [
        (TensorType::Q4_0, 45, 96, 20, 0),
        (TensorType::Q6_K, 33, 512, 33, 8),
        (TensorType::F32, 7, 1000, 3, 4),
        (TensorType::Q4_0, 5, 11008, 5, 0),
    ] {
        let w = random_matrix(&mut rng, ty, rows, cols);
        let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64;
        let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
        // [gate | gap | up | zeros to whole units]
        let up_at = cols + gap;
        let width = up_at + cols.next_multiple_of(32);
        let mut gate_up = rng.floats(width, 4.0);
        gate_up[up_at + cols..].fill(0.0);
        let residual = rng.floats(rows, 1.0);
        let gub = ctx.upload_f32("gate_up", &gate_up);
        let (act, plain, fused) = (
            ctx.storage_f32("act", cols),
            ctx.upload_f32("plain", &residual),
            ctx.upload_f32("fused", &residual),
        );
        let field = |offset| RowField { width, offset };
        submit(ctx, |p| {
            kernels.silu_mul(ctx, p, &gub, (field(0), field(up_at)), &act, cols, 1)?;
            kernels.matvec_add(ctx, p, &m, &act, &plain)?;
            let extras = MatvecExtras {
                silu_up: Some((&gub, up_at)),
                accumulate: true,
                ..Default::default()
            };
            kernels.matvec_with(ctx, p, &m, &gub, (&fused, RowField::whole(rows)), extras)
        });
        assert_eq!(
            read_f32(ctx, &fused, rows),
            read_f32(ctx, &plain, rows),
            "{ty} {rows}x{cols}"
        );
    }
}

/// A matvec of interleaved (gate, up) rows writing silu(gate) · up (SWIGLU, with the norm fused
/// too) equals the plain matvec then silu_mul_pairs, bit for bit, with parts of whole pairs
/// (the upload rounds a part's rows down to even) and both reductions; odd rows are refused.
#[test]
fn matvec_fuses_swiglu() {
    let Some((ctx, default)) = gpu() else { return };
    let mut rng = Rng(197);
    let mut variants = vec![default];
    variants.extend(subgroup_kernels());
    for kernels in variants {
        for (ty, pairs, cols, part_rows) in [
            (TensorType::Q4_0, 23, 96, 9),
            (TensorType::Q8_0, 40, 64, 80),
            (TensorType::F32, 5, 70, 3),
            // long rows, few workgroups: the largest workgroups (512 threads with subgroups)
            (TensorType::Q4_0, 3, 4864, 6),
        ] {
            let rows = 2 * pairs;
            let w = random_matrix(&mut rng, ty, rows, cols);
            let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64 + 16;
            let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
            assert!(
                m.parts().iter().all(|p| p.rows % 2 == 0),
                "{ty}: parts of pairs"
            );
            let x = ctx.upload_f32("x", &rng.floats(cols, 2.0));
            let mut weights = rng.floats(cols.next_multiple_of(32), 1.0);
            weights[cols..].fill(0.0);
            let norm = ctx.upload_f32("norm", &weights);
            let (y, plain, fused) = (
                ctx.storage_f32("y", rows),
                ctx.storage_f32("plain", pairs),
                ctx.storage_f32("fused", pairs),
            );
            submit(ctx, |p| {
                let extras = MatvecExtras {
                    norm: Some((&norm, 1e-6)),
                    ..Default::default()
                };
                kernels.matvec_with(ctx, p, &m, &x, (&y, RowField::whole(rows)), extras)?;
                kernels.silu_mul_pairs(ctx, p, &y, &plain, pairs, 1)?;
                let extras = MatvecExtras {
                    swiglu: true,
                    ..extras
                };
                kernels.matvec_with(ctx, p, &m, &x, (&fused, RowField::whole(pairs)), extras)
            });
            assert_eq!(
                read_f32(ctx, &fused, pairs),
                read_f32(ctx, &plain, pairs),
                "{ty} {rows}x{cols}"
            );
        }
        let w = random_matrix(&mut rng, TensorType::Q4_0, 3, 32);
        let m = GpuMatrix::upload(ctx, TensorType::Q4_0, 3, 32, &w).unwrap();
        let (x, y) = (ctx.storage_f32("x", 32), ctx.storage_f32("y", 3));
        let extras = MatvecExtras {
            swiglu: true,
            ..Default::default()
        };
        let odd = kernels.matvec_with(
            ctx,
            &mut Plan::new(),
            &m,
            &x,
            (&y, RowField::whole(1)),
            extras,
        );
        assert!(matches!(odd, Err(GpuError::Shape(_))), "odd rows: {odd:?}");
    }
}

#[test]
fn matvec_rejects_bad_input_without_panicking() {
    let Some((ctx, kernels)) = gpu() else { return };
    let ty = TensorType::Q4_0;
    let w = vec![0u8; 18 * 4];
    assert!(
        matches!(
            GpuMatrix::upload(ctx, ty, 4, 33, &w),
            Err(GpuError::Shape(_))
        ),
        "partial block"
    );
    assert!(
        matches!(
            GpuMatrix::upload(ctx, ty, 5, 32, &w),
            Err(GpuError::Shape(_))
        ),
        "short data"
    );
    assert!(
        matches!(
            GpuMatrix::upload_split(ctx, ty, 4, 32, &w, 16),
            Err(GpuError::TooLarge(_))
        ),
        "row over limit"
    );
    let m = GpuMatrix::upload(ctx, ty, 4, 32, &w).unwrap();
    let mut plan = Plan::new();
    let short = ctx.storage_f32("x", 31);
    let y = ctx.storage_f32("y", 4);
    assert!(matches!(
        kernels.matvec(ctx, &mut plan, &m, &short, &y),
        Err(GpuError::Shape(_))
    ));
    let q2k = GpuMatrix::upload(ctx, TensorType::Q2_K, 1, 256, &[0u8; 84]).unwrap();
    let x = ctx.storage_f32("x", 256);
    assert_eq!(
        kernels.matvec(ctx, &mut plan, &q2k, &x, &y).err(),
        Some(GpuError::UnsupportedType(TensorType::Q2_K))
    );
}

#[test]
fn rms_norm_matches_hf() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(70);
    for (n, rows) in [(1, 1), (576, 3), (1000, 2)] {
        let x = rng.floats(n * rows, 3.0);
        let w = rng.floats(n, 2.0);
        let (xb, wb, ob) = (
            ctx.upload_f32("x", &x),
            ctx.upload_f32("w", &w),
            ctx.storage_f32("out", n * rows),
        );
        submit(ctx, |e| {
            kernels.rms_norm(ctx, e, &xb, &wb, &ob, n, rows, 1e-5)
        });
        let out = read_f32(ctx, &ob, n * rows);
        for r in 0..rows {
            let xr = &x[r * n..(r + 1) * n];
            let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            for i in 0..n {
                let want = w[i] as f64 * (xr[i] as f64 * inv);
                let got = out[r * n + i] as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "n {n} row {r} [{i}]: {got} vs {want}"
                );
            }
        }
    }
}

/// The CPU backend's rotation (lean's RopeTable::apply) on one token's heads.
fn rope_reference(x: &mut [f32], table: &[[f32; 2]], rope: Rope, head_dim: usize, pos: usize) {
    let half = rope.rope_dim / 2;
    let row = &table[pos * half..][..half];
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &[cos, sin]) in row.iter().enumerate() {
            let (a, b) = match rope.pairing {
                RopePairing::Interleaved => (2 * i, 2 * i + 1),
                RopePairing::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos + (-x1) * sin;
            head[b] = x1 * cos + x0 * sin;
        }
    }
}

/// Per token rows of `width` holding q, k, v as `fields` (the rest: `fill`).
fn qkv_rows(
    (q, k, v): (&[f32], &[f32], &[f32]),
    n_tokens: usize,
    width: usize,
    fields: [RowField; 3],
    fill: &[f32],
) -> Vec<f32> {
    let mut rows = fill[..n_tokens * width].to_vec();
    for (data, field) in [q, k, v].into_iter().zip(fields) {
        let len = data.len() / n_tokens;
        for t in 0..n_tokens {
            rows[t * width + field.offset..][..len].copy_from_slice(&data[t * len..][..len]);
        }
    }
    rows
}

/// Layouts of q, k, v in a token's row: the session's [q | k | v], and a permuted one with
/// gaps, [pad 3 | v | k | pad 1 | q | pad 2].
fn qkv_layouts(q_dim: usize, kv_dim: usize) -> [(usize, [RowField; 3]); 2] {
    let dense = q_dim + 2 * kv_dim;
    let at = |width, offset| RowField { width, offset };
    // gaps of 4 elements: attention reads q as vec4
    let gappy = dense + 12;
    [
        (
            dense,
            [at(dense, 0), at(dense, q_dim), at(dense, q_dim + kv_dim)],
        ),
        (
            gappy,
            [
                at(gappy, 8 + 2 * kv_dim),
                at(gappy, 4 + kv_dim),
                at(gappy, 4),
            ],
        ),
    ]
}

/// rope_kv_store: queries rotated in place, keys rotated into the cache (second layer of two),
/// values copied, every other cache entry and every other element of the qkv rows untouched;
/// q, k, v as fields of dense and of gappy rows.
#[test]
fn rope_kv_store_matches_cpu_for_both_pairings() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(80);
    for pairing in [RopePairing::Interleaved, RopePairing::Neox] {
        // full rotation; a partial one (rope_dim < head_dim) leaves the tail untouched; each
        // in both layouts of the qkv rows
        for (head_dim, rope_dim, layout) in [(64, 64, 0), (48, 32, 0), (64, 64, 1), (48, 32, 1)] {
            let (n_tokens, n_heads, n_kv_heads, pos0) = (3, 6, 2, 1000);
            let capacity = pos0 + 5;
            let rope = Rope {
                rope_dim,
                positions: capacity,
                pairing,
            };
            let kv_dim = n_kv_heads * head_dim;
            let s = AttentionShape {
                n_heads,
                n_kv_heads,
                head_dim,
                n_tokens,
                capacity,
                cache_offset: kv_dim * capacity,
                scale: AttentionShape::default_scale(head_dim),
                window: None,
            };
            let table = rope_cos_sin(rope_dim, 10000.0, 1.0, capacity);
            let step = StepBuffer::new(ctx);
            step.set(ctx, pos0).unwrap();
            let q = rng.floats(n_tokens * n_heads * head_dim, 2.0);
            let k = rng.floats(n_tokens * kv_dim, 2.0);
            let v = rng.floats(n_tokens * kv_dim, 2.0);
            let mut keys = rng.floats(2 * kv_dim * capacity, 1.0);
            let mut values = rng.floats(2 * kv_dim * capacity, 1.0);
            let (width, fields) = qkv_layouts(n_heads * head_dim, kv_dim)[layout];
            let fill = rng.floats(n_tokens * width, 1.0);
            let rows = qkv_rows((&q, &k, &v), n_tokens, width, fields, &fill);
            let bufs: Vec<_> = [&rows, &keys, &values]
                .iter()
                .map(|d| ctx.upload_f32("data", d))
                .collect();
            let tb = ctx.upload_f32("cos_sin", table.as_flattened());
            submit(ctx, |e| {
                kernels.rope_kv_store(
                    ctx,
                    e,
                    &step,
                    &bufs[0],
                    fields,
                    (&bufs[1], &bufs[2]),
                    (&tb, rope),
                    s,
                )
            });
            let mut want_q = q.clone();
            let mut want_k = k.clone();
            for t in 0..n_tokens {
                let pos = pos0 + t;
                rope_reference(
                    &mut want_q[t * n_heads * head_dim..][..n_heads * head_dim],
                    &table,
                    rope,
                    head_dim,
                    pos,
                );
                rope_reference(
                    &mut want_k[t * kv_dim..][..kv_dim],
                    &table,
                    rope,
                    head_dim,
                    pos,
                );
                for j in 0..kv_dim {
                    let at = s.cache_offset
                        + ((j / head_dim) * capacity + pos) * head_dim
                        + j % head_dim;
                    keys[at] = want_k[t * kv_dim + j];
                    values[at] = v[t * kv_dim + j];
                }
            }
            // one rounding of a two-term sum (a fused multiply-add may skip one)
            let close = |what: &str, got: &[f32], want: &[f32]| {
                for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-6 * 4.0,
                        "{what} {pairing:?} {head_dim}/{rope_dim} [{i}]: {g} vs {w}"
                    );
                }
            };
            let want_rows = qkv_rows((&want_q, &k, &v), n_tokens, width, fields, &fill);
            close("qkv rows", &read_f32(ctx, &bufs[0], rows.len()), &want_rows);
            close("keys", &read_f32(ctx, &bufs[1], keys.len()), &keys);
            assert_eq!(read_f32(ctx, &bufs[2], values.len()), values, "values");
        }
    }
}

/// Attention of fresh tokens (unrotated in the qkv rows: it rotates q and k and stores k and v
/// itself) equals rope_kv_store then attention (bit for bit on lavapipe; to an ulp of the
/// rotation where the compilers contract differently): the outputs and the whole cache,
/// for both pairings, partial rotation, decode and prefill chunks (new keys read back within
/// the chunk), GQA groups, several splits, and both qkv row layouts.
#[test]
fn attention_rotates_and_caches_fresh_tokens() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(95);
    for pairing in [RopePairing::Interleaved, RopePairing::Neox] {
        for (n_heads, n_kv_heads, head_dim, rope_dim, n_tokens, pos0, capacity, layout) in [
            (2, 2, 64, 64, 1, 0, 8, 0),
            (6, 2, 64, 64, 5, 32, 40, 1),
            (4, 1, 48, 32, 1, 299, 301, 0),
            (4, 2, 128, 128, 70, 3, 80, 0),
            (2, 1, 64, 56, 3, 700, 800, 1),
        ] {
            let rope = Rope {
                rope_dim,
                positions: capacity,
                pairing,
            };
            assert!(fresh_rope_supported(&rope, head_dim));
            let kv_dim = n_kv_heads * head_dim;
            let s = AttentionShape {
                n_heads,
                n_kv_heads,
                head_dim,
                n_tokens,
                capacity,
                cache_offset: kv_dim * capacity,
                scale: AttentionShape::default_scale(head_dim),
                window: None,
            };
            let q = rng.floats(n_tokens * n_heads * head_dim, 1.0);
            let k_new = rng.floats(n_tokens * kv_dim, 1.0);
            let v_new = rng.floats(n_tokens * kv_dim, 1.0);
            let (width, fields) = qkv_layouts(n_heads * head_dim, kv_dim)[layout];
            let fill = rng.floats(n_tokens * width, 1.0);
            let rows = qkv_rows((&q, &k_new, &v_new), n_tokens, width, fields, &fill);
            let keys = rng.floats(2 * kv_dim * capacity, 1.0);
            let values = rng.floats(2 * kv_dim * capacity, 1.0);
            let table = rope_cos_sin(rope_dim, 10000.0, 1.0, capacity);
            let tb = ctx.upload_f32("cos_sin", table.as_flattened());
            let step = StepBuffer::new(ctx);
            step.set(ctx, pos0).unwrap();
            let run = |fresh: bool| {
                let qkv = ctx.upload_f32("qkv", &rows);
                let (kb, vb) = (ctx.upload_f32("k", &keys), ctx.upload_f32("v", &values));
                let ob = ctx.storage_f32("out", n_tokens * n_heads * head_dim);
                let partials = ctx.storage_f32("partials", s.partials_len());
                submit(ctx, |p| {
                    let tokens = FreshTokens {
                        k: fields[1],
                        v: fields[2],
                        cos_sin: &tb,
                        rope,
                    };
                    if !fresh {
                        let table = (&tb, rope);
                        kernels.rope_kv_store(ctx, p, &step, &qkv, fields, (&kb, &vb), table, s)?;
                    }
                    let q = (&qkv, fields[0]);
                    let fresh = fresh.then_some(tokens);
                    kernels.attention(ctx, p, &step, q, &kb, &vb, &partials, &ob, s, fresh)
                });
                [
                    read_f32(ctx, &ob, n_tokens * n_heads * head_dim),
                    read_f32(ctx, &kb, keys.len()),
                    read_f32(ctx, &vb, values.len()),
                ]
            };
            let (want, got) = (run(false), run(true));
            // Values are copies; rotations may round apart where a compiler contracts one
            // shader's x * cos + y * sin into a fused multiply-add and not the other's (NVIDIA
            // does), by about an ulp of the products, which the outputs carry.
            for (i, (what, tolerance)) in [("outputs", 1e-5), ("keys", 4e-6), ("values", 0.0)]
                .into_iter()
                .enumerate()
            {
                for (j, (&g, &w)) in got[i].iter().zip(&want[i]).enumerate() {
                    assert!(
                        (g - w).abs() <= tolerance,
                        "{what}[{j}]: {g} vs {w}: {pairing:?} heads {n_heads}/{n_kv_heads} head_dim {head_dim} rope_dim {rope_dim} tokens {n_tokens} at {pos0}"
                    );
                }
            }
        }
    }
}

/// Causal attention of `n_tokens` new tokens at positions pos0.. (keys/values already in the
/// cache, second layer of two) against an f64 softmax reference, through rope_kv_store
/// (storing the new tokens' k/v, rope_dim 0: no rotation) and attention.
#[test]
fn attention_matches_causal_softmax_reference() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(90);
    // decode at position 0; a GQA group of 3 with a prefill chunk after cached positions; more
    // positions than the 64-position chunk; head_dim 128; head_dim 80 (value groups of 80
    // threads, 16 idle) and 256 (one group); long decodes in two-chunk splits, head_dims 128,
    // 64 and 80 (value groups covering more than a chunk)
    // (splits in use, of the token's length: 1 of 64 positions; 1 of 64; 5 of 64; 1 of 128 (two
    // chunks); 11 of 64 in a long cache; 4 of 64; 1 of 64; 40 of 128 three times)
    for (n_heads, n_kv_heads, head_dim, n_tokens, pos0, capacity) in [
        (2, 2, 64, 1, 0, 8),
        (6, 2, 64, 5, 32, 40),
        (4, 1, 32, 1, 299, 301),
        (4, 2, 128, 70, 3, 80),
        (2, 1, 64, 3, 700, 6000),
        (3, 1, 80, 1, 200, 201),
        (2, 2, 256, 2, 10, 20),
        (4, 2, 128, 1, 5000, 5001),
        (2, 1, 64, 1, 5000, 5001),
        (3, 1, 80, 1, 5000, 5001),
        // prefill chunks through attention_prefill.wgsl: head_dim 80 (a partial last output
        // quad per thread) over three token blocks; 32 with the chunk ending at the capacity
        // (a step past the end); a GQA group of 8 with head_dim 128 after cached positions
        (3, 1, 80, 70, 17, 100),
        (2, 1, 32, 37, 27, 64),
        (16, 2, 128, 33, 100, 140),
    ] {
        let kv_dim = n_kv_heads * head_dim;
        let s = AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            n_tokens,
            capacity,
            cache_offset: kv_dim * capacity,
            scale: AttentionShape::default_scale(head_dim),
            window: None,
        };
        let q = rng.floats(n_tokens * n_heads * head_dim, 1.0);
        // two layers of cache with random history; the new tokens' k/v go through kv_store
        let mut k = rng.floats(2 * kv_dim * capacity, 1.0);
        let mut v = rng.floats(2 * kv_dim * capacity, 1.0);
        let k_new = rng.floats(n_tokens * kv_dim, 1.0);
        let v_new = rng.floats(n_tokens * kv_dim, 1.0);
        // q, k, v in the gappy layout for odd head counts, the session's otherwise
        let (width, fields) = qkv_layouts(n_heads * head_dim, kv_dim)[n_heads % 2];
        let fill = rng.floats(n_tokens * width, 1.0);
        let rows = qkv_rows((&q, &k_new, &v_new), n_tokens, width, fields, &fill);
        let (qkv, kb, vb) = (
            ctx.upload_f32("qkv", &rows),
            ctx.upload_f32("k", &k),
            ctx.upload_f32("v", &v),
        );
        let ob = ctx.storage_f32("out", n_tokens * n_heads * head_dim);
        let partials = ctx.storage_f32("partials", s.partials_len());
        let step = StepBuffer::new(ctx);
        step.set(ctx, pos0).unwrap();
        let no_rope = Rope {
            rope_dim: 0,
            positions: capacity,
            pairing: RopePairing::Neox,
        };
        let table = ctx.storage_f32("no table", 4);
        submit(ctx, |p| {
            let rope = (&table, no_rope);
            kernels.rope_kv_store(ctx, p, &step, &qkv, fields, (&kb, &vb), rope, s)?;
            let q = (&qkv, fields[0]);
            kernels.attention(ctx, p, &step, q, &kb, &vb, &partials, &ob, s, None)
        });
        let got = read_f32(ctx, &ob, n_tokens * n_heads * head_dim);
        // the reference cache after kv_store
        for t in 0..n_tokens {
            for j in 0..kv_dim {
                let at = s.cache_offset
                    + ((j / head_dim) * capacity + pos0 + t) * head_dim
                    + j % head_dim;
                k[at] = k_new[t * kv_dim + j];
                v[at] = v_new[t * kv_dim + j];
            }
        }
        assert_eq!(read_f32(ctx, &kb, k.len()), k, "kv_store keys");
        assert_eq!(read_f32(ctx, &vb, v.len()), v, "kv_store values");
        let scale = 1.0 / (head_dim as f64).sqrt();
        for t in 0..n_tokens {
            let len = pos0 + t + 1;
            for h in 0..n_heads {
                let base = s.cache_offset + h / (n_heads / n_kv_heads) * capacity * head_dim;
                let qh = &q[(t * n_heads + h) * head_dim..][..head_dim];
                let logits: Vec<f64> = (0..len)
                    .map(|p| {
                        (0..head_dim)
                            .map(|d| qh[d] as f64 * k[base + p * head_dim + d] as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for d in 0..head_dim {
                    let (mut want, mut abs) = (0.0, 0.0);
                    for (p, l) in logits.iter().enumerate() {
                        let pv = (l - max).exp() / sum * v[base + p * head_dim + d] as f64;
                        want += pv;
                        abs += pv.abs();
                    }
                    let g = got[(t * n_heads + h) * head_dim + d] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5 * abs,
                        "heads {n_heads}/{n_kv_heads} token {t} at {} h {h} d {d}: {g} vs {want}",
                        pos0 + t
                    );
                }
            }
        }
    }
}

/// Embedding rows of every type, from a matrix split across bindings (rows in several parts).
#[test]
fn embed_matches_scalar_dequantization() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(95);
    for (i, ty) in QUANT_TYPES.into_iter().chain([TensorType::F32]).enumerate() {
        let (rows, cols) = (29, ty.block_len().max(32) * 3);
        let w = random_matrix(&mut rng, ty, rows, cols);
        let limit = (ty.row_bytes(cols).unwrap() * 7 + 3) as u64;
        let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, limit).unwrap();
        assert!(m.parts().len() > 1);
        let ids: Vec<u32> = vec![0, 28, 7, 6, 7, 13 + i as u32, 21];
        let idb = ctx.upload_bytes("ids", bytemuck_u32(&ids));
        let ob = ctx.storage_f32("out", ids.len() * cols);
        submit(ctx, |p| kernels.embed(ctx, p, &m, &idb, &ob, ids.len()));
        let got = read_f32(ctx, &ob, ids.len() * cols);
        let row_bytes = ty.row_bytes(cols).unwrap();
        let mut want = vec![0f32; cols];
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            scalar::dequantize(ty, &w[id * row_bytes..(id + 1) * row_bytes], &mut want);
            assert_eq!(&got[t * cols..(t + 1) * cols], &want[..], "{ty} row {id}");
        }
    }
}

fn bytemuck_u32(v: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding; the byte slice covers exactly the same memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// silu_mul on one row and on rows of [gate | up] (the session's) and of [pad 2 | up | pad 1 |
/// gate | pad 3].
#[test]
fn silu_mul_matches_torch_formula() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(100);
    let n = 1001;
    let at = |width, offset| RowField { width, offset };
    for (n_rows, width, gate_at, up_at) in [
        (1, 2 * n, at(2 * n, 0), at(2 * n, n)),
        (3, 2 * n, at(2 * n, 0), at(2 * n, n)),
        (3, 2 * n + 6, at(2 * n + 6, n + 3), at(2 * n + 6, 2)),
    ] {
        let gate_up = rng.floats(n_rows * width, 12.0);
        let (gub, ob) = (
            ctx.upload_f32("gate_up", &gate_up),
            ctx.storage_f32("out", n * n_rows),
        );
        submit(ctx, |e| {
            kernels.silu_mul(ctx, e, &gub, (gate_at, up_at), &ob, n, n_rows)
        });
        let got = read_f32(ctx, &ob, n * n_rows);
        for t in 0..n_rows {
            for i in 0..n {
                let g = gate_up[t * width + gate_at.offset + i] as f64;
                let up = gate_up[t * width + up_at.offset + i] as f64;
                let want = g / (1.0 + (-g).exp()) * up;
                let got = got[t * n + i] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1e-6),
                    "row {t} [{i}] g {g}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn argmax_takes_the_first_maximum() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(120);
    let result = ctx.storage_f32("argmax", argmax_len(151_936));
    let mut cases: Vec<(Vec<f32>, u32)> = vec![(vec![-3.0], 0), (vec![1.0, 7.0, 7.0], 1)];
    let mut big = rng.floats(151_936, 30.0);
    // ties in different threads' strides and spans: the lower index wins
    big[1234] = 99.0;
    big[100_000] = 99.0;
    cases.push((big.clone(), 1234));
    // ties inside one thread's stride, and in the first pass's last (partial) span
    let mut tail = big.clone();
    tail[1234] = 0.0;
    tail[100_000] = 0.0;
    tail[151_900] = 99.5;
    tail[151_900 - 256] = 99.5;
    cases.push((tail, 151_900 - 256));
    // every value equal: index 0
    cases.push((vec![2.5; 5000], 0));
    let mut late = rng.floats(49_152, 30.0);
    late[49_151] = 31.0;
    cases.push((late, 49_151));
    for (values, want) in cases {
        let vb = ctx.upload_f32("values", &values);
        submit(ctx, |e| kernels.argmax(ctx, e, &vb, &result, values.len()));
        let future = ctx.read_u32(&result, 1);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap();
        assert_eq!(
            pollster::block_on(future).unwrap(),
            vec![want],
            "n {}",
            values.len()
        );
    }
}

/// The masked argmax equals the CPU's (`lean::sampling::argmax_masked`) on awkward vocabulary
/// sizes: every mask shape (all, none, one token at either end or in the middle, sparse enough
/// to leave whole spans empty, dense, the maximum disallowed), values with ties, -inf, -0.0,
/// NaN and subnormals, and bits set past the last token.
#[test]
fn masked_argmax_equals_the_cpu() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(24);
    let sizes = [
        1, 2, 31, 32, 33, 1000, 1023, 1025, 4097, 32_001, 49_152, 50_257, 151_936,
    ];
    let mut checked = 0;
    for n in sizes {
        let random = rng.floats(n, 30.0);
        // three levels: ties everywhere, across threads, spans and the two passes
        let ties: Vec<f32> = (0..n).map(|_| (rng.next_u64() % 3) as f32).collect();
        let special = [
            f32::NEG_INFINITY,
            -1e38,
            f32::NAN,
            -f32::NAN,
            -0.0,
            0.0,
            1e-40,
            -1e-40,
            f32::MIN_POSITIVE,
        ];
        let odd: Vec<f32> = (0..n)
            .map(|_| special[rng.next_u64() as usize % special.len()])
            .collect();
        let all_inf = vec![f32::NEG_INFINITY; n];
        let words = mask_words(n);
        let result = ctx.storage_f32("masked argmax", argmax_masked_len(n));
        for values in [&random, &ties, &odd, &all_inf] {
            let vb = ctx.upload_f32("values", values);
            let top = lean::sampling::argmax(values) as usize;
            let one = |i: usize| {
                let mut m = vec![0u32; words];
                m[i / 32] |= 1 << (i % 32);
                m
            };
            let mut all = vec![u32::MAX; words];
            let mut masks = vec![
                all.clone(),
                vec![0; words],
                one(0),
                one(n - 1),
                one(n / 2),
                (0..words)
                    .map(|_| {
                        (0..32).fold(0, |m, b| {
                            m | (rng.next_u64().is_multiple_of(64) as u32) << b
                        })
                    })
                    .collect(),
                (0..words).map(|_| rng.next_u64() as u32).collect(),
            ];
            all[top / 32] &= !(1 << (top % 32));
            masks.push(all);
            for mask in &masks {
                let want = lean::sampling::argmax_masked(values, mask).unwrap_or(NO_TOKEN);
                let mb = ctx.upload_bytes("mask", bytemuck_u32(mask));
                submit(ctx, |e| kernels.argmax_masked(ctx, e, &vb, &mb, &result, n));
                let got = read_u32(ctx, &result, 1)[0];
                assert_eq!(got, want, "n {n}, values {:?}..", &values[..n.min(4)]);
                checked += 1;
            }
            // Every mask at once, a row each (a verification pass under a constraint): the
            // rows' values shifted so that no two rows agree by chance.
            let rows = masks.len();
            let mut all_values = Vec::with_capacity(rows * n);
            for r in 0..rows {
                let shifted = values.iter().cycle().skip(r * 7 % n).take(n);
                all_values.extend(shifted);
            }
            let all_masks: Vec<u32> = masks.concat();
            let vb = ctx.upload_f32("values", &all_values);
            let mb = ctx.upload_bytes("masks", bytemuck_u32(&all_masks));
            let len = argmax_masked_len(n);
            let results = ctx.storage_f32("masked argmaxes", rows * len);
            submit(ctx, |e| {
                kernels.argmax_masked_rows(ctx, e, &vb, &mb, &results, n, rows)
            });
            let got = read_u32(ctx, &results, rows * len);
            for (r, mask) in masks.iter().enumerate() {
                let row = &all_values[r * n..(r + 1) * n];
                let want = lean::sampling::argmax_masked(row, mask).unwrap_or(NO_TOKEN);
                assert_eq!(got[r * len], want, "n {n}, row {r} of {rows}");
            }
            checked += rows;
        }
    }
    eprintln!("{checked} masked argmaxes equal the CPU's");
}

fn read_u32(ctx: &GpuContext, buffer: &wgpu::Buffer, len: usize) -> Vec<u32> {
    let future = ctx.read_u32(buffer, len);
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("device alive");
    pollster::block_on(future).expect("readback")
}

#[test]
fn shape_errors_are_typed() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut plan = Plan::new();
    let b = ctx.storage_f32("b", 4096);
    let step = StepBuffer::new(ctx);
    let odd = Rope {
        rope_dim: 63,
        positions: 1,
        pairing: RopePairing::Neox,
    };
    let one = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 64,
        n_tokens: 1,
        capacity: 1,
        cache_offset: 0,
        scale: 0.125,
        window: None,
    };
    let whole = RowField::whole(64);
    assert!(matches!(
        kernels.rope_kv_store(
            ctx,
            &mut plan,
            &step,
            &b,
            [whole; 3],
            (&b, &b),
            (&b, odd),
            one
        ),
        Err(GpuError::Shape(_))
    ));
    // a field that does not fit in its row
    let past_the_row = RowField {
        width: 100,
        offset: 40,
    };
    let no_rope = Rope { rope_dim: 0, ..odd };
    assert!(matches!(
        kernels.rope_kv_store(
            ctx,
            &mut plan,
            &step,
            &b,
            [whole, whole, past_the_row],
            (&b, &b),
            (&b, no_rope),
            one
        ),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        kernels.attention(
            ctx,
            &mut plan,
            &step,
            (&b, past_the_row),
            &b,
            &b,
            &b,
            &b,
            one,
            None
        ),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        kernels.silu_mul(ctx, &mut plan, &b, (whole, past_the_row), &b, 64, 1),
        Err(GpuError::Shape(_))
    ));
    let too_many = AttentionShape {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        n_tokens: 9,
        capacity: 8,
        cache_offset: 0,
        scale: 0.125,
        window: None,
    };
    assert!(matches!(
        kernels.attention(
            ctx,
            &mut plan,
            &step,
            (&b, whole),
            &b,
            &b,
            &b,
            &b,
            too_many,
            None
        ),
        Err(GpuError::Shape(_))
    ));
    let bad_group = AttentionShape {
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 8,
        n_tokens: 1,
        capacity: 8,
        cache_offset: 0,
        scale: 0.125,
        window: None,
    };
    assert!(matches!(
        kernels.attention(
            ctx,
            &mut plan,
            &step,
            (&b, whole),
            &b,
            &b,
            &b,
            &b,
            bad_group,
            None
        ),
        Err(GpuError::Shape(_))
    ));
    let wide = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 512,
        n_tokens: 1,
        capacity: 2,
        cache_offset: 0,
        scale: 0.125,
        window: None,
    };
    assert!(matches!(
        kernels.attention(
            ctx,
            &mut plan,
            &step,
            (&b, whole),
            &b,
            &b,
            &b,
            &b,
            wide,
            None
        ),
        Err(GpuError::Shape(_))
    ));
    // the kernel reads heads and the cache as vec4
    for (head_dim, cache_offset) in [(6, 0), (8, 2)] {
        let unaligned = AttentionShape {
            head_dim,
            cache_offset,
            ..one
        };
        assert!(matches!(
            kernels.attention(
                ctx,
                &mut plan,
                &step,
                (&b, whole),
                &b,
                &b,
                &b,
                &b,
                unaligned,
                None
            ),
            Err(GpuError::Shape(_))
        ));
    }
    assert!(matches!(
        kernels.argmax(ctx, &mut plan, &b, &b, 0),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        kernels.argmax_masked(ctx, &mut plan, &b, &b, &b, 0),
        Err(GpuError::Shape(_))
    ));
    // a mask too short for the values
    let short = ctx.storage_f32("mask", 1);
    assert!(matches!(
        kernels.argmax_masked(ctx, &mut plan, &b, &short, &b, 4096),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        pollster::block_on(ctx.read_f32(&b, 4097)),
        Err(GpuError::Readback(_))
    ));
}

#[test]
fn missing_features_are_an_error() {
    if gpu().is_none() {
        return;
    }
    // no adapter has every feature wgpu knows
    match pollster::block_on(GpuContext::with_features(wgpu::Features::all())) {
        Err(GpuError::MissingFeatures(names)) => assert!(!names.is_empty()),
        Err(e) => panic!("expected MissingFeatures, got {e}"),
        Ok(_) => panic!("an adapter claims every feature"),
    }
}

/// Per-head RMS norm in place against lean's CPU rms_norm on each head (f32, the same
/// expression; only the order of the sum of squares differs): q heads and k heads as fields of
/// [q | k | v] rows, head_dims that are not multiples of the workgroup (5, 80), 128, 256 and
/// past what a thread holds in registers (300), one and several tokens; every element outside
/// the heads stays as it was.
#[test]
fn head_rms_norm_matches_cpu_reference() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(301);
    for (heads, kv_heads, head_dim, n_tokens) in [
        (16, 8, 128, 1),
        (16, 8, 128, 3),
        (4, 1, 256, 5),
        (3, 1, 80, 2),
        (7, 2, 5, 4),
        (2, 1, 300, 3),
    ] {
        let (q_dim, kv_dim) = (heads * head_dim, kv_heads * head_dim);
        let width = q_dim + 2 * kv_dim + 3;
        let rows = rng.floats(n_tokens * width, 3.0);
        let q_norm = rng.floats(head_dim, 2.0);
        let k_norm = rng.floats(head_dim, 2.0);
        let eps = 1e-6;
        let (rb, qw, kw) = (
            ctx.upload_f32("rows", &rows),
            ctx.upload_f32("q_norm", &q_norm),
            ctx.upload_f32("k_norm", &k_norm),
        );
        let q_at = RowField { width, offset: 0 };
        let k_at = RowField {
            width,
            offset: q_dim,
        };
        submit(ctx, |p| {
            kernels.head_rms_norm(ctx, p, &rb, q_at, heads, head_dim, &qw, eps, n_tokens)?;
            kernels.head_rms_norm(ctx, p, &rb, k_at, kv_heads, head_dim, &kw, eps, n_tokens)
        });
        let got = read_f32(ctx, &rb, rows.len());
        let mut want = rows.clone();
        for t in 0..n_tokens {
            for (at, n, w) in [(0, heads, &q_norm), (q_dim, kv_heads, &k_norm)] {
                let field = &mut want[t * width + at..][..n * head_dim];
                let input = field.to_vec();
                lean::cpu::ops::rms_norm(&input, w, eps, field);
            }
        }
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let (t, e) = (i / width, i % width);
            if e >= q_dim + kv_dim {
                assert_eq!(
                    g, w,
                    "{heads}x{head_dim}: v and padding untouched at {t}/{e}"
                );
            }
            assert!(
                (g - w).abs() <= 2e-6 * w.abs().max(1e-3),
                "{heads}/{kv_heads} heads of {head_dim}, token {t} [{e}]: {g} vs {w}"
            );
        }
    }
    // a field past its row, a weight too short
    let b = ctx.storage_f32("b", 256);
    let mut plan = Plan::new();
    let at = RowField {
        width: 64,
        offset: 8,
    };
    assert!(matches!(
        kernels.head_rms_norm(ctx, &mut plan, &b, at, 2, 32, &b, 1e-6, 1),
        Err(GpuError::Shape(_))
    ));
    let short = ctx.storage_f32("short", 16);
    assert!(matches!(
        kernels.head_rms_norm(
            ctx,
            &mut plan,
            &b,
            RowField::whole(64),
            2,
            32,
            &short,
            1e-6,
            1
        ),
        Err(GpuError::Shape(_))
    ));
}

/// rms_norm_add: residual + rms_norm(input) · w equals the residual plus rms_norm's output to
/// the roundings of the norm and the sum (the same shader arithmetic, then one f32 add, which a
/// driver may fuse with the weight's product, skipping the norm's rounding: NVIDIA's does), and
/// lean's CPU rms_norm to the sum's rounding; rows shorter and longer than what the threads hold.
#[test]
fn rms_norm_add_adds_the_norm_into_the_residual() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(302);
    for (width, n_tokens) in [(640, 1), (640, 7), (1000, 3), (5000, 2), (3, 2)] {
        let input = rng.floats(width * n_tokens, 3.0);
        let w = rng.floats(width, 2.0);
        let residual = rng.floats(width * n_tokens, 5.0);
        let eps = 1e-6;
        let (ib, wb, rb, nb) = (
            ctx.upload_f32("input", &input),
            ctx.upload_f32("w", &w),
            ctx.upload_f32("residual", &residual),
            ctx.storage_f32("norm", width * n_tokens),
        );
        submit(ctx, |p| {
            kernels.rms_norm(ctx, p, &ib, &wb, &nb, width, n_tokens, eps)?;
            kernels.rms_norm_add(ctx, p, &ib, &wb, &rb, width, n_tokens, eps)
        });
        let norm = read_f32(ctx, &nb, width * n_tokens);
        let got = read_f32(ctx, &rb, width * n_tokens);
        let added: Vec<f32> = residual.iter().zip(&norm).map(|(r, n)| r + n).collect();
        for (i, ((g, a), n)) in got.iter().zip(&added).zip(&norm).enumerate() {
            // half an ulp of the norm, one of the sum (seen on an H100: 7 ulp of a sum that
            // cancelled, under one of the residual)
            let ulp = ((n.abs() + a.abs()) * f32::EPSILON).max(f32::from_bits(1));
            assert!(
                (g - a).abs() <= ulp,
                "{width} x {n_tokens} [{i}]: {g} vs residual + norm {a}"
            );
        }
        let mut cpu = vec![0f32; width * n_tokens];
        lean::cpu::ops::rms_norm(&input, &w, eps, &mut cpu);
        for (i, ((&g, &c), &r)) in got.iter().zip(&cpu).zip(&residual).enumerate() {
            let want = r + c;
            assert!(
                (g - want).abs() <= 2e-6 * (c.abs() + r.abs()).max(1e-3),
                "{width} x {n_tokens} [{i}]: {g} vs {want}"
            );
        }
    }
}

/// gelu_pytorch_tanh in f64, as written (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))).
fn gelu_tanh_f64(x: f64) -> f64 {
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// GELU-tanh gating (gated_mul, gated_mul_pairs) against an f64 evaluation of the formula, on
/// values across the whole range: tiny, around the tanh's switch from its polynomial
/// (|inner| = 0.625), large of both signs (tanh saturating), within 1e-6 of 0.5 |x · up| (f32's
/// own rounding of x³ and the tanh, not a driver's tanh or exp); SiLU through gated_mul is
/// silu_mul bit for bit.
#[test]
fn gated_mul_gelu_tanh_matches_f64_formula() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(303);
    let mut gate: Vec<f32> = vec![
        0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1e-3, -1e-3, 0.75, 0.76, 0.77, -0.76, 1.0, -1.0, 3.0,
        -3.0, 5.5, -5.5, 9.0, -9.0, 20.0, -20.0, 100.0, -100.0, 1e10, -1e10,
    ];
    // a dense sweep of [-12, 12), then random values of every magnitude
    gate.extend((0..24_000).map(|i| -12.0 + i as f32 * 0.001));
    gate.extend((0..4000).map(|_| rng.unit() * 10f32.powf(rng.unit() * 4.0)));
    let n = gate.len();
    let up: Vec<f32> = (0..n)
        .map(|i| if i % 2 == 0 { 1.0 } else { rng.unit() * 4.0 })
        .collect();
    // [gate | up] rows of one token, and the same as [g0, u0, g1, u1, ...] pairs
    let rows: Vec<f32> = gate.iter().chain(&up).copied().collect();
    let pairs: Vec<f32> = gate.iter().zip(&up).flat_map(|(&g, &u)| [g, u]).collect();
    let (rb, pb) = (
        ctx.upload_f32("rows", &rows),
        ctx.upload_f32("pairs", &pairs),
    );
    let (out, out_pairs, silu, silu_ref) = (
        ctx.storage_f32("out", n),
        ctx.storage_f32("out pairs", n),
        ctx.storage_f32("silu", n),
        ctx.storage_f32("silu ref", n),
    );
    let fields = (
        RowField::whole(2 * n),
        RowField {
            width: 2 * n,
            offset: n,
        },
    );
    submit(ctx, |p| {
        kernels.gated_mul(ctx, p, &rb, fields, &out, n, 1, Activation::GeluTanh)?;
        kernels.gated_mul_pairs(ctx, p, &pb, &out_pairs, n, 1, Activation::GeluTanh)?;
        kernels.gated_mul(ctx, p, &rb, fields, &silu, n, 1, Activation::Silu)?;
        kernels.silu_mul(ctx, p, &rb, fields, &silu_ref, n, 1)
    });
    let got = read_f32(ctx, &out, n);
    assert_eq!(got, read_f32(ctx, &out_pairs, n), "pairs");
    assert_eq!(read_f32(ctx, &silu, n), read_f32(ctx, &silu_ref, n), "silu");
    let mut worst = 0f64;
    for i in 0..n {
        let (x, u) = (gate[i] as f64, up[i] as f64);
        let want = gelu_tanh_f64(x) * u;
        let scale = (0.5 * x * u).abs();
        let err = (got[i] as f64 - want).abs();
        worst = worst.max(err / scale.max(1e-300));
        assert!(
            err <= 1e-6 * scale,
            "gelu({x}) · {u}: {} vs {want} (error {:.2e} of 0.5 |x · up|)",
            got[i],
            err / scale
        );
    }
    eprintln!("gelu_tanh: worst error {worst:.2e} of 0.5 |x · up|");
}

/// Matvecs and matmuls with the GELU-tanh gating fused in (SWIGLU's pairs, the matvec's
/// act(x) · up, the matmul's K split with the gating in its second pass) equal the plain
/// product then gated_mul(_pairs) with GELU-tanh, bit for bit, with both matvec reductions.
#[test]
fn linear_fuses_gelu_tanh_gating() {
    let Some((ctx, default)) = gpu() else { return };
    let mut rng = Rng(304);
    let mut variants = vec![default];
    variants.extend(subgroup_kernels());
    let gelu = Activation::GeluTanh;
    for kernels in variants {
        for (ty, pairs, cols, n, part_rows) in [
            (TensorType::Q4_0, 23, 96, 1, 9),
            (TensorType::Q8_0, 40, 64, 1, 80),
            (TensorType::F32, 5, 70, 1, 3),
            (TensorType::Q4_0, 75, 96, 65, 1000),
            (TensorType::Q6_K, 70, 256, 9, 1000),
            // K split: the second pass gates
            (TensorType::Q4_0, 23, 800, 3, 18),
        ] {
            let rows = 2 * pairs;
            let w = random_matrix(&mut rng, ty, rows, cols);
            let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64 + 16;
            let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
            let x = ctx.upload_f32("x", &rng.floats(n * cols, 2.0));
            let (y, plain, fused) = (
                ctx.storage_f32("y", n * rows),
                ctx.storage_f32("plain", n * pairs),
                ctx.storage_f32("fused", n * pairs),
            );
            submit(ctx, |p| {
                let whole = RowField::whole(pairs);
                if n == 1 {
                    kernels.matvec(ctx, p, &m, &x, &y)?;
                    let extras = MatvecExtras {
                        swiglu: true,
                        activation: gelu,
                        ..Default::default()
                    };
                    kernels.matvec_with(ctx, p, &m, &x, (&fused, whole), extras)?;
                } else {
                    kernels.matmul(ctx, p, &m, &x, &y, n)?;
                    let extras = MatmulExtras {
                        swiglu: true,
                        activation: gelu,
                        ..Default::default()
                    };
                    kernels.matmul_with(ctx, p, &m, &x, (&fused, whole), n, extras)?;
                }
                kernels.gated_mul_pairs(ctx, p, &y, &plain, pairs, n, gelu)
            });
            assert_eq!(
                read_f32(ctx, &fused, n * pairs),
                read_f32(ctx, &plain, n * pairs),
                "{ty} {rows}x{cols}, {n} tokens"
            );
        }
        // act(x) · up read from [gate | up] by the down projection's matvec
        for (ty, rows, cols, part_rows) in [
            (TensorType::Q4_0, 45, 96, 20),
            (TensorType::Q6_K, 33, 512, 33),
            (TensorType::F32, 7, 1000, 3),
        ] {
            let w = random_matrix(&mut rng, ty, rows, cols);
            let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64;
            let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
            let width = cols + cols.next_multiple_of(32);
            let mut gate_up = rng.floats(width, 4.0);
            gate_up[2 * cols..].fill(0.0);
            let gub = ctx.upload_f32("gate_up", &gate_up);
            let (act, plain, fused) = (
                ctx.storage_f32("act", cols),
                ctx.storage_f32("plain", rows),
                ctx.storage_f32("fused", rows),
            );
            let field = |offset| RowField { width, offset };
            submit(ctx, |p| {
                let fields = (field(0), field(cols));
                kernels.gated_mul(ctx, p, &gub, fields, &act, cols, 1, gelu)?;
                kernels.matvec(ctx, p, &m, &act, &plain)?;
                let extras = MatvecExtras {
                    silu_up: Some((&gub, cols)),
                    activation: gelu,
                    ..Default::default()
                };
                kernels.matvec_with(ctx, p, &m, &gub, (&fused, RowField::whole(rows)), extras)
            });
            assert_eq!(
                read_f32(ctx, &fused, rows),
                read_f32(ctx, &plain, rows),
                "{ty} {rows}x{cols}: act · up"
            );
        }
    }
}

/// embed_scaled: every dequantized value times the scale in f32 (Gemma 3's sqrt(640) rounded to
/// f32), from a matrix split across bindings; scale 1 is embed.
#[test]
fn embed_scaled_multiplies_in_f32() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(305);
    let scale = (640f32).sqrt();
    for ty in [TensorType::Q4_K, TensorType::Q8_0, TensorType::F32] {
        let (rows, cols) = (29, ty.block_len().max(32) * 3);
        let w = random_matrix(&mut rng, ty, rows, cols);
        let limit = (ty.row_bytes(cols).unwrap() * 7 + 3) as u64;
        let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, limit).unwrap();
        let ids: Vec<u32> = vec![0, 28, 7, 6, 13];
        let idb = ctx.upload_bytes("ids", bytemuck_u32(&ids));
        let (plain, scaled, one) = (
            ctx.storage_f32("plain", ids.len() * cols),
            ctx.storage_f32("scaled", ids.len() * cols),
            ctx.storage_f32("one", ids.len() * cols),
        );
        submit(ctx, |p| {
            kernels.embed(ctx, p, &m, &idb, &plain, ids.len())?;
            kernels.embed_scaled(ctx, p, &m, &idb, &scaled, ids.len(), scale)?;
            kernels.embed_scaled(ctx, p, &m, &idb, &one, ids.len(), 1.0)
        });
        let plain = read_f32(ctx, &plain, ids.len() * cols);
        let want: Vec<f32> = plain.iter().map(|v| v * scale).collect();
        assert_eq!(read_f32(ctx, &scaled, ids.len() * cols), want, "{ty}");
        assert_eq!(read_f32(ctx, &one, ids.len() * cols), plain, "{ty}");
    }
}

/// Attention with a score scale and a sliding window (a query at p sees keys j with
/// p - j < window) against an f64 softmax over exactly those positions, through both paths
/// (rope_kv_store then attention: the prefill kernel for chunks of head_dim ≤ 128, split-K
/// otherwise; and fresh tokens, split-K): windows shorter than the position (decode and
/// chunks whose tokens cross the window's start, blocks whose later tokens' windows start past
/// the block's first step), longer than it (no effect), of 1, long decodes (a few splits over
/// the window of a long cache), head_dim 64, 80, 128 and 256. The cache before the earliest
/// window is NaN: one read of it would show.
#[test]
fn attention_sliding_window_and_scale() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(306);
    for (n_heads, n_kv_heads, head_dim, n_tokens, pos0, capacity, window, scale) in [
        (2, 1, 64, 1, 300, 400, 100, None),
        (2, 1, 64, 1, 50, 400, 100, Some(0.3)),
        (4, 2, 128, 40, 90, 200, 64, None),
        (2, 2, 64, 70, 0, 100, 30, Some(0.0625)),
        (3, 1, 256, 5, 20, 60, 16, Some(0.0625)),
        (2, 1, 256, 1, 700, 800, 300, None),
        (2, 1, 128, 1, 5000, 5001, 512, None),
        (2, 1, 64, 3, 10, 20, 1, None),
        (4, 1, 80, 33, 100, 140, 200, Some(0.2)),
        (6, 2, 64, 37, 5, 64, 7, None),
        (2, 1, 128, 64, 1000, 1100, 40, None),
    ] {
        let kv_dim = n_kv_heads * head_dim;
        let s = AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            n_tokens,
            capacity,
            cache_offset: kv_dim * capacity,
            scale: scale.unwrap_or(AttentionShape::default_scale(head_dim)),
            window: Some(window),
        };
        let q = rng.floats(n_tokens * n_heads * head_dim, 1.0);
        let mut k = rng.floats(2 * kv_dim * capacity, 1.0);
        let mut v = rng.floats(2 * kv_dim * capacity, 1.0);
        let k_new = rng.floats(n_tokens * kv_dim, 1.0);
        let v_new = rng.floats(n_tokens * kv_dim, 1.0);
        // positions no token sees: NaN
        let unseen: usize = (pos0 + 1usize).saturating_sub(window);
        for layer in 0..2 {
            for kv in 0..n_kv_heads {
                let base = layer * kv_dim * capacity + kv * capacity * head_dim;
                k[base..base + unseen * head_dim].fill(f32::NAN);
                v[base..base + unseen * head_dim].fill(f32::NAN);
            }
        }
        for t in 0..n_tokens {
            for j in 0..kv_dim {
                let at = s.cache_offset
                    + ((j / head_dim) * capacity + pos0 + t) * head_dim
                    + j % head_dim;
                k[at] = k_new[t * kv_dim + j];
                v[at] = v_new[t * kv_dim + j];
            }
        }
        let (width, fields) = qkv_layouts(n_heads * head_dim, kv_dim)[n_heads % 2];
        let fill = rng.floats(n_tokens * width, 1.0);
        let rows = qkv_rows((&q, &k_new, &v_new), n_tokens, width, fields, &fill);
        let step = StepBuffer::new(ctx);
        step.set(ctx, pos0).unwrap();
        let no_rope = Rope {
            rope_dim: 0,
            positions: capacity,
            pairing: RopePairing::Neox,
        };
        let table = ctx.storage_f32("no table", 4);
        // the reference, per output element: (value, sum of |p · v|)
        let mut want = Vec::with_capacity(n_tokens * n_heads * head_dim);
        for t in 0..n_tokens {
            let pos = pos0 + t;
            let first = (pos + 1).saturating_sub(window);
            for h in 0..n_heads {
                let base = s.cache_offset + h / (n_heads / n_kv_heads) * capacity * head_dim;
                let qh = &q[(t * n_heads + h) * head_dim..][..head_dim];
                let logits: Vec<f64> = (first..=pos)
                    .map(|p| {
                        (0..head_dim)
                            .map(|d| qh[d] as f64 * k[base + p * head_dim + d] as f64)
                            .sum::<f64>()
                            * s.scale as f64
                    })
                    .collect();
                let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for d in 0..head_dim {
                    let (mut value, mut abs) = (0.0, 0.0);
                    for (i, l) in logits.iter().enumerate() {
                        let pv =
                            (l - max).exp() / sum * v[base + (first + i) * head_dim + d] as f64;
                        value += pv;
                        abs += pv.abs();
                    }
                    want.push((value, abs));
                }
            }
        }
        for fresh in [false, true] {
            let (qkv, kb, vb) = (
                ctx.upload_f32("qkv", &rows),
                ctx.upload_f32("k", &cache_before(&k, &s, pos0)),
                ctx.upload_f32("v", &cache_before(&v, &s, pos0)),
            );
            let ob = ctx.storage_f32("out", n_tokens * n_heads * head_dim);
            let partials = ctx.storage_f32("partials", s.partials_len());
            submit(ctx, |p| {
                let q_at = (&qkv, fields[0]);
                if fresh {
                    let tokens = FreshTokens {
                        k: fields[1],
                        v: fields[2],
                        cos_sin: &table,
                        rope: no_rope,
                    };
                    let f = Some(tokens);
                    kernels.attention(ctx, p, &step, q_at, &kb, &vb, &partials, &ob, s, f)
                } else {
                    let rope = (&table, no_rope);
                    kernels.rope_kv_store(ctx, p, &step, &qkv, fields, (&kb, &vb), rope, s)?;
                    kernels.attention(ctx, p, &step, q_at, &kb, &vb, &partials, &ob, s, None)
                }
            });
            let got = read_f32(ctx, &ob, n_tokens * n_heads * head_dim);
            for (i, (&g, &(value, abs))) in got.iter().zip(&want).enumerate() {
                let (t, h, d) = (
                    i / (n_heads * head_dim),
                    i / head_dim % n_heads,
                    i % head_dim,
                );
                assert!(
                    (g as f64 - value).abs() <= 1e-5 * abs,
                    "fresh {fresh}: heads {n_heads}/{n_kv_heads} of {head_dim}, window {window}, \
                     token {t} at {} h {h} d {d}: {g} vs {value}",
                    pos0 + t
                );
            }
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same(&read_f32(ctx, &kb, k.len()), &k),
                "fresh {fresh}: keys"
            );
            assert!(
                same(&read_f32(ctx, &vb, v.len()), &v),
                "fresh {fresh}: values"
            );
        }
    }
}

/// A cache before a step at pos0: `after` with the step's positions of the layer at
/// `s.cache_offset` set to 0.5 (the step writes them).
fn cache_before(after: &[f32], s: &AttentionShape, pos0: usize) -> Vec<f32> {
    let mut before = after.to_vec();
    for kv in 0..s.n_kv_heads {
        for t in 0..s.n_tokens {
            let at = s.cache_offset + (kv * s.capacity + pos0 + t) * s.head_dim;
            before[at..at + s.head_dim].fill(0.5);
        }
    }
    before
}

/// Shapes attention refuses: a window of 0, a scale that is not finite.
#[test]
fn attention_rejects_bad_window_and_scale() {
    let Some((ctx, kernels)) = gpu() else { return };
    let b = ctx.storage_f32("b", 4096);
    let step = StepBuffer::new(ctx);
    let one = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 64,
        n_tokens: 1,
        capacity: 4,
        cache_offset: 0,
        scale: 0.125,
        window: None,
    };
    let whole = RowField::whole(64);
    for s in [
        AttentionShape {
            window: Some(0),
            ..one
        },
        AttentionShape {
            scale: f32::NAN,
            ..one
        },
    ] {
        let mut plan = Plan::new();
        let q = (&b, whole);
        assert!(matches!(
            kernels.attention(ctx, &mut plan, &step, q, &b, &b, &b, &b, s, None),
            Err(GpuError::Shape(_))
        ));
    }
    let mut plan = Plan::new();
    let ok = AttentionShape {
        window: Some(2),
        ..one
    };
    kernels
        .attention(ctx, &mut plan, &step, (&b, whole), &b, &b, &b, &b, ok, None)
        .expect("a window of 2");
}

/// A matvec of several tokens (a verification pass's) gives each token the bits of its own
/// one-token matvec, with every fusion (norm + bias + residual add into a field of wider rows,
/// SwiGLU pairs, act(gate) · up from [gate | up] rows), split parts, both reductions, one-block
/// and long rows, and 2, 3, 9 and MATVEC_MAX_TOKENS tokens; too many tokens and bad row widths
/// are refused. Every difference is reported, not the first.
#[test]
fn matvec_of_several_tokens_equals_each_tokens_own_bit_for_bit() {
    let Some((ctx, default)) = gpu() else { return };
    let mut rng = Rng(211);
    let mut variants = vec![("workgroup", default)];
    variants.extend(subgroup_kernels().map(|k| ("subgroup", k)));
    // every difference found, reported together
    let mut failures = Vec::new();
    for (reduction, kernels) in variants {
        for (ty, rows, cols, part_rows, n) in [
            (TensorType::Q4_0, 46, 96, 20, 3),
            (TensorType::Q8_0, 300, 2048, 300, MATVEC_MAX_TOKENS),
            (TensorType::Q6_K, 34, 512, 34, 2),
            (TensorType::Q4_K, 8, 4096, 4, 5),
            (TensorType::Q4_1, 6, 32, 6, 3),
            (TensorType::Q5_0, 10, 160, 10, 2),
            (TensorType::F32, 8, 1000, 3, 3),
            // few rows of long ones: the largest workgroups
            (TensorType::Q4_0, 4, 11008, 4, 4),
            // a verification pass of a guess of 8
            (TensorType::Q4_0, 100, 256, 100, 9),
        ] {
            let w = random_matrix(&mut rng, ty, rows, cols);
            let part = (ty.row_bytes(cols).unwrap() * part_rows) as u64 + 16;
            let m = GpuMatrix::upload_split(ctx, ty, rows, cols, &w, part).unwrap();
            let padded = cols.next_multiple_of(32);
            let mut norm = rng.floats(padded, 1.5);
            norm[cols..].fill(0.0);
            let norm = ctx.upload_f32("norm", &norm);
            // Token rows wider than the matrix's columns: [gate | gap | up] for act · up.
            let up_at = (cols + 4).next_multiple_of(4);
            let x_width = up_at + padded;
            let mut x = rng.floats(n * x_width, 2.0);
            for t in 0..n {
                x[t * x_width + up_at + cols..(t + 1) * x_width].fill(0.0);
            }
            let xb = ctx.upload_f32("x", &x);
            let token_x: Vec<_> = (0..n)
                .map(|t| ctx.upload_f32("x of a token", &x[t * x_width..(t + 1) * x_width]))
                .collect();
            // y: a field at offset 3 of rows 5 wider than the matrix's (with a bias as wide).
            let y_at = RowField {
                width: rows + 5,
                offset: 3,
            };
            let bias = ctx.upload_f32("bias", &rng.floats(rows + 5, 1.0));
            let residual = rng.floats(n * (rows + 5), 1.0);
            let pairs = rows / 2;
            let fusions: [(&str, MatvecExtras, RowField); 4] = [
                ("plain", MatvecExtras::default(), RowField::whole(rows)),
                (
                    "norm+bias+add",
                    MatvecExtras {
                        norm: Some((&norm, 1e-6)),
                        bias: Some(&bias),
                        accumulate: true,
                        ..Default::default()
                    },
                    y_at,
                ),
                (
                    "norm+swiglu",
                    MatvecExtras {
                        norm: Some((&norm, 1e-5)),
                        swiglu: true,
                        activation: Activation::GeluTanh,
                        ..Default::default()
                    },
                    RowField::whole(pairs),
                ),
                (
                    "act·up",
                    MatvecExtras {
                        silu_up: Some((&xb, up_at)),
                        ..Default::default()
                    },
                    RowField::whole(rows),
                ),
            ];
            for (what, extras, field) in fusions {
                let y_len = n * field.width;
                let together = ctx.upload_f32("together", &residual[..y_len]);
                // The one-token matvecs write their token's row: y viewed from that row on.
                let alone_rows: Vec<_> = (0..n)
                    .map(|t| {
                        let row = &residual[t * field.width..(t + 1) * field.width];
                        ctx.upload_f32("a token's y", row)
                    })
                    .collect();
                submit(ctx, |p| {
                    let many = MatvecExtras {
                        tokens: n,
                        x_width,
                        ..extras
                    };
                    kernels.matvec_with(ctx, p, &m, &xb, (&together, field), many)?;
                    for t in 0..n {
                        let one = MatvecExtras {
                            silu_up: extras.silu_up.map(|_| (&token_x[t], up_at)),
                            ..extras
                        };
                        kernels.matvec_with(
                            ctx,
                            p,
                            &m,
                            &token_x[t],
                            (&alone_rows[t], field),
                            one,
                        )?;
                    }
                    Ok(())
                });
                let got = read_f32(ctx, &together, y_len);
                for t in 0..n {
                    let want = read_f32(ctx, &alone_rows[t], field.width);
                    let row = &got[t * field.width..(t + 1) * field.width];
                    let differ: Vec<f32> = row
                        .iter()
                        .zip(&want)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .map(|(a, b)| ((a - b) / b.abs().max(1e-30)).abs())
                        .collect();
                    if !differ.is_empty() {
                        failures.push(format!(
                            "{reduction} {ty} {rows}x{cols} {what}, {n} tokens: token {t}: {} of {} values differ from its own matvec's (largest relative difference {:e})",
                            differ.len(),
                            row.len(),
                            differ.iter().fold(0f32, |m, &d| m.max(d))
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Refused, not recorded: more tokens than a dispatch takes, x rows closer than a row or
    // not 16-byte aligned, x or y too short for the tokens.
    let kernels = default;
    let w = random_matrix(&mut rng, TensorType::Q4_0, 4, 64);
    let m = GpuMatrix::upload(ctx, TensorType::Q4_0, 4, 64, &w).unwrap();
    let (x, y) = (ctx.storage_f32("x", 3 * 64), ctx.storage_f32("y", 3 * 4));
    for (tokens, x_width, y_field) in [
        (MATVEC_MAX_TOKENS + 1, 64, RowField::whole(4)),
        (2, 32, RowField::whole(4)),
        (2, 66, RowField::whole(4)),
        (4, 64, RowField::whole(4)),
        (3, 64, RowField::whole(5)),
    ] {
        let extras = MatvecExtras {
            tokens,
            x_width,
            ..Default::default()
        };
        let refused = kernels.matvec_with(ctx, &mut Plan::new(), &m, &x, (&y, y_field), extras);
        assert!(
            matches!(refused, Err(GpuError::Shape(_))),
            "{tokens} tokens, x rows {x_width} apart, y {y_field:?}: {refused:?}"
        );
    }
}

/// The argmax of several rows (a verification pass's logits) equals each row's own, ties
/// included, each at its row's place in the result.
#[test]
fn argmax_of_rows_equals_each_rows_own() {
    let Some((ctx, kernels)) = gpu() else { return };
    let mut rng = Rng(223);
    for (n, rows) in [(49_152, 5), (1000, 3), (151_936, 2), (7, 16)] {
        let mut values = rng.floats(n * rows, 30.0);
        // a tie in row 1: the lower index wins
        if rows > 1 && n > 600 {
            values[n + 17] = 99.0;
            values[n + 600] = 99.0;
        }
        let vb = ctx.upload_f32("values", &values);
        let len = argmax_len(n);
        let result = ctx.storage_f32("argmax", rows * len);
        submit(ctx, |e| kernels.argmax_rows(ctx, e, &vb, &result, n, rows));
        let got = read_u32(ctx, &result, rows * len);
        for r in 0..rows {
            let row = &values[r * n..(r + 1) * n];
            let want = lean::sampling::argmax(row);
            assert_eq!(got[r * len], want, "row {r} of {rows} × {n}");
        }
        if rows > 1 && n > 600 {
            assert_eq!(got[len], 17);
        }
    }
}
