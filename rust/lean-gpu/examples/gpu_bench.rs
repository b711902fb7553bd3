//! Memory bandwidth of the matvec kernels on the adapter wgpu picks, against a plain read
//! kernel on the same adapter (decode is one matvec per weight matrix, so GB/s of weight bytes
//! is its speed).
//!
//! GPU time comes from timestamp queries around a run of dispatches when the adapter has
//! TIMESTAMP_QUERY, else from the wall clock around one submission of the run. Each case
//! rotates over enough copies of its matrix that they exceed any last-level cache, so every
//! dispatch streams its weights from memory; dispatches write one `y`, so consecutive ones are
//! ordered as in a forward pass, and small matrices show the per-dispatch cost.
//!
//! Every matvec case runs with the default kernels (the reduction in workgroup memory) and,
//! where the adapter has subgroups, again with `Kernels::with_subgroup_matvec`.
//!
//! The decode attention (attention + its combine pass, as a decode step records them: the step's
//! token unrotated in its q|k|v row) runs for the head shapes of the benchmark models at a few
//! context lengths, rotating over one KV cache per layer as a forward pass does.
//!
//! `tokens` runs instead the matvecs of a verification pass (speculative decoding): each decode
//! matvec of Qwen2.5-3B's shapes with its fusions, for 1 to 16 tokens, the time per dispatch
//! and against one token's.
//!
//! Run: `cargo run --release --example gpu_bench [-- [--small] [TYPE...] [attention | tokens]]`
//! (`--small`, or a CPU adapter such as lavapipe, uses shapes a tenth the size and fewer
//! repetitions; type names such as Q4_0 Q6_K restrict the matvec cases to those types,
//! `attention` alone runs only the read kernels and the attention cases).
use lean_gpu::wgpu;
use lean_gpu::{
    rope_cos_sin, AttentionShape, FreshTokens, GpuContext, GpuMatrix, Kernels, MatvecExtras, Plan,
    Rope, RopePairing, RowField, StepBuffer,
};
use lean_quant::{scalar, TensorType};
use std::time::Instant;

/// Bytes each case streams per timed run (a few milliseconds at HBM speeds).
const RUN_BYTES_GPU: u64 = 16 << 30;
const RUN_BYTES_SMALL: u64 = 64 << 20;
/// The copies of one matrix add up to at least this many bytes (H200's L2 is 60 MB).
const ROTATION_BYTES_GPU: u64 = 512 << 20;
const ROTATION_BYTES_SMALL: u64 = 32 << 20;
const MAX_DISPATCHES: u64 = 2000;
const TRIALS: usize = 3;

/// (rows, cols) of the decode matvecs of Qwen2.5-0.5B (hidden 896, kv 128, FFN 4864) and
/// Qwen2.5-3B (hidden 2048, kv 256, FFN 11008), both with a vocabulary of 151936.
const SHAPES: [(usize, usize); 10] = [
    (896, 896),
    (128, 896),
    (4864, 896),
    (896, 4864),
    (151936, 896),
    (2048, 2048),
    (256, 2048),
    (11008, 2048),
    (2048, 11008),
    (151936, 2048),
];
const TYPES: [TensorType; 4] = [
    TensorType::Q4_0,
    TensorType::Q8_0,
    TensorType::Q6_K,
    TensorType::Q4_K,
];

/// Sums words of a buffer with a grid-stride loop; the result is written only if it equals
/// an impossible value, so the loads cannot be dropped and nothing else touches memory.
const READ_VEC4: &str = "
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    var acc = vec4<u32>(0u);
    let n = arrayLength(&src);
    for (var i = gid.x; i < n; i += groups.x * 256u) {
        acc ^= src[i];
    }
    let v = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (v == 0x9E3779B9u) { sink[0] = v; }
}";
const READ_U32: &str = "
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    var acc = 0u;
    let n = arrayLength(&src);
    for (var i = gid.x; i < n; i += groups.x * 256u) {
        acc ^= src[i];
    }
    if (acc == 0x9E3779B9u) { sink[0] = acc; }
}";

struct Timer {
    queries: Option<(wgpu::QuerySet, wgpu::Buffer)>,
}

impl Timer {
    fn new(ctx: &GpuContext) -> Self {
        let queries = ctx
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            .then(|| {
                let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("bench"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2,
                });
                let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamps"),
                    size: 16,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                (set, resolved)
            });
        Timer { queries }
    }

    fn method(&self) -> &'static str {
        if self.queries.is_some() {
            "timestamp queries"
        } else {
            "wall clock"
        }
    }

    /// Seconds of GPU time of the commands `record` adds to one submission. Timestamps come
    /// from empty passes before and after them (Vulkan writes them once all earlier work is
    /// done), so the run needs no change to the kernels' own passes.
    fn time(&self, ctx: &GpuContext, record: impl FnOnce(&mut wgpu::CommandEncoder)) -> f64 {
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let stamp = |encoder: &mut wgpu::CommandEncoder, index: u32| {
            if let Some((set, _)) = &self.queries {
                let writes = wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(index),
                    end_of_pass_write_index: None,
                };
                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(writes),
                });
            }
        };
        stamp(&mut encoder, 0);
        record(&mut encoder);
        stamp(&mut encoder, 1);
        if let Some((set, resolved)) = &self.queries {
            encoder.resolve_query_set(set, 0..2, resolved, 0);
        }
        let start = Instant::now();
        ctx.queue.submit([encoder.finish()]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("device alive");
        let wall = start.elapsed().as_secs_f64();
        match &self.queries {
            None => wall,
            Some((_, resolved)) => {
                let read = ctx.read_bytes(resolved, 16);
                ctx.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .expect("device alive");
                let bytes = pollster::block_on(read).expect("timestamps");
                let ticks: &[u64] = bytemuck::cast_slice(&bytes);
                ticks[1].wrapping_sub(ticks[0]) as f64
                    * ctx.queue.get_timestamp_period() as f64
                    * 1e-9
            }
        }
    }

    /// The fastest of `TRIALS` runs after one warm-up.
    fn best(&self, ctx: &GpuContext, mut record: impl FnMut(&mut wgpu::CommandEncoder)) -> f64 {
        self.time(ctx, &mut record);
        (0..TRIALS)
            .map(|_| self.time(ctx, &mut record))
            .fold(f64::INFINITY, f64::min)
    }
}

/// At least three significant digits: GB/s run from below 1 (lavapipe) to thousands.
fn three_digits(v: f64) -> String {
    let decimals = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else if v >= 1.0 {
        2
    } else {
        3
    };
    format!("{v:.decimals$}")
}

/// splitmix64 bytes: weights need no structure to be timed.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Uniform in [-0.5, 0.5].
fn random_floats(n: usize) -> Vec<f32> {
    random_bytes(n * 4, n as u64)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as f32 / u32::MAX as f32 - 0.5)
        .collect()
}

/// Random quants with every f16 scale set to 0.01 (F32: values in [-0.5, 0.5]), so the spot
/// check sees finite values.
fn random_matrix(ty: TensorType, rows: usize, cols: usize) -> Vec<u8> {
    if ty == TensorType::F32 {
        return random_floats(rows * cols)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    }
    let mut w = random_bytes(
        rows * ty.row_bytes(cols).expect("whole blocks"),
        rows as u64 ^ cols as u64,
    );
    let scale_fields: &[usize] = match ty {
        TensorType::Q4_0 | TensorType::Q8_0 => &[0],
        TensorType::Q4_K => &[0, 2],
        TensorType::Q6_K => &[208],
        _ => &[],
    };
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for block in w.chunks_exact_mut(ty.block_bytes()) {
        for &at in scale_fields {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    w
}

fn read_bandwidth(ctx: &GpuContext, timer: &Timer, name: &str, source: &str, bytes: u64) {
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
    let pipeline = ctx
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
    let bytes = bytes.min(ctx.max_binding_bytes() & !15);
    let src = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("src"),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let sink = ctx.storage_f32("sink", 1);
    let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: sink.as_entire_binding(),
            },
        ],
    });
    let reps = 10;
    for loads_per_thread in [4u64, 16, 64] {
        let word_bytes = if source.contains("vec4") { 16 } else { 4 };
        let groups = (bytes / word_bytes / 256 / loads_per_thread)
            .clamp(1, ctx.limits().max_compute_workgroups_per_dimension as u64)
            as u32;
        let seconds = timer.best(ctx, |encoder| {
            for _ in 0..reps {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(groups, 1, 1);
            }
        });
        let gbs = (bytes * reps) as f64 / seconds / 1e9;
        println!(
            "| {name} | {} MiB | {groups} groups | {:.1} µs | {} |",
            bytes >> 20,
            seconds / reps as f64 * 1e6,
            three_digits(gbs)
        );
    }
}

/// Rows 0 and rows - 1 of one matvec against lean-quant's scalar dequantization.
fn spot_check(
    ctx: &GpuContext,
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &wgpu::Buffer,
) {
    let future = ctx.read_f32(y, rows);
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("device alive");
    let got = pollster::block_on(future).expect("readback");
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut weights = vec![0f32; cols];
    for r in [0, rows - 1] {
        scalar::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut weights);
        let (want, abs) = weights
            .iter()
            .zip(x)
            .fold((0f64, 0f64), |(s, a), (&wv, &xv)| {
                (s + wv as f64 * xv as f64, a + (wv as f64 * xv as f64).abs())
            });
        assert!(
            (got[r] as f64 - want).abs() <= 1e-5 * abs,
            "{ty} {rows}x{cols} row {r}: {} vs {want}",
            got[r]
        );
    }
}

fn main() {
    let small = std::env::args().any(|a| a == "--small");
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    for adapter in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())) {
        let i = adapter.get_info();
        println!(
            "found adapter: {} ({:?}, {:?}, driver {} {})",
            i.name, i.backend, i.device_type, i.driver, i.driver_info
        );
    }
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    let adapter = match pollster::block_on(instance.request_adapter(&options)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("no adapter: {e}");
            std::process::exit(1);
        }
    };
    let timestamps = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
    let ctx = pollster::block_on(GpuContext::from_adapter(&adapter, timestamps)).expect("device");
    let kernels = pollster::block_on(Kernels::new(&ctx)).expect("kernels compile");
    let subgroup = match pollster::block_on(Kernels::with_subgroup_matvec(&ctx)) {
        Ok(k) => Some(k),
        Err(lean_gpu::GpuError::MissingFeatures(_)) => None,
        Err(e) => panic!("subgroup kernels: {e}"),
    };
    // (name, kernels, fusion: 0 plain, 1 RMS norm of x, 2 silu(x) · up)
    let mut variants = vec![
        ("default", &kernels, 0),
        ("default+norm", &kernels, 1),
        ("default+silu", &kernels, 2),
    ];
    variants.extend(subgroup.as_ref().map(|k| ("subgroup", k, 0)));
    let small = small || ctx.adapter_info().device_type == wgpu::DeviceType::Cpu;
    let (run_bytes, rotation_bytes) = if small {
        (RUN_BYTES_SMALL, ROTATION_BYTES_SMALL)
    } else {
        (RUN_BYTES_GPU, ROTATION_BYTES_GPU)
    };
    let timer = Timer::new(&ctx);
    println!("adapter: {}", ctx.describe());
    println!(
        "timing: {}; max storage binding {} MiB\n",
        timer.method(),
        ctx.max_binding_bytes() >> 20
    );

    println!("| read kernel | buffer | dispatch | time/dispatch | GB/s |\n|---|---|---|---|---|");
    let read_bytes = if small { 64 << 20 } else { 2 << 30 };
    read_bandwidth(&ctx, &timer, "read vec4<u32>", READ_VEC4, read_bytes);
    read_bandwidth(&ctx, &timer, "read u32", READ_U32, read_bytes);

    if only.iter().any(|o| o == "tokens") {
        let kernels = subgroup.as_ref().unwrap_or(&kernels);
        tokens_bench(&ctx, &timer, kernels, small, rotation_bytes);
        return;
    }
    let attention_only = !only.is_empty() && only.iter().all(|o| o == "attention");
    if only.is_empty() || only.iter().any(|o| o == "attention") {
        attention_bench(&ctx, &timer, &kernels, small);
    }
    if attention_only {
        return;
    }

    println!("\n| type | rows x cols | weight MB | kernels | copies | dispatches | time/dispatch | GB/s |\n|---|---|---|---|---|---|---|---|");
    // The cost of a dispatch itself (an 8 x 32 matrix); then F32, whose loads are all
    // contiguous, as the skeleton's own streaming rate.
    let cases = [
        (TensorType::Q4_0, (8, 32)),
        (TensorType::F32, (8192, 2048)),
        (TensorType::F32, (151936, 2048)),
    ]
    .into_iter()
    .chain(
        TYPES
            .into_iter()
            .flat_map(|ty| SHAPES.map(|shape| (ty, shape))),
    )
    // K-quants only where the rows are whole 256-element blocks (not 896)
    .filter(|(ty, (_, cols))| ty.row_bytes(*cols).is_some())
    .filter(|(ty, _)| only.is_empty() || only.iter().any(|o| o.eq_ignore_ascii_case(ty.name())));
    for (ty, (rows, cols)) in cases {
        let rows = if small && rows > 8 { rows / 10 } else { rows };
        let w = random_matrix(ty, rows, cols);
        let bytes = w.len() as u64;
        let copies = rotation_bytes.div_ceil(bytes).clamp(1, 256) as usize;
        let matrices: Vec<GpuMatrix> = (0..copies)
            .map(|_| GpuMatrix::upload(&ctx, ty, rows, cols, &w).expect("upload"))
            .collect();
        let x = random_floats(cols);
        let xb = ctx.upload_f32("x", &x);
        let yb = ctx.storage_f32("y", rows);
        // the norm's weights padded to whole units, as the session uploads them
        let norm = ctx.upload_f32("norm", &random_floats(cols.next_multiple_of(32)));
        let up = ctx.upload_f32("up", &random_floats(cols.next_multiple_of(32)));
        let dispatches = run_bytes
            .div_ceil(bytes)
            .clamp(copies as u64, MAX_DISPATCHES) as usize;
        for &(variant, kernels, fusion) in &variants {
            let extras = MatvecExtras {
                norm: (fusion == 1).then_some((&norm, 1e-6)),
                silu_up: (fusion == 2).then_some((&up, 0)),
                ..Default::default()
            };
            // All dispatches recorded into one plan: one compute pass, as a forward pass runs.
            let mut plan = Plan::new();
            for m in matrices.iter().cycle().take(dispatches) {
                let at = RowField::whole(rows);
                kernels
                    .matvec_with(&ctx, &mut plan, m, &xb, (&yb, at), extras)
                    .expect("matvec");
            }
            let seconds = timer.best(&ctx, |encoder| plan.encode(encoder));
            if fusion == 0 {
                spot_check(&ctx, ty, &w, rows, cols, &x, &yb);
            }
            let per = seconds / dispatches as f64;
            println!(
                "| {ty} | {rows}x{cols} | {} | {variant} | {copies} | {dispatches} | {:.1} µs | {} |",
                three_digits(bytes as f64 / 1e6),
                per * 1e6,
                three_digits(bytes as f64 / per / 1e9)
            );
        }
    }
}

/// Decode attention (one token, fresh from its q|k|v row) per head shape and context length:
/// GPU time of one `Kernels::attention` call (its dispatches), averaged over a run that
/// rotates over `LAYERS` caches.
fn attention_bench(ctx: &GpuContext, timer: &Timer, kernels: &Kernels, small: bool) {
    const LAYERS: usize = 36;
    let calls = if small { LAYERS } else { 10 * LAYERS };
    println!("| heads / kv heads x head_dim | rope | window | context (capacity) | time/call |\n|---|---|---|---|---|");
    // (model, heads, kv heads, head_dim, pairing, sliding window)
    let models = [
        ("qwen2.5-3b", 16, 2, 128, RopePairing::Neox, None),
        ("qwen2.5-0.5b", 14, 2, 64, RopePairing::Neox, None),
        ("smollm2-1.7b", 32, 32, 64, RopePairing::Interleaved, None),
        // Gemma 3 270M's global and sliding (512) layers
        ("gemma-3-270m", 4, 1, 256, RopePairing::Neox, None),
        ("gemma-3-270m", 4, 1, 256, RopePairing::Neox, Some(512)),
    ];
    let contexts: &[(usize, usize)] = if small {
        &[(64, 80), (576, 640)]
    } else {
        &[(64, 640), (576, 640), (2000, 4096), (4000, 4096)]
    };
    for (model, n_heads, n_kv_heads, head_dim, pairing, window) in models {
        for &(len, capacity) in contexts {
            let kv_dim = n_kv_heads * head_dim;
            let width = n_heads * head_dim + 2 * kv_dim;
            let s = AttentionShape {
                n_heads,
                n_kv_heads,
                head_dim,
                n_tokens: 1,
                capacity,
                cache_offset: 0,
                scale: AttentionShape::default_scale(head_dim),
                window,
            };
            let rope = Rope {
                rope_dim: head_dim,
                positions: capacity,
                pairing,
            };
            let table = rope_cos_sin(head_dim, 1e6, 1.0, capacity);
            let tb = ctx.upload_f32("cos_sin", table.as_flattened());
            let qkv = ctx.upload_f32("qkv", &random_floats(width));
            let caches: Vec<(wgpu::Buffer, wgpu::Buffer)> = (0..LAYERS)
                .map(|_| {
                    let cache = random_floats(kv_dim * capacity);
                    (
                        ctx.upload_f32("keys", &cache),
                        ctx.upload_f32("values", &cache),
                    )
                })
                .collect();
            let partials = ctx.storage_f32("partials", s.partials_len());
            let out = ctx.storage_f32("out", n_heads * head_dim);
            let step = StepBuffer::new(ctx);
            step.set(ctx, len - 1).expect("step");
            let mut plan = Plan::new();
            for (keys, values) in caches.iter().cycle().take(calls) {
                let fresh = FreshTokens {
                    k: RowField {
                        width,
                        offset: n_heads * head_dim,
                    },
                    v: RowField {
                        width,
                        offset: n_heads * head_dim + kv_dim,
                    },
                    cos_sin: &tb,
                    rope,
                };
                let q = (&qkv, RowField { width, offset: 0 });
                kernels
                    .attention(
                        ctx,
                        &mut plan,
                        &step,
                        q,
                        keys,
                        values,
                        &partials,
                        &out,
                        s,
                        Some(fresh),
                    )
                    .expect("attention");
            }
            let seconds = timer.best(ctx, |encoder| plan.encode(encoder));
            println!(
                "| {model}: {n_heads} / {n_kv_heads} x {head_dim} | {pairing:?} | {window:?} | {len} ({capacity}) | {:.2} µs |",
                seconds / calls as f64 * 1e6
            );
        }
    }
    println!();
}

/// The matvecs of a verification pass of `tokens` tokens at Qwen2.5-3B's shapes (hidden 2048,
/// FFN 11008, 16 + 2 + 2 heads of 128, vocabulary 151936), as a decode step fuses them: time per
/// dispatch for 1 to 16 tokens, rotating over copies of each matrix as `main` does.
fn tokens_bench(
    ctx: &GpuContext,
    timer: &Timer,
    kernels: &Kernels,
    small: bool,
    rotation_bytes: u64,
) {
    println!("matvec of several tokens\n");
    println!("| matvec | type | rows x cols | tokens | time/dispatch | x one token | per token |\n|---|---|---|---|---|---|---|");
    // (name, type, rows, cols, fusion: 0 plain, 1 norm + bias (q|k|v), 2 norm + SwiGLU pairs,
    // 3 residual add)
    let cases = [
        ("q,k,v", TensorType::Q4_0, 2560, 2048, 1),
        ("o", TensorType::Q4_0, 2048, 2048, 3),
        ("gate,up", TensorType::Q4_0, 22016, 2048, 2),
        ("down", TensorType::Q4_0, 2048, 11008, 3),
        ("head", TensorType::Q8_0, 151936, 2048, 1),
        ("head", TensorType::Q6_K, 151936, 2048, 1),
    ];
    let width = 11008 + 4;
    for (name, ty, rows, cols, fusion) in cases {
        // (even: SwiGLU's rows are pairs)
        let rows = if small { rows / 20 * 2 } else { rows };
        let w = random_matrix(ty, rows, cols);
        let bytes = w.len() as u64;
        let copies = rotation_bytes.div_ceil(bytes).clamp(1, 64) as usize;
        let matrices: Vec<GpuMatrix> = (0..copies)
            .map(|_| GpuMatrix::upload(ctx, ty, rows, cols, &w).expect("upload"))
            .collect();
        let x = ctx.upload_f32("x", &random_floats(16 * width));
        let y = ctx.upload_f32("y", &random_floats(16 * rows));
        let norm = ctx.upload_f32("norm", &random_floats(cols.next_multiple_of(32)));
        let bias = ctx.upload_f32("bias", &random_floats(rows));
        let dispatches = (4 * copies).max(32);
        let mut one = 0.0;
        for tokens in [1, 2, 3, 4, 5, 8, 9, 16] {
            let extras = MatvecExtras {
                norm: (fusion == 1 || fusion == 2).then_some((&norm, 1e-6)),
                bias: (fusion == 1).then_some(&bias),
                swiglu: fusion == 2,
                accumulate: fusion == 3,
                tokens,
                x_width: width,
                ..Default::default()
            };
            let field = RowField::whole(if fusion == 2 { rows / 2 } else { rows });
            let mut plan = Plan::new();
            for m in matrices.iter().cycle().take(dispatches) {
                kernels
                    .matvec_with(ctx, &mut plan, m, &x, (&y, field), extras)
                    .expect("matvec");
            }
            let per = timer.best(ctx, |encoder| plan.encode(encoder)) / dispatches as f64;
            if tokens == 1 {
                one = per;
            }
            println!(
                "| {name} | {ty} | {rows}x{cols} | {tokens} | {:.1} µs | {:.2} | {:.1} µs |",
                per * 1e6,
                per / one,
                per / tokens as f64 * 1e6
            );
        }
    }
}
