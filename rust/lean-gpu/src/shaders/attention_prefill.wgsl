// Causal grouped-query attention of a prefill chunk over the KV cache, as HF computes it:
// softmax(q·kᵀ · scale) · v, tiled for many queries (attention.wgsl, one workgroup per token,
// re-reads every key and value for each token of the chunk; this reads them once per block of
// BQ tokens). One workgroup per (block of BQ tokens, head) walks the positions the block's last
// token sees in steps of BK, with an online softmax (running max and sum per token, the output
// rescaled when the max grows), and writes the normalized output: no combine pass.
// Token t sits at position step.pos0 + t and sees positions 0 ..= pos0 + t, or with a sliding
// window only the last `window` of them (pos0 + t - window < j); head h reads kv head
// h / (n_heads / n_kv_heads). A block walks from the first position its first token sees. The
// queries are rotated and every position cached already (rope_kv_store ran). Cache layout, from cache_offset: keys and values both
// [kv_head][capacity][head_dim]; head_dim and cache_offset are multiples of 4
// (kernels/attention.rs checks). kernels/attention.rs builds this shader for MAX_HEAD_DIM 64
// (16 KiB of workgroup memory, the portable limit) and 128 (28 KiB, where the device allows
// it).
//
// Threads: 8 per token (g = 0..8). Per step, a thread scores its token against positions g and
// g + 8 of the step (a whole dot each, keys from workgroup memory), and owns output quads g,
// g + 8, ... of its token. Workgroup rows of keys/values are swizzled (quad d of position j at
// d ^ (j % 8)) so that 8 threads reading quad d of 8 positions hit distinct banks.

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,     // at most MAX_HEAD_DIM
    n_tokens: u32,
    capacity: u32,
    cache_offset: u32, // elements: this layer's first key (and value)
    scale: f32,
    query_blocks: u32, // ceil(n_tokens / BQ)
    q_stride: u32,     // row width and offset of the queries in q's token rows (multiples of 4)
    q_offset: u32,
    window: u32,       // positions a token sees at most (u32 max: all)
    _pad1: u32,
}

struct Step {
    pos0: u32, // position of the first new token
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> keys: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> vals: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>; // [token][head][head_dim]

const WORKGROUP: u32 = 256u;
// From kernels/attention.rs's header: BQ and BK, tokens per workgroup and positions per step
// (PREFILL_ATTENTION_TOKENS, PREFILL_ATTENTION_STEP), and MAX_HEAD_DIM, the largest head of
// this pipeline (PREFILL_ATTENTION_HEAD_DIMS). Threads per token:
const PER_TOKEN: u32 = WORKGROUP / BQ;
// Quads of a head (a power of two, at least PER_TOKEN: the swizzle stays inside a row), and
// output quads per thread.
const QUADS: u32 = MAX_HEAD_DIM / 4u;
const OUT_QUADS: u32 = QUADS / PER_TOKEN;
// The lowest finite f32, written below its exact value (attention.wgsl says why).
const LOWEST: f32 = -3.4028234e38;

var<workgroup> queries: array<vec4<f32>, BQ * QUADS>;  // [token][quad]
var<workgroup> rows: array<vec4<f32>, BK * QUADS>;     // [position][quad ^ swizzle]: keys, then values
var<workgroup> scores: array<f32, BQ * BK>;            // [token][position]
var<workgroup> probs: array<f32, BQ * BK>;

// acc + dot(a, b), as four chained fused multiply-adds.
fn dot_acc(acc: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// Where quad d of position j of a step lies in `rows`.
fn row_at(j: u32, d: u32) -> u32 {
    return j * QUADS + (d ^ (j % PER_TOKEN));
}

// Stages the step's BK positions from k0 of `keys` (values: 1, `vals`), zero past `end`.
fn stage(lid: u32, kv_base: u32, k0: u32, end: u32, values: bool) {
    let hd4 = p.head_dim / 4u;
    for (var i = lid; i < BK * hd4; i += WORKGROUP) {
        let j = i / hd4;
        let d = i % hd4;
        let pos = k0 + j;
        var v = vec4<f32>(0.0);
        if (pos < end) {
            if (values) {
                v = vals[kv_base + pos * hd4 + d];
            } else {
                v = keys[kv_base + pos * hd4 + d];
            }
        }
        rows[row_at(j, d)] = v;
    }
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    let h = group % p.n_heads;
    // The last blocks (the longest walks, causal) first, so that short ones fill in behind
    // them rather than long ones starting last (on an H200: 3B's prefill attention 420 -> 300 µs).
    if (group / p.n_heads >= p.query_blocks) {
        return;
    }
    let block = p.query_blocks - 1u - group / p.n_heads;
    let t0 = block * BQ;
    let hd4 = p.head_dim / 4u;
    let kv = h / (p.n_heads / p.n_kv_heads);
    let kv_base = p.cache_offset / 4u + kv * p.capacity * hd4;
    let qi = lid / PER_TOKEN;
    let g = lid % PER_TOKEN;
    // Tokens past the chunk score as its last token (their outputs are not stored). Lengths are
    // clamped to the capacity: the session never steps past it; the clamp keeps every cache
    // access in range whatever the step buffer holds.
    let t = min(t0 + qi, p.n_tokens - 1u);
    let len = min(step.pos0 + t + 1u, p.capacity);
    // The token sees positions start .. len (its window); the block those of its tokens.
    let start = len - min(len, p.window);
    let first_len = min(step.pos0 + t0 + 1u, p.capacity);
    let begin = first_len - min(first_len, p.window);
    let end = min(step.pos0 + min(t0 + BQ, p.n_tokens), p.capacity);

    for (var i = lid; i < BQ * hd4; i += WORKGROUP) {
        let tq = t0 + i / hd4;
        var v = vec4<f32>(0.0);
        if (tq < p.n_tokens) {
            v = q[(tq * p.q_stride + p.q_offset) / 4u + h * hd4 + i % hd4];
        }
        queries[(i / hd4) * QUADS + i % hd4] = v;
    }

    var running_max = LOWEST;
    var running_sum = 0.0; // over this thread's positions
    var acc: array<vec4<f32>, OUT_QUADS>;
    for (var m = 0u; m < OUT_QUADS; m++) {
        acc[m] = vec4<f32>(0.0);
    }
    for (var k0 = begin; k0 < end; k0 += BK) {
        // After the previous step's last reads of `rows` (and, first, with the queries staged).
        workgroupBarrier();
        stage(lid, kv_base, k0, end, false);
        workgroupBarrier();
        var s0 = 0.0;
        var s1 = 0.0;
        // rows of positions g and g + PER_TOKEN (both swizzled by g)
        let a0 = g * QUADS;
        let a1 = (g + PER_TOKEN) * QUADS;
        for (var d = 0u; d < hd4; d++) {
            let qv = queries[qi * QUADS + d];
            s0 = dot_acc(s0, qv, rows[a0 + (d ^ g)]);
            s1 = dot_acc(s1, qv, rows[a1 + (d ^ g)]);
        }
        // Positions the token does not see score LOWEST (they never raise the max) and weigh
        // exactly 0, also in the steps before its window starts, where its max is LOWEST.
        let seen0 = k0 + g >= start && k0 + g < len;
        let seen1 = k0 + g + PER_TOKEN >= start && k0 + g + PER_TOKEN < len;
        s0 = select(LOWEST, s0 * p.scale, seen0);
        s1 = select(LOWEST, s1 * p.scale, seen1);
        scores[qi * BK + g] = s0;
        scores[qi * BK + g + PER_TOKEN] = s1;
        workgroupBarrier();
        // Every thread has scored: the keys' rows take the values.
        stage(lid, kv_base, k0, end, true);
        var step_max = running_max;
        for (var j = 0u; j < BK; j++) {
            step_max = max(step_max, scores[qi * BK + j]);
        }
        let rescale = exp(running_max - step_max);
        running_max = step_max;
        let e0 = select(0.0, exp(s0 - step_max), seen0);
        let e1 = select(0.0, exp(s1 - step_max), seen1);
        running_sum = running_sum * rescale + e0 + e1;
        probs[qi * BK + g] = e0;
        probs[qi * BK + g + PER_TOKEN] = e1;
        workgroupBarrier();
        for (var m = 0u; m < OUT_QUADS; m++) {
            acc[m] = acc[m] * rescale;
        }
        for (var j = 0u; j < BK; j++) {
            let e = vec4<f32>(probs[qi * BK + j]);
            for (var m = 0u; m < OUT_QUADS; m++) {
                let d = g + m * PER_TOKEN;
                if (d < hd4) {
                    acc[m] = fma(e, rows[row_at(j, d)], acc[m]);
                }
            }
        }
    }
    // The token's softmax sum, from its threads' shares: `scores` is no longer read (every
    // thread has passed the last step's third barrier).
    scores[qi * BK + g] = running_sum;
    workgroupBarrier();
    var total = 0.0;
    for (var j = 0u; j < PER_TOKEN; j++) {
        total += scores[qi * BK + j];
    }
    if (t0 + qi < p.n_tokens) {
        let at = ((t0 + qi) * p.n_heads + h) * hd4;
        for (var m = 0u; m < OUT_QUADS; m++) {
            let d = g + m * PER_TOKEN;
            if (d < hd4) {
                out[at + d] = acc[m] / total;
            }
        }
    }
}
