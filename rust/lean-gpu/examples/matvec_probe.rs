//! TEMPORARY probe (gpu2): Q8_0 / Q4_0 matvec variants whose lanes read x as contiguous vec4,
//! timed like gpu_bench, to test whether x loads limit the production kernels.
use lean_gpu::wgpu;
use lean_gpu::{GpuContext, GpuMatrix, Kernels};
use lean_quant::{scalar, TensorType};

const BYTES: &str = include_str!("../src/shaders/bytes.wgsl");

const HEAD: &str = "
struct Params { rows: u32, cols: u32, row_bytes: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
const WORKGROUP: u32 = 256u;
const TPR: u32 = TPR_VALUE;
var<workgroup> partial: array<f32, WORKGROUP>;
fn i8x4(v: u32) -> vec4<f32> {
    let s = i32(v);
    return vec4<f32>(f32(extractBits(s, 0u, 8u)), f32(extractBits(s, 8u, 8u)), f32(extractBits(s, 16u, 8u)), f32(extractBits(s, 24u, 8u)));
}
fn u4x4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(v & 0xFu), f32((v >> 8u) & 0xFu), f32((v >> 16u) & 0xFu), f32((v >> 24u) & 0xFu));
}
@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    let lane = lid % TPR;
    let row = group * (WORKGROUP / TPR) + lid / TPR;
    var acc = 0.0;
    if (row < p.rows) {
        let row_byte = row * p.row_bytes;
";
const TAIL: &str = "
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) { partial[lid] += partial[lid + s]; }
        workgroupBarrier();
    }
    if (lane == 0u && row < p.rows) { y[row] = partial[lid]; }
}";
// item i: word k = i % 8 of block i / 8 (elements 4k..4k+4): lane reads x4[i], contiguous.
const Q8_0_BODY: &str = "
        let items = (p.cols / 32u) * 8u;
        for (var i = lane; i < items; i += TPR) {
            let blk = row_byte + (i / 8u) * 34u;
            acc += load_f16(blk) * dot(i8x4(load_u32(blk + 2u + 4u * (i % 8u))), x[i]);
        }
";
// item i: word k = i % 4 of block b = i / 4: low nibbles are elements 4k.., high 16 + 4k..
const Q4_0_BODY: &str = "
        let items = (p.cols / 32u) * 4u;
        for (var i = lane; i < items; i += TPR) {
            let b = i / 4u;
            let k = i % 4u;
            let blk = row_byte + b * 18u;
            let q = load_u32(blk + 2u + 4u * k);
            let s = dot(u4x4(q) - 8.0, x[8u * b + k]) + dot(u4x4(q >> 4u) - 8.0, x[8u * b + 4u + k]);
            acc += load_f16(blk) * s;
        }
";

fn time(ctx: &GpuContext, set: &wgpu::QuerySet, resolved: &wgpu::Buffer, mut record: impl FnMut(&mut wgpu::CommandEncoder)) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let mut e = ctx.device.create_command_encoder(&Default::default());
        e.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: None }) });
        record(&mut e);
        e.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(1), end_of_pass_write_index: None }) });
        e.resolve_query_set(set, 0..2, resolved, 0);
        ctx.queue.submit([e.finish()]);
        let f = ctx.read_bytes(resolved, 16);
        ctx.device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let b = pollster::block_on(f).unwrap();
        let t: &[u64] = bytemuck::cast_slice(&b);
        best = best.min((t[1] - t[0]) as f64 * ctx.queue.get_timestamp_period() as f64 * 1e-9);
    }
    best
}

fn floor_and_f32(ctx: &GpuContext, set: &wgpu::QuerySet, resolved: &wgpu::Buffer) {
    let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl("@group(0) @binding(0) var<storage, read_write> y: array<f32>;\n@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { y[g.x] = 1.0; }".into()) });
    let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
    let ys: Vec<wgpu::Buffer> = (0..256).map(|_| ctx.storage_f32("y", 64)).collect();
    let bgs: Vec<wgpu::BindGroup> = ys.iter().map(|y| ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &pipeline.get_bind_group_layout(0), entries: &[wgpu::BindGroupEntry { binding: 0, resource: y.as_entire_binding() }] })).collect();
    let n = 2000;
    println!("| dispatch pattern (1 workgroup, 2000 dispatches) | per dispatch |\n|---|---|");
    for (name, one_pass, distinct) in [("own pass each, same y", false, false), ("own pass each, 256 distinct y", false, true), ("one pass, same y", true, false), ("one pass, 256 distinct y", true, true)] {
        let t = time(ctx, set, resolved, |e| {
            let pick = |i: usize| if distinct { &bgs[i % 256] } else { &bgs[0] };
            if one_pass {
                let mut pass = e.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                for i in 0..n { pass.set_bind_group(0, pick(i), &[]); pass.dispatch_workgroups(1, 1, 1); }
            } else {
                for i in 0..n {
                    let mut pass = e.begin_compute_pass(&Default::default());
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, pick(i), &[]);
                    pass.dispatch_workgroups(1, 1, 1);
                }
            }
        });
        println!("| {name} | {:.2} µs |", t / n as f64 * 1e6);
    }
    let kernels = pollster::block_on(Kernels::new(ctx)).unwrap();
    println!("| F32 matvec (production) | per dispatch | GB/s |\n|---|---|---|");
    for rows in [8192usize, 37984, 75968, 151936] {
        let cols = 2048;
        let w: Vec<u8> = (0..rows * cols).flat_map(|i| (((i * 7919) % 1000) as f32 / 1000.0).to_le_bytes()).collect();
        let copies = ((512u64 << 20).div_ceil(w.len() as u64)).clamp(1, 256) as usize;
        let mats: Vec<GpuMatrix> = (0..copies).map(|_| GpuMatrix::upload(ctx, TensorType::F32, rows, cols, &w).unwrap()).collect();
        let xb = ctx.storage_f32("x", cols);
        let yb = ctx.storage_f32("y", rows);
        let dispatches = ((16u64 << 30).div_ceil(w.len() as u64)).clamp(copies as u64, 2000) as usize;
        let t = time(ctx, set, resolved, |e| { for m in mats.iter().cycle().take(dispatches) { kernels.matvec(ctx, e, m, &xb, &yb).unwrap(); } });
        let per = t / dispatches as f64;
        println!("| {rows}x{cols} ({copies} copies) | {:.1} µs | {:.0} |", per * 1e6, w.len() as f64 / per / 1e9);
    }
}

fn main() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() })).expect("adapter");
    let ctx = pollster::block_on(GpuContext::from_adapter(&adapter, adapter.features() & wgpu::Features::TIMESTAMP_QUERY)).expect("device");
    let small = ctx.adapter_info().device_type == wgpu::DeviceType::Cpu;
    println!("probe adapter: {}", ctx.describe());
    let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor { label: None, ty: wgpu::QueryType::Timestamp, count: 2 });
    let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 16, usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false });
    if std::env::args().any(|a| a == "--floor") {
        floor_and_f32(&ctx, &set, &resolved);
        return;
    }
    println!("| variant | rows x cols | per dispatch | GB/s |\n|---|---|---|---|");
    for (ty, body, bpb) in [(TensorType::Q8_0, Q8_0_BODY, 34usize), (TensorType::Q4_0, Q4_0_BODY, 18)] {
        for tpr in [32u32, 64, 256] {
            let source = format!("{BYTES}\n{}{body}{TAIL}", HEAD.replace("TPR_VALUE", &format!("{tpr}u")));
            let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(source.into()) });
            let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
            for (rows, cols) in [(2048usize, 2048usize), (8192, 2048), (2048, 11008), (151936, 2048)] {
                let rows = if small { rows / 10 } else { rows };
                let row_bytes = cols / 32 * bpb;
                let mut state = 1u64;
                let mut w: Vec<u8> = (0..rows * row_bytes).map(|_| { state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (state >> 33) as u8 }).collect();
                for blk in w.chunks_exact_mut(bpb) { blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes()); }
                let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
                let bytes = w.len() as u64;
                let copies = ((if small { 32u64 << 20 } else { 512 << 20 }).div_ceil(bytes)).clamp(1, 256) as usize;
                let mats: Vec<GpuMatrix> = (0..copies).map(|_| GpuMatrix::upload(&ctx, ty, rows, cols, &w).unwrap()).collect();
                let xb = ctx.upload_f32("x", &x);
                let yb = ctx.storage_f32("y", rows);
                let params: [u32; 4] = [rows as u32, cols as u32, row_bytes as u32, 0];
                let ub = ctx.device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 16, usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
                ctx.queue.write_buffer(&ub, 0, bytemuck::cast_slice(&params));
                let groups: Vec<wgpu::BindGroup> = mats.iter().map(|m| ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &pipeline.get_bind_group_layout(0), entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: ub.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: m.parts()[0].buffer.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 2, resource: xb.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 3, resource: yb.as_entire_binding() },
                ] })).collect();
                let dispatches = ((if small { 64u64 << 20 } else { 16 << 30 }).div_ceil(bytes)).clamp(copies as u64, 2000) as usize;
                let wg = (rows as u32).div_ceil(256 / tpr);
                let mut best = f64::INFINITY;
                for _ in 0..4 {
                    let mut e = ctx.device.create_command_encoder(&Default::default());
                    e.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(wgpu::ComputePassTimestampWrites { query_set: &set, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: None }) });
                    for g in groups.iter().cycle().take(dispatches) {
                        let mut pass = e.begin_compute_pass(&Default::default());
                        pass.set_pipeline(&pipeline);
                        pass.set_bind_group(0, g, &[]);
                        pass.dispatch_workgroups(wg.min(65535), wg.div_ceil(65535), 1);
                    }
                    e.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(wgpu::ComputePassTimestampWrites { query_set: &set, beginning_of_pass_write_index: Some(1), end_of_pass_write_index: None }) });
                    e.resolve_query_set(&set, 0..2, &resolved, 0);
                    ctx.queue.submit([e.finish()]);
                    let f = ctx.read_bytes(&resolved, 16);
                    ctx.device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
                    let b = pollster::block_on(f).unwrap();
                    let t: &[u64] = bytemuck::cast_slice(&b);
                    best = best.min((t[1] - t[0]) as f64 * ctx.queue.get_timestamp_period() as f64 * 1e-9);
                }
                let f = ctx.read_f32(&yb, rows);
                ctx.device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
                let y = pollster::block_on(f).unwrap();
                let mut deq = vec![0f32; cols];
                for r in [0, rows - 1] {
                    scalar::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut deq);
                    let (want, abs) = deq.iter().zip(&x).fold((0f64, 0f64), |(s, a), (&a1, &b1)| (s + a1 as f64 * b1 as f64, a + (a1 as f64 * b1 as f64).abs()));
                    assert!((y[r] as f64 - want).abs() <= 1e-5 * abs, "{ty} tpr {tpr} row {r}: {} vs {want}", y[r]);
                }
                let per = best / dispatches as f64;
                println!("| {ty} vec4 x, {tpr} lanes/row | {rows}x{cols} | {:.1} µs | {:.0} |", per * 1e6, bytes as f64 / per / 1e9);
            }
        }
    }
}
