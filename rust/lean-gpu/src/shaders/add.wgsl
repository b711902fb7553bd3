// x[i] += y[i % y_len]: the residual add (y_len = n) and the bias add (y_len = row length).

struct Params {
    n: u32,
    y_len: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;

const WORKGROUP: u32 = 64u;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (i >= p.n) {
        return;
    }
    x[i] += y[i % p.y_len];
}
