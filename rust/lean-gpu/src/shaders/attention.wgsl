// Decode attention of one token, one workgroup per query head (grouped-query: head h reads kv
// head h / (n_heads / n_kv_heads)), as HF computes it: softmax(q·kᵀ · scale) · v.
// Cache layout, from cache_offset: keys and values both [kv_head][capacity][head_dim]; the
// first `len` positions are valid. Scores go to a scratch buffer [n_heads][capacity] because
// a long context does not fit in workgroup memory.

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    len: u32,
    capacity: u32,
    cache_offset: u32, // elements: this layer's first key (and value)
    scale: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> keys: array<f32>;
@group(0) @binding(3) var<storage, read> vals: array<f32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const WORKGROUP: u32 = 128u;
var<workgroup> partial: array<f32, WORKGROUP>;

// Tree reduction of `partial` by max (is_max) or sum; every thread gets the result.
fn reduce(lid: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            if (is_max) {
                partial[lid] = max(partial[lid], partial[lid + s]);
            } else {
                partial[lid] += partial[lid + s];
            }
        }
        workgroupBarrier();
    }
    let result = partial[0];
    // Everyone must read partial[0] before it is overwritten by the next reduction.
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    if (h >= p.n_heads) {
        return;
    }
    let hd = p.head_dim;
    let g = h / (p.n_heads / p.n_kv_heads);
    let kv_base = p.cache_offset + g * p.capacity * hd;
    let q_base = h * hd;
    let s_base = h * p.capacity;

    var local_max = -3.4028235e38;
    for (var t = lid; t < p.len; t += WORKGROUP) {
        var dot = 0.0;
        for (var d = 0u; d < hd; d++) {
            dot += q[q_base + d] * keys[kv_base + t * hd + d];
        }
        let s = dot * p.scale;
        scores[s_base + t] = s;
        local_max = max(local_max, s);
    }
    partial[lid] = local_max;
    let m = reduce(lid, true);

    var local_sum = 0.0;
    for (var t = lid; t < p.len; t += WORKGROUP) {
        let e = exp(scores[s_base + t] - m);
        scores[s_base + t] = e;
        local_sum += e;
    }
    partial[lid] = local_sum;
    let sum = reduce(lid, false);
    // The exponentials were written by other threads of this group.
    storageBarrier();

    for (var d = lid; d < hd; d += WORKGROUP) {
        var acc = 0.0;
        for (var t = 0u; t < p.len; t++) {
            acc += (scores[s_base + t] / sum) * vals[kv_base + t * hd + d];
        }
        out[q_base + d] = acc;
    }
}
