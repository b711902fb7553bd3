// HF LlamaRMSNorm per row: out = w * (x * (1 / sqrt(mean(x²) + eps))). One workgroup per row.

struct Params {
    n: u32,      // elements per row
    n_rows: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WORKGROUP: u32 = 256u;
var<workgroup> partial: array<f32, WORKGROUP>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * groups.x;
    // Uniform per workgroup: the whole group leaves together, before any barrier.
    if (row >= p.n_rows) {
        return;
    }
    let base = row * p.n;
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WORKGROUP) {
        let v = x[base + i];
        acc += v * v;
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    // inverseSqrt() is allowed 2 ulp of error; a true division keeps HF's rounding.
    let inv = 1.0 / sqrt(partial[0] / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WORKGROUP) {
        out[base + i] = weight[i] * (x[base + i] * inv);
    }
}
