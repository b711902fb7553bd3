//! Probe of wgpu's cooperative matrices (tensor cores), for planning a prefill matmul on them:
//! lists the adapter's configurations and, where f16 16×16×16 with f32 accumulators exists,
//! times plain f16 matmuls through `coop_mat16x16` (naga's `wgpu_cooperative_matrix`) at
//! prefill shapes — tiles loaded straight from storage, and staged through workgroup memory
//! in two block sizes — each checked against the CPU. Native only; wgpu marks the feature
//! experimental. Results: BENCHMARKS.md (session 12).
//!
//!   cargo run --release -p lean-gpu --example coop_probe           (needs the feature)
//!   cargo run --release -p lean-gpu --example coop_probe -- --wgsl (the generated shader)
use half::f16;
use std::time::Instant;
use wgpu::util::DeviceExt;

/// y[m][n] = Σ_k x[m][k] · w[n][k] (x: tokens × K, w: rows × K, both row-major, like a prefill
/// matmul): each workgroup (one subgroup) owns a 32 × 32 block of y as 2 × 2 tiles, loading
/// 16 × 16 tiles of x (A, row-major) and of wᵀ (B: w row-major is wᵀ column-major) straight
/// from storage.
const DIRECT: &str = r#"
enable f16;
enable wgpu_cooperative_matrix;

struct Dims { m: u32, n: u32, k: u32, _pad: u32 }
@group(0) @binding(0) var<uniform> d: Dims;
@group(0) @binding(1) var<storage, read> x: array<f16>;
@group(0) @binding(2) var<storage, read> w: array<f16>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * 32u;
    let n0 = wid.x * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k = 0u; k < d.k; k += 16u) {
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&x[m0 * d.k + k], d.k);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&x[(m0 + 16u) * d.k + k], d.k);
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&w[n0 * d.k + k], d.k);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&w[(n0 + 16u) * d.k + k], d.k);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
    }
    STORE
}
"#;

/// As DIRECT, with 4 subgroups per workgroup sharing a 64 × 64 block of y: each K step of 32
/// stages the block's x and w tiles in workgroup memory (16-byte loads, as a quantized
/// kernel's decode would write them), and the subgroups load their 16 × 16 tiles from there.
const STAGED: &str = r#"
enable f16;
enable wgpu_cooperative_matrix;

struct Dims { m: u32, n: u32, k: u32, _pad: u32 }
@group(0) @binding(0) var<uniform> d: Dims;
@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const BK: u32 = 32u;
var<workgroup> xs: array<f16, 64 * 32>; // [m][k]
var<workgroup> ws: array<f16, 64 * 32>; // [n][k]: wᵀ column-major

fn put(tile: u32, at: u32, v: vec4<u32>) {
    let h = array<vec2<f32>, 4>(unpack2x16float(v.x), unpack2x16float(v.y),
                                unpack2x16float(v.z), unpack2x16float(v.w));
    for (var e = 0u; e < 8u; e++) {
        let value = f16(h[e / 2u][e % 2u]);
        if (tile == 0u) {
            xs[at + e] = value;
        } else {
            ws[at + e] = value;
        }
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let bm = wid.y * 64u;
    let bn = wid.x * 64u;
    let sg = lid / 32u;
    let m0 = bm + (sg / 2u) * 32u;
    let n0 = bn + (sg % 2u) * 32u;
    let sm = (sg / 2u) * 32u;
    let sn = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < d.k; k0 += BK) {
        for (var j = 0u; j < 2u; j++) {
            let i = lid + j * 128u;
            let r = i / 4u;
            let q = i % 4u;
            put(0u, r * BK + q * 8u, x[((bm + r) * d.k + k0) / 8u + q]);
            put(1u, r * BK + q * 8u, w[((bn + r) * d.k + k0) / 8u + q]);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[sm * BK + kk], BK);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[(sm + 16u) * BK + kk], BK);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws[sn * BK + kk], BK);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws[(sn + 16u) * BK + kk], BK);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    STORE
}
"#;

/// STAGED with 4 × 4 tiles (64 × 64 of y) per subgroup and a 128 × 128 block per workgroup:
/// 16 multiply-adds per 8 tile loads, half the staging per multiply-add.
fn staged_big() -> String {
    let tiles: Vec<(usize, usize)> = (0..4).flat_map(|i| (0..4).map(move |j| (i, j))).collect();
    let mut body = String::new();
    for &(i, j) in &tiles {
        body += &format!("    var c{i}{j} = coop_mat16x16<f32, C>();\n");
    }
    body += "    for (var k0 = 0u; k0 < d.k; k0 += BK) {\n";
    body += "        for (var j = 0u; j < 4u; j++) {\n            let i = lid + j * 128u;\n            let r = i / 4u;\n            let q = i % 4u;\n";
    body += "            put(0u, r * BK + q * 8u, x[((bm + r) * d.k + k0) / 8u + q]);\n            put(1u, r * BK + q * 8u, w[((bn + r) * d.k + k0) / 8u + q]);\n        }\n";
    body += "        workgroupBarrier();\n        for (var kk = 0u; kk < BK; kk += 16u) {\n";
    for i in 0..4 {
        body += &format!("            let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&xs[(sm + {}u) * BK + kk], BK);\n", 16 * i);
        body += &format!("            let b{i} = coopLoad<coop_mat16x16<f16, B>>(&ws[(sn + {}u) * BK + kk], BK);\n", 16 * i);
    }
    for &(i, j) in &tiles {
        body += &format!("            c{i}{j} = coopMultiplyAdd(a{i}, b{j}, c{i}{j});\n");
    }
    body += "        }\n        workgroupBarrier();\n    }\n    let n = d.n;\n";
    for &(i, j) in &tiles {
        body += &format!(
            "    let r{i}{j} = c{i}{j};\n    let p{i}{j} = &y[(m0 + {}u) * n + n0 + {}u];\n",
            16 * i,
            16 * j
        );
    }
    body += "    var flush = 0u;\n    flush = n;\n";
    for &(i, j) in &tiles {
        body += &format!("    coopStoreT(r{i}{j}, p{i}{j}, n);\n");
    }
    let head = STAGED.split("@compute").next().unwrap_or_default();
    let head = head
        .replace("array<f16, 64 * 32>", "array<f16, 128 * 32>")
        .replace("// [m][k]", "// [m][k], 128 rows")
        .replace(
            "// [n][k]: wᵀ column-major",
            "// [n][k]: wᵀ column-major, 128 rows",
        );
    format!(
        "{head}@compute @workgroup_size(128)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    let bm = wid.y * 128u;\n    let bn = wid.x * 128u;\n    let sg = lid / 32u;\n    let sm = (sg / 2u) * 64u;\n    let sn = (sg % 2u) * 64u;\n    let m0 = bm + sm;\n    let n0 = bn + sn;\n{body}}}\n"
    )
}

/// The 2 × 2 tiles' stores at (m0, n0). naga 30 lowers coopStore without emitting the
/// expressions before it: its operands are computed first, and a store to a local variable
/// emits them.
const STORE: &str = "
    let n = d.n;
    let r00 = c00;
    let r01 = c01;
    let r10 = c10;
    let r11 = c11;
    let p00 = &y[m0 * n + n0];
    let p01 = &y[m0 * n + n0 + 16u];
    let p10 = &y[(m0 + 16u) * n + n0];
    let p11 = &y[(m0 + 16u) * n + n0 + 16u];
    var flush = 0u;
    flush = n;
    coopStoreT(r00, p00, n);
    coopStoreT(r01, p01, n);
    coopStoreT(r10, p10, n);
    coopStoreT(r11, p11, n);
";

fn main() {
    if std::env::args().any(|a| a == "--wgsl") {
        // the generated shader, for checking it with naga where no adapter has the feature
        print!("{}", staged_big());
        return;
    }
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    let adapter = match pollster::block_on(instance.request_adapter(&options)) {
        Ok(a) => a,
        Err(e) => {
            println!("coop probe: no adapter ({e})");
            return;
        }
    };
    let info = adapter.get_info();
    println!(
        "coop probe: {} ({:?}, driver {})",
        info.name, info.backend, info.driver_info
    );
    let props = adapter.cooperative_matrix_properties();
    let wanted = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    println!(
        "  features: cooperative matrix {}, shader-f16 {}; {} configurations",
        adapter
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
        adapter.features().contains(wgpu::Features::SHADER_F16),
        props.len()
    );
    for p in &props {
        println!(
            "  M{} N{} K{} A/B {:?} C {:?}",
            p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
        );
    }
    let f16_f32 = props.iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    });
    if !f16_f32 || !adapter.features().contains(wanted) {
        println!("  no f16 16x16x16 -> f32 configuration: nothing to time");
        return;
    }
    let limits = adapter.limits();
    let descriptor = wgpu::DeviceDescriptor {
        label: Some("coop probe"),
        required_features: wanted,
        required_limits: limits,
        // SAFETY: a probe; wgpu asks that experimental features be acknowledged as such.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    };
    let (device, queue) = match pollster::block_on(adapter.request_device(&descriptor)) {
        Ok(d) => d,
        Err(e) => {
            println!("  device with cooperative matrices refused: {e}");
            return;
        }
    };
    // (name, source, block of y per workgroup)
    let big = staged_big();
    for (name, source, block) in [
        ("direct 32x32", DIRECT, 32),
        ("staged 64x64", STAGED, 64),
        ("staged 128x128", &big[..], 128),
    ] {
        let source = source.replace("STORE", STORE);
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        // SAFETY: every tile the shaders load or store lies inside its buffer: the dispatch is
        // (n / block) × (m / block) workgroups, m and n multiples of 128, k of 32 (the shapes
        // below).
        let module = unsafe {
            device.create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            println!("  {name}: shader rejected: {e}");
            continue;
        }
        println!("  {name}:");
        for (m, n, k) in [(512, 22016, 2048), (512, 2048, 11008), (4096, 4096, 4096)] {
            time_matmul(&device, &queue, &pipeline, block, (m, n, k));
        }
    }
}

fn time_matmul(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    pipeline: &wgpu::ComputePipeline,
    block: usize,
    (m, n, k): (usize, usize, usize),
) {
    // Small integers times powers of two: every product and sum is exact in f32, so the GPU
    // must equal the CPU bit for bit.
    let value = |i: usize, salt: usize| {
        f16::from_f32(((i * 7 + salt * 13) % 9) as f32 - 4.0) * f16::from_f32(0.25)
    };
    let x: Vec<f16> = (0..m * k).map(|i| value(i, 1)).collect();
    let w: Vec<f16> = (0..n * k).map(|i| value(i, 2)).collect();
    let storage = |label, data: &[u8]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: data,
            usage: wgpu::BufferUsages::STORAGE,
        })
    };
    let dims = [m as u32, n as u32, k as u32, 0];
    let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("dims"),
        contents: bytemuck::cast_slice(&dims),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let bits = |v: &[f16]| -> Vec<u16> { v.iter().map(|h| h.to_bits()).collect() };
    let xb = storage("x", bytemuck::cast_slice(&bits(&x)));
    let wb = storage("w", bytemuck::cast_slice(&bits(&w)));
    let y = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("y"),
        size: (m * n * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: uniform.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: xb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: wb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: y.as_entire_binding(),
            },
        ],
    });
    let run = |reps: usize| {
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            for _ in 0..reps {
                pass.dispatch_workgroups((n / block) as u32, (m / block) as u32, 1);
            }
        }
        queue.submit([encoder.finish()]);
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("poll");
    };
    run(1);
    let reps = 20;
    let start = Instant::now();
    run(reps);
    let seconds = start.elapsed().as_secs_f64() / reps as f64;
    let tflops = 2.0 * (m * n * k) as f64 / seconds / 1e12;
    // check a few outputs
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read"),
        size: (m * n * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(&y, 0, &staging, 0, (m * n * 4) as u64);
    queue.submit([encoder.finish()]);
    staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let got: Vec<f32> = match staging.slice(..).get_mapped_range() {
        Ok(view) => bytemuck::cast_slice(&view).to_vec(),
        Err(e) => {
            println!("  readback failed: {e:?}");
            return;
        }
    };
    let mut wrong = 0;
    for (i, j) in [(0, 0), (m - 1, n - 1), (m / 3, n / 5), (17, 33), (m / 2, 7)] {
        let want: f32 = (0..k)
            .map(|kk| x[i * k + kk].to_f32() * w[j * k + kk].to_f32())
            .sum();
        if got[i * n + j] != want {
            wrong += 1;
            println!("  y[{i}][{j}] = {} (CPU {want})", got[i * n + j]);
        }
    }
    println!(
        "    {m}x{n}x{k}: {:.1} µs, {tflops:.1} TFLOP/s, {}",
        seconds * 1e6,
        if wrong == 0 {
            "checked outputs exact"
        } else {
            "WRONG"
        }
    );
}
