// Causal grouped-query attention of n_tokens new tokens (decode: 1; prefill: a chunk) over
// the KV cache, as HF computes it: softmax(q·kᵀ · scale) · v — first pass (split-K, "flash
// decoding"): one workgroup per (token, head, split) handles the positions
// [split * split_len, (split + 1) * split_len) that the token sees, walking them in chunks of
// CHUNK with an online softmax (running max and sum, the output rescaled when the max grows),
// and writes its partial (unnormalized output, then max and sum) for attention_combine.wgsl.
// Token t sits at position step.pos0 + t and sees positions 0 ..= pos0 + t; head h reads kv
// head h / (n_heads / n_kv_heads). Splits let a single decoded token use many workgroups.
//
// Built for latency (a decode step waits for it between dependent dispatches): keys and
// values are read as vec4, and every thread issues all its loads of a chunk at once (loops of
// a fixed count the compiler unrolls, guarded), so a chunk costs about one memory round trip
// for its keys and one for its values. Per chunk, LANES threads share each position's q·k;
// for probabilities·values each group of head_dim / 4 threads takes every value_groups-th
// position, a vec4 of dimensions per thread.
// Cache layout, from cache_offset: keys and values both [kv_head][capacity][head_dim].
// head_dim and cache_offset are multiples of 4 (kernels.rs checks).

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,     // at most MAX_HEAD_DIM
    n_tokens: u32,
    capacity: u32,
    cache_offset: u32, // elements: this layer's first key (and value)
    scale: f32,
    n_splits: u32,
    split_len: u32,    // positions per split, a multiple of CHUNK
    stats_offset: u32, // vec4s: where the (max, sum) of the splits start in `partials`
    q_stride: u32,     // row width and offset of the queries in q's token rows (multiples of 4)
    q_offset: u32,
}

struct Step {
    pos0: u32, // position of the first new token
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;    // [token][.. head][head_dim ..]
@group(0) @binding(3) var<storage, read> keys: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> vals: array<vec4<f32>>;
// [token][head][split][head_dim]: the unnormalized outputs, then from stats_offset
// [token][head][split] (max, sum, 0, 0)
@group(0) @binding(5) var<storage, read_write> partials: array<vec4<f32>>;

const WORKGROUP: u32 = 256u;
// Positions per chunk, and threads per position's dot.
const CHUNK: u32 = 64u;
const LANES: u32 = WORKGROUP / CHUNK;
const MAX_HEAD_DIM: u32 = 256u;
// vec4s of a key row a lane reads, at most; positions a value group takes per chunk, at most
// (value_groups is at least WORKGROUP / (MAX_HEAD_DIM / 4) = 4).
const LANE_QUADS: u32 = MAX_HEAD_DIM / 4u / LANES;
const GROUP_POSITIONS: u32 = CHUNK / 4u;
// The lowest finite f32, written below its exact value: 3.4028235e38 rounds above f32::MAX as an
// abstract float, which Tint (Chromium) rejects.
const LOWEST: f32 = -3.4028234e38;

var<workgroup> q_head: array<vec4<f32>, MAX_HEAD_DIM / 4u>;
// The lanes' partial dots.
var<workgroup> lanes: array<f32, WORKGROUP>;
var<workgroup> probs: array<f32, CHUNK>;
var<workgroup> partial: array<f32, CHUNK>;
// The value groups' partial outputs.
var<workgroup> outs: array<vec4<f32>, WORKGROUP>;

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

// acc + dot(a, b), as four chained fused multiply-adds.
fn dot_acc(acc: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
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
    let hd4 = p.head_dim / 4u;
    let kv_base = p.cache_offset / 4u + (h / (p.n_heads / p.n_kv_heads)) * p.capacity * hd4;
    let head = t * p.n_heads + h;
    if (lid < hd4) {
        q_head[lid] = q[(t * p.q_stride + p.q_offset) / 4u + h * hd4 + lid];
    }
    workgroupBarrier();

    // This thread's share of the dots: position `at` of a chunk, quads lane, lane + LANES, ...
    let at = lid / LANES;
    let lane = lid % LANES;
    // and of the output: quad vd over positions vg, vg + value_groups, ... (threads past the
    // last whole group idle there).
    let value_groups = WORKGROUP / hd4;
    let vg = lid / hd4;
    let vd = lid % hd4;
    var running_max = LOWEST;
    var running_sum = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = first; c0 < end; c0 += CHUNK) {
        let pos = c0 + at;
        var dot = 0.0;
        if (pos < end) {
            let row = kv_base + pos * hd4;
            for (var i = 0u; i < LANE_QUADS; i++) {
                let d = lane + i * LANES;
                if (d < hd4) {
                    dot = dot_acc(dot, q_head[d], keys[row + d]);
                }
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
            for (var i = 0u; i < GROUP_POSITIONS; i++) {
                let j = vg + i * value_groups;
                if (j < n) {
                    a = fma(vec4<f32>(probs[j]), vals[kv_base + (c0 + j) * hd4 + vd], a);
                }
            }
            acc = a;
        }
        // `lanes` and `probs` are rewritten by the next chunk.
        workgroupBarrier();
    }
    outs[lid] = acc;
    workgroupBarrier();
    let slot = head * p.n_splits + split;
    if (lid == 0u) {
        partials[p.stats_offset + slot] = vec4<f32>(running_max, running_sum, 0.0, 0.0);
    }
    if (lid < hd4) {
        var sum = vec4<f32>(0.0);
        for (var g = 0u; g < value_groups; g++) {
            sum += outs[g * hd4 + lid];
        }
        partials[slot * hd4 + lid] = sum;
    }
}
