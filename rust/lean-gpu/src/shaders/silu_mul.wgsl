// The gated activation: out = act(gate) * up with act SiLU (SwiGLU) or GELU-tanh (GeGLU) as
// torch computes them (activation.wgsl), for n_rows rows of n elements; gate and up are fields
// of the rows of one buffer (each its row width and offset; element j at offset + j * pitch:
// pitch 2 reads [gate_0, up_0, gate_1, ...] rows), out is n_rows × n.

struct Params {
    n: u32,
    n_rows: u32,
    gate_stride: u32,
    gate_offset: u32,
    up_stride: u32,
    up_offset: u32,
    pitch: u32,
    gelu: u32, // 1: GELU-tanh; 0: SiLU
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate_up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// WORKGROUP (threads per workgroup) comes from kernels/gated.rs: ELEMENTWISE_GROUP.

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (i >= p.n * p.n_rows) {
        return;
    }
    let t = i / p.n;
    let j = i % p.n;
    let g = gate_up[t * p.gate_stride + p.gate_offset + j * p.pitch];
    out[i] = activate(p.gelu != 0u, g) * gate_up[t * p.up_stride + p.up_offset + j * p.pitch];
}
