// Causal grouped-query attention of n_tokens new tokens (decode: 1; prefill: a chunk) over
// the KV cache, as HF computes it: softmax(q·kᵀ · scale) · v — first pass (split-K, "flash
// decoding"): one workgroup per (token, head, split) handles the positions
// [split * split_len, (split + 1) * split_len) that the token sees, walking them in chunks of
// WORKGROUP with an online softmax (running max and sum, the output rescaled when the max
// grows), and writes its partial (max, sum, unnormalized output) for attention_combine.wgsl.
// Per chunk, LANES threads share each position's q·k (so a thread reads head_dim / LANES key
// elements, not a whole row), and the threads split the probabilities·values product into
// groups of head_dim threads, each group over every (WORKGROUP / head_dim)-th position.
// Token t sits at position step.pos0 + t and sees positions 0 ..= pos0 + t; head h reads kv
// head h / (n_heads / n_kv_heads). Splits let a single decoded token use many workgroups.
// Cache layout, from cache_offset: keys and values both [kv_head][capacity][head_dim].

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,     // at most MAX_HEAD_DIM
    n_tokens: u32,
    capacity: u32,
    cache_offset: u32, // elements: this layer's first key (and value)
    scale: f32,
    n_splits: u32,
    split_len: u32,    // positions per split, a multiple of WORKGROUP
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Step {
    pos0: u32, // position of the first new token
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;    // [token][head][head_dim]
@group(0) @binding(3) var<storage, read> keys: array<f32>;
@group(0) @binding(4) var<storage, read> vals: array<f32>;
// [token][head][split][2 + head_dim]: max, sum, then the unnormalized output
@group(0) @binding(5) var<storage, read_write> partials: array<f32>;

const WORKGROUP: u32 = 256u;
// Positions per chunk, and threads per position's dot.
const CHUNK: u32 = 64u;
const LANES: u32 = WORKGROUP / CHUNK;
const MAX_HEAD_DIM: u32 = 256u;
// The lowest finite f32, written below its exact value: 3.4028235e38 rounds above f32::MAX as an
// abstract float, which Tint (Chromium) rejects.
const LOWEST: f32 = -3.4028234e38;

var<workgroup> q_head: array<f32, MAX_HEAD_DIM>;
// The lanes' partial dots, then the value groups' partial outputs.
var<workgroup> lanes: array<f32, WORKGROUP>;
var<workgroup> probs: array<f32, CHUNK>;
var<workgroup> partial: array<f32, CHUNK>;

// Tree reduction of `partial` by max (is_max) or sum; every thread gets the result.
fn reduce(lid: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    for (var s = CHUNK / 2u; s > 0u; s >>= 1u) {
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
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    let split = group % p.n_splits;
    let h = (group / p.n_splits) % p.n_heads;
    let t = group / p.n_splits / p.n_heads;
    if (t >= p.n_tokens) {
        return;
    }
    let len = step.pos0 + t + 1u;
    let first = split * p.split_len;
    // Splits past the token's last position have nothing to do (the combine skips them).
    if (first >= len) {
        return;
    }
    let end = min(len, first + p.split_len);
    let hd = p.head_dim;
    let kv_base = p.cache_offset + (h / (p.n_heads / p.n_kv_heads)) * p.capacity * hd;
    let q_base = (t * p.n_heads + h) * hd;
    for (var d = lid; d < hd; d += WORKGROUP) {
        q_head[d] = q[q_base + d];
    }
    workgroupBarrier();

    // This thread's share of the dots: position `at` of a chunk, dims lane, lane + LANES, ...
    let at = lid / LANES;
    let lane = lid % LANES;
    // and of the output: dim vd over positions vg, vg + value_groups, ... (threads past the
    // last whole group idle there).
    let value_groups = WORKGROUP / hd;
    let vg = lid / hd;
    let vd = lid % hd;
    var running_max = LOWEST;
    var running_sum = 0.0;
    var acc = 0.0;
    for (var c0 = first; c0 < end; c0 += CHUNK) {
        let pos = c0 + at;
        var dot = 0.0;
        if (pos < end) {
            let row = kv_base + pos * hd;
            for (var d = lane; d < hd; d += LANES) {
                dot += q_head[d] * keys[row + d];
            }
        }
        lanes[lid] = dot;
        workgroupBarrier();
        var score = LOWEST;
        if (lid < CHUNK) {
            if (c0 + lid < end) {
                var sum = 0.0;
                for (var l = 0u; l < LANES; l++) {
                    sum += lanes[lid * LANES + l];
                }
                score = sum * p.scale;
            }
            partial[lid] = score;
        }
        let new_max = max(running_max, reduce(lid, true));
        if (lid < CHUNK) {
            var e = 0.0;
            if (c0 + lid < end) {
                e = exp(score - new_max);
            }
            probs[lid] = e;
            partial[lid] = e;
        }
        let chunk_sum = reduce(lid, false); // its barriers also publish `probs`
        let rescale = exp(running_max - new_max);
        running_sum = running_sum * rescale + chunk_sum;
        running_max = new_max;
        if (vg < value_groups) {
            let n = min(CHUNK, end - c0);
            var a = acc * rescale;
            for (var j = vg; j < n; j += value_groups) {
                a += probs[j] * vals[kv_base + (c0 + j) * hd + vd];
            }
            acc = a;
        }
        // `lanes` and `probs` are rewritten by the next chunk.
        workgroupBarrier();
    }
    lanes[lid] = acc;
    workgroupBarrier();
    let base = ((t * p.n_heads + h) * p.n_splits + split) * (hd + 2u);
    if (lid == 0u) {
        partials[base] = running_max;
        partials[base + 1u] = running_sum;
    }
    for (var d = lid; d < hd; d += WORKGROUP) {
        var sum = 0.0;
        for (var g = 0u; g < value_groups; g++) {
            sum += lanes[g * hd + d];
        }
        partials[base + 2u + d] = sum;
    }
}
