// Rotary embedding in place on n_tokens rows of n_heads heads (HF: x*cos + rotate_half(x)*sin).
// cos/sin come from a host-computed table (the same float32 values as the CPU backend: WGSL's
// cos/sin are far less precise for large angles). One thread per rotated pair.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32, // leading dimensions of each head that rotate (even)
    _pad2: u32,
    neox: u32,     // 1: pairs (i, i + rope_dim/2) (qwen2); 0: pairs (2i, 2i + 1) (llama GGUF)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
struct Step {
    pos0: u32, // position of the first token
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read> cos_sin: array<vec2<f32>>; // [position][rope_dim/2]

const WORKGROUP: u32 = 64u;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half = p.rope_dim / 2u;
    let idx = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (idx >= p.n_tokens * p.n_heads * half) {
        return;
    }
    let i = idx % half;
    let head = idx / half; // token * n_heads + head
    let token = head / p.n_heads;
    var a = 2u * i;
    var b = 2u * i + 1u;
    if (p.neox != 0u) {
        a = i;
        b = i + half;
    }
    let base = head * p.head_dim;
    let cs = cos_sin[(step.pos0 + token) * half + i];
    let x0 = x[base + a];
    let x1 = x[base + b];
    x[base + a] = x0 * cs.x + (-x1) * cs.y;
    x[base + b] = x1 * cs.x + x0 * cs.y;
}
