// A step's new tokens enter attention: rotary embedding of the queries in place, and the keys
// (rotated) and values appended to the KV cache — one dispatch instead of three. Rotation as HF:
// x*cos + rotate_half(x)*sin, with cos/sin from a host-computed table (the same float32 values
// as the CPU backend: WGSL's cos/sin are far less precise for large angles).
// Per token, threads take: a pair of rotated query elements each (in place), then one key
// element each (read from k, rotated out of place with the same expression), then one value
// element each. q, k and v are fields of the token's row of one buffer (each field: its row
// width and offset). Cache layout from cache_offset: [kv_head][capacity][head_dim], positions
// step.pos0 .. pos0 + n_tokens.
// Each rotated element is an explicit fma(x, cos, ±(partner * sin)), here and in attention.wgsl's
// fresh path: written as x * cos + partner * sin, a driver may fuse either product into the add
// and choose differently per shader module (on an H100 a decode step's token and the same token
// of a verification pass then differed in the last bits).

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rope_dim: u32, // leading dimensions of each head that rotate (even, may be 0)
    neox: u32,     // 1: pairs (i, i + rope_dim/2) (qwen2); 0: pairs (2i, 2i + 1) (llama GGUF)
    capacity: u32,
    cache_offset: u32,
    q_stride: u32, // row width and offset of q in qkv
    q_offset: u32,
    k_stride: u32,
    k_offset: u32,
    v_stride: u32,
    v_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

struct Step {
    pos0: u32, // position of the first token
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
// Per token: q [head][head_dim], k and v [kv_head][head_dim], at their fields.
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> keys: array<f32>;
@group(0) @binding(4) var<storage, read_write> vals: array<f32>;
@group(0) @binding(5) var<storage, read> cos_sin: array<vec2<f32>>; // [position][rope_dim/2]

// WORKGROUP (threads per workgroup) comes from kernels/rope_kv_store.rs: ELEMENTWISE_GROUP.

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half = p.rope_dim / 2u;
    let q_pairs = p.n_heads * half;
    let kv_dim = p.n_kv_heads * p.head_dim;
    let per_token = q_pairs + 2u * kv_dim;
    let idx = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (idx >= p.n_tokens * per_token) {
        return;
    }
    let t = idx / per_token;
    let r = idx % per_token;
    let pos = step.pos0 + t;
    if (r < q_pairs) {
        let i = r % half;
        let base = t * p.q_stride + p.q_offset + (r / half) * p.head_dim;
        var a = 2u * i;
        var b = 2u * i + 1u;
        if (p.neox != 0u) {
            a = i;
            b = i + half;
        }
        let cs = cos_sin[pos * half + i];
        let x0 = qkv[base + a];
        let x1 = qkv[base + b];
        qkv[base + a] = fma(x0, cs.x, -(x1 * cs.y));
        qkv[base + b] = fma(x1, cs.x, x0 * cs.y);
        return;
    }
    let j = (r - q_pairs) % kv_dim;
    let head = j / p.head_dim;
    let d = j % p.head_dim;
    let at = p.cache_offset + (head * p.capacity + pos) * p.head_dim + d;
    if (r >= q_pairs + kv_dim) {
        vals[at] = qkv[t * p.v_stride + p.v_offset + j];
        return;
    }
    let src = t * p.k_stride + p.k_offset + j;
    let x = qkv[src];
    if (d >= p.rope_dim) {
        keys[at] = x;
        return;
    }
    // Element d of its pair (x0, x1): the first gets x0*cos + (-x1)*sin, the second
    // x1*cos + x0*sin, as the query pairs above.
    var i = d / 2u;
    var first = d % 2u == 0u;
    var partner = src + 1u;
    if (!first) {
        partner = src - 1u;
    }
    if (p.neox != 0u) {
        i = d % half;
        first = d < half;
        partner = src + half;
        if (!first) {
            partner = src - half;
        }
    }
    let cs = cos_sin[pos * half + i];
    let other = qkv[partner];
    if (first) {
        keys[at] = fma(x, cs.x, -(other * cs.y));
    } else {
        keys[at] = fma(x, cs.x, other * cs.y);
    }
}
