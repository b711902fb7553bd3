// SwiGLU: out = silu(gate) * up with silu(g) = g * (1 / (1 + exp(-g))) as torch computes it.

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WORKGROUP: u32 = 64u;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (i >= p.n) {
        return;
    }
    let g = gate[i];
    let sigmoid = 1.0 / (1.0 + exp(-g));
    out[i] = (g * sigmoid) * up[i];
}
