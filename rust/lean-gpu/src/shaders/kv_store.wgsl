// Appends n_tokens tokens' keys and values (each [token][kv_head][head_dim]) to the KV cache
// at positions step.pos0 .. pos0 + n_tokens; cache layout from cache_offset:
// [kv_head][capacity][head_dim]. One thread per element.

struct Params {
    n_tokens: u32,
    kv_dim: u32, // n_kv_heads * head_dim
    head_dim: u32,
    capacity: u32,
    cache_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Step {
    pos0: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> keys: array<f32>;
@group(0) @binding(5) var<storage, read_write> vals: array<f32>;

const WORKGROUP: u32 = 64u;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (i >= p.n_tokens * p.kv_dim) {
        return;
    }
    let t = i / p.kv_dim;
    let j = i % p.kv_dim;
    let head = j / p.head_dim;
    let d = j % p.head_dim;
    let at = p.cache_offset + (head * p.capacity + step.pos0 + t) * p.head_dim + d;
    keys[at] = k[i];
    vals[at] = v[i];
}
