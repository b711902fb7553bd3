// Per-head RMS norm in place (Qwen3's and Gemma 3's q_norm and k_norm): each head's head_dim
// elements of a field of each token's row become w * (x * (1 / sqrt(mean(x²) + eps))), as
// rms_norm.wgsl computes it, with one weight vector of head_dim elements for every head. One
// workgroup per (token, head); a thread keeps its elements in registers between the passes.

struct Params {
    head_dim: u32,
    heads: u32,
    n_tokens: u32,
    eps: f32,
    stride: u32, // row width and offset of the field in `rows`
    offset: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> rows: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;

const WORKGROUP: u32 = 64u;
// Elements a thread keeps in registers: heads of up to 256 elements are read once.
const HELD: u32 = 4u;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    // Uniform per workgroup: the whole group leaves together, before any barrier.
    if (group >= p.heads * p.n_tokens) {
        return;
    }
    let t = group / p.heads;
    let h = group % p.heads;
    let base = t * p.stride + p.offset + h * p.head_dim;
    let n = p.head_dim;
    var held: array<f32, HELD>;
    var acc = 0.0;
    for (var k = 0u; k < HELD; k++) {
        let i = lid + k * WORKGROUP;
        if (i < n) {
            held[k] = rows[base + i];
            acc = fma(held[k], held[k], acc);
        }
    }
    // Longer heads: the rest is read twice.
    for (var i = lid + HELD * WORKGROUP; i < n; i += WORKGROUP) {
        let v = rows[base + i];
        acc = fma(v, v, acc);
    }
    let inv = inverse_rms(lid, acc, n, p.eps);
    // Every thread has read its elements (before the last barrier): in place is safe.
    for (var k = 0u; k < HELD; k++) {
        let i = lid + k * WORKGROUP;
        if (i < n) {
            rows[base + i] = weight[i] * (held[k] * inv);
        }
    }
    for (var i = lid + HELD * WORKGROUP; i < n; i += WORKGROUP) {
        rows[base + i] = weight[i] * (rows[base + i] * inv);
    }
}
