// Causal grouped-query attention of n_tokens new tokens (decode: 1; prefill: a chunk) over
// the KV cache, as HF computes it: softmax(q·kᵀ · scale) · v — first pass (split-K, "flash
// decoding"): one workgroup per (token, head, split) handles the positions
// [split * split_len, (split + 1) * split_len) that the token sees, walking them in chunks of
// CHUNK with an online softmax (running max and sum, the output rescaled when the max grows),
// and writes its partial (unnormalized output, then max and sum) for attention_combine.wgsl.
// Token t sits at position step.pos0 + t and sees positions 0 ..= pos0 + t, or with a sliding
// window only the last `window` of them (pos0 + t - window < j: HF's sliding window); head h
// reads kv head h / (n_heads / n_kv_heads). The splits cover the positions the token sees
// (outside them nothing is read), split_len following their count (split_length: whole chunks,
// as few per split as n_splits allow), so a short context in a long cache still spreads over
// many workgroups, a windowed decode costs the window whatever the context, and one recorded
// dispatch serves every step.
//
// Built for latency (a decode step waits for it between dependent dispatches, and a split is
// typically one chunk): every thread issues all its loads of a chunk (keys, values) and the
// query's before its first wait (loops of a fixed count the compiler unrolls, guarded, into
// registers); the next chunk's loads go out while this one's softmax runs; and a chunk costs two
// barriers: LANES threads share each position's q·k (partial dots in `lanes`), a thread per
// position sums them into `scores`, then every thread reads the chunk's scores for the max (16
// broadcast vec4 reads, no tree of barriers). For probabilities·values each group of
// head_dim / 4 threads takes every value_groups-th position, a vec4 of dimensions per thread,
// and keeps its own share of the softmax sum; the groups' outputs and sums meet once, at the end.
// Cache layout, from cache_offset: keys and values both [kv_head][capacity][head_dim].
// head_dim and cache_offset are multiples of 4 (kernels/attention.rs checks), and builds this
// shader for MAX_HEAD_DIM 64, 128 and 256 and picks the smallest that holds head_dim: the
// register arrays sized for a larger head cost an H200 ~25% (fewer workgroups fit an SM).
//
// With p.fresh (decode and prefill of the session), the step's tokens arrive as the projection
// wrote them: q, k and v fields of their rows in `qkv`, without the rotary embedding. Then this
// kernel does rope_kv_store.wgsl's work itself, saving its dispatch: it rotates the queries as
// it loads them, reads the new positions' keys (rotated the same way) and values from `qkv`
// instead of the cache, and one workgroup per (token, kv head) stores them in the cache for
// later steps — positions no workgroup of this dispatch reads from the cache. Without it the
// queries are rotated and every position cached already (rope_kv_store ran).

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,     // at most MAX_HEAD_DIM
    n_tokens: u32,
    capacity: u32,
    cache_offset: u32, // elements: this layer's first key (and value)
    scale: f32,
    n_splits: u32,     // splits per (token, head): workgroups, some of them idle
    stats_offset: u32, // vec4s: where the (max, sum) of the splits start in `partials`
    q_stride: u32,     // row width and offset of the queries in q's token rows (multiples of 4)
    q_offset: u32,
    fresh: u32,        // 1: the step's tokens unrotated in qkv (see above)
    rope_dim: u32,     // fresh: leading dimensions of each head that rotate (a multiple of 8)
    neox: u32,         // fresh: 1: pairs (i, i + rope_dim/2) (qwen2); 0: pairs (2i, 2i + 1)
    k_offset: u32,     // fresh: where k and v start in the token rows (multiples of 4)
    v_offset: u32,
    window: u32,       // positions a token sees at most (u32 max: all)
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
}

struct Step {
    pos0: u32, // position of the first new token
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
// [token][.. q heads | k heads | v heads ..], each [head_dim] (the k and v fields: fresh only)
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> keys: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> vals: array<vec4<f32>>;
// [token][head][split][head_dim]: the unnormalized outputs, then from stats_offset
// [token][head][split] (max, sum, 0, 0)
@group(0) @binding(5) var<storage, read_write> partials: array<vec4<f32>>;
// fresh: [position][rope_dim / 2] (cos, sin), as rope_kv_store.wgsl reads it
@group(0) @binding(6) var<storage, read> cos_sin: array<vec2<f32>>;

const WORKGROUP: u32 = 256u;
// From kernels/attention.rs's header: CHUNK, positions per chunk (ATTENTION_CHUNK), and
// MAX_HEAD_DIM, the largest head of this pipeline (ATTENTION_HEAD_DIMS). Threads per
// position's dot:
const LANES: u32 = WORKGROUP / CHUNK;
// vec4s of a key row a lane reads, at most; positions a value group takes per chunk, at most
// (there are at least WORKGROUP / (MAX_HEAD_DIM / 4) value groups).
const LANE_QUADS: u32 = MAX_HEAD_DIM / 4u / LANES;
const GROUP_POSITIONS: u32 = CHUNK / (WORKGROUP / (MAX_HEAD_DIM / 4u));
// The lowest finite f32, written below its exact value: 3.4028235e38 rounds above f32::MAX as an
// abstract float, which Tint (Chromium) rejects.
const LOWEST: f32 = -3.4028234e38;

var<workgroup> q_head: array<vec4<f32>, MAX_HEAD_DIM / 4u>;
// The lanes' partial dots of each position of a chunk.
var<workgroup> lanes: array<vec4<f32>, CHUNK>;
// The chunk's scores (LOWEST past the split's end).
var<workgroup> scores: array<vec4<f32>, CHUNK / 4u>;
// The value groups' partial outputs and softmax sums.
var<workgroup> outs: array<vec4<f32>, WORKGROUP>;
var<workgroup> sums: array<f32, WORKGROUP>;

// Positions per split for a token that sees `len` positions: whole chunks, as few as spread
// them over n_splits splits (attention_combine.wgsl computes the same).
fn split_length(len: u32) -> u32 {
    let span = p.n_splits * CHUNK;
    return (len + span - 1u) / span * CHUNK;
}

// Quad d (elements 4d .. 4d + 4) of the head whose first quad is qkv[head], rotated for
// position pos with rope_kv_store.wgsl's expressions (fresh): explicit fmas, so that no driver
// fuses them differently in the two modules.
fn rotated(head: u32, d: u32, pos: u32) -> vec4<f32> {
    let x = qkv[head + d];
    let e = 4u * d;
    if (e >= p.rope_dim) {
        return x;
    }
    let half = p.rope_dim / 2u;
    let row = pos * half;
    if (p.neox == 0u) {
        // pairs (x, y) and (z, w): pair indices 2d and 2d + 1
        let a = cos_sin[row + 2u * d];
        let b = cos_sin[row + 2u * d + 1u];
        return vec4<f32>(fma(x.x, a.x, -(x.y * a.y)), fma(x.y, a.x, x.x * a.y),
                         fma(x.z, b.x, -(x.w * b.y)), fma(x.w, b.x, x.z * b.y));
    }
    // Each element pairs with the one half a rotation away: the quad half / 4 quads away.
    let first = e < half;
    let i = select(e - half, e, first);
    let other = qkv[select(head + d - half / 4u, head + d + half / 4u, first)];
    let c0 = cos_sin[row + i];
    let c1 = cos_sin[row + i + 1u];
    let c2 = cos_sin[row + i + 2u];
    let c3 = cos_sin[row + i + 3u];
    let cs = vec4<f32>(c0.x, c1.x, c2.x, c3.x);
    let sn = vec4<f32>(c0.y, c1.y, c2.y, c3.y);
    if (first) {
        return fma(x, cs, -(other * sn));
    }
    return fma(x, cs, other * sn);
}

// Quad d of kv head `kv`'s key at the step's position pos (fresh): from its token's qkv row,
// rotated.
fn fresh_key(kv: u32, pos: u32, d: u32) -> vec4<f32> {
    let hd4 = p.head_dim / 4u;
    return rotated(((pos - step.pos0) * p.q_stride + p.k_offset) / 4u + kv * hd4, d, pos);
}

// Quad d of kv head `kv`'s value at the step's position pos (fresh): from its token's qkv row.
fn fresh_value(kv: u32, pos: u32, d: u32) -> vec4<f32> {
    let hd4 = p.head_dim / 4u;
    return qkv[((pos - step.pos0) * p.q_stride + p.v_offset) / 4u + kv * hd4 + d];
}

// acc + dot(a, b), as four chained fused multiply-adds.
fn dot_acc(acc: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// The keys this thread dots for the chunk at c0: quads lane + i × LANES of position c0 + at.
// The cache's are loaded unconditionally (one batch of loads, no branch between them); a step's
// fresh position then takes its key from qkv instead (rotated), past the batch.
fn chunk_keys(kv_base: u32, kv: u32, c0: u32, at: u32, lane: u32, end: u32)
        -> array<vec4<f32>, LANE_QUADS> {
    var k: array<vec4<f32>, LANE_QUADS>;
    let at_pos = c0 + at;
    let hd4 = p.head_dim / 4u;
    if (at_pos < end) {
        let row = kv_base + at_pos * hd4;
        for (var i = 0u; i < LANE_QUADS; i++) {
            let d = lane + i * LANES;
            if (d < hd4) {
                k[i] = keys[row + d];
            }
        }
        if (p.fresh != 0u && at_pos >= step.pos0) {
            for (var i = 0u; i < LANE_QUADS; i++) {
                let d = lane + i * LANES;
                if (d < hd4) {
                    k[i] = fresh_key(kv, at_pos, d);
                }
            }
        }
    }
    return k;
}

// The values this thread weighs for the chunk at c0: quad vd of positions c0 + vg + i ×
// value_groups (a fresh position's from qkv, as for the keys).
fn chunk_values(kv_base: u32, kv: u32, c0: u32, vg: u32, vd: u32, end: u32)
        -> array<vec4<f32>, GROUP_POSITIONS> {
    var v: array<vec4<f32>, GROUP_POSITIONS>;
    let hd4 = p.head_dim / 4u;
    let value_groups = WORKGROUP / hd4;
    // (value_groups × GROUP_POSITIONS can exceed CHUNK when head_dim / 4 does not divide
    // WORKGROUP, or is below MAX_HEAD_DIM / 4)
    let chunk_end = min(end, c0 + CHUNK);
    if (vg < value_groups) {
        for (var i = 0u; i < GROUP_POSITIONS; i++) {
            let at_pos = c0 + vg + i * value_groups;
            if (at_pos < chunk_end) {
                v[i] = vals[kv_base + at_pos * hd4 + vd];
            }
        }
        if (p.fresh != 0u && chunk_end > step.pos0) {
            for (var i = 0u; i < GROUP_POSITIONS; i++) {
                let at_pos = c0 + vg + i * value_groups;
                if (at_pos < chunk_end && at_pos >= step.pos0) {
                    v[i] = fresh_value(kv, at_pos, vd);
                }
            }
        }
    }
    return v;
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
    // (at most the capacity: the session never steps past it; the clamp keeps every cache
    // access in range whatever the step buffer holds)
    let len = min(step.pos0 + t + 1u, p.capacity);
    // The first position the token sees (its window's).
    let start = len - min(len, p.window);
    let split_len = split_length(len - start);
    let first = start + split * split_len;
    // Splits past the token's last position have nothing to do (the combine skips them).
    if (first >= len) {
        return;
    }
    let end = min(len, first + split_len);
    let hd4 = p.head_dim / 4u;
    let group_size = p.n_heads / p.n_kv_heads;
    let kv = h / group_size;
    let kv_base = p.cache_offset / 4u + kv * p.capacity * hd4;
    let head = t * p.n_heads + h;
    let pos = len - 1u;

    // This thread's share of the dots: position `at` of a chunk, quads lane, lane + LANES, ...
    let at = lid / LANES;
    let lane = lid % LANES;
    // and of the output: quad vd over positions vg, vg + value_groups, ... (threads past the
    // last whole group idle there).
    let value_groups = WORKGROUP / hd4;
    let vg = lid / hd4;
    let vd = lid % hd4;
    // The first chunk's loads go out with the query's, in one round trip.
    var k = chunk_keys(kv_base, kv, first, at, lane, end);
    var v = chunk_values(kv_base, kv, first, vg, vd, end);
    if (lid < hd4) {
        let q_at = (t * p.q_stride + p.q_offset) / 4u + h * hd4;
        if (p.fresh != 0u) {
            q_head[lid] = rotated(q_at, lid, pos);
            // The token's own key and value go to the cache once: from its kv head's first
            // query head, the split holding its position.
            if (h % group_size == 0u && end == len) {
                keys[kv_base + pos * hd4 + lid] = fresh_key(kv, pos, lid);
                vals[kv_base + pos * hd4 + lid] = fresh_value(kv, pos, lid);
            }
        } else {
            q_head[lid] = qkv[q_at + lid];
        }
    }
    workgroupBarrier();

    var running_max = LOWEST;
    var running_sum = 0.0; // over this thread's value positions
    var acc = vec4<f32>(0.0);
    for (var c0 = first; c0 < end; c0 += CHUNK) {
        var dot = 0.0;
        for (var i = 0u; i < LANE_QUADS; i++) {
            let d = lane + i * LANES;
            if (d < hd4) {
                dot = dot_acc(dot, q_head[d], k[i]);
            }
        }
        // A thread here has passed the previous chunk's second barrier, after every read of
        // its lanes; the next chunk's keys load meanwhile.
        lanes[at][lane] = dot;
        let next = c0 + CHUNK;
        if (next < end) {
            k = chunk_keys(kv_base, kv, next, at, lane, end);
        }
        workgroupBarrier();
        // A thread here has passed this chunk's first barrier, after every read of the
        // previous chunk's scores.
        if (lid < CHUNK) {
            let l = lanes[lid];
            var score = LOWEST;
            if (c0 + lid < end) {
                score = (((l.x + l.y) + l.z) + l.w) * p.scale;
            }
            scores[lid / 4u][lid % 4u] = score;
        }
        workgroupBarrier();
        // Positions past the end score LOWEST: they never raise the max.
        var chunk_max = running_max;
        for (var j = 0u; j < CHUNK / 4u; j++) {
            let s4 = scores[j];
            chunk_max = max(chunk_max, max(max(s4.x, s4.y), max(s4.z, s4.w)));
        }
        let rescale = exp(running_max - chunk_max);
        running_max = chunk_max;
        var a = acc * rescale;
        var sum = running_sum * rescale;
        let n = min(CHUNK, end - c0);
        if (vg < value_groups) {
            for (var i = 0u; i < GROUP_POSITIONS; i++) {
                let j = vg + i * value_groups;
                if (j < n) {
                    let e = exp(scores[j / 4u][j % 4u] - chunk_max);
                    sum += e;
                    a = fma(vec4<f32>(e), v[i], a);
                }
            }
        }
        acc = a;
        running_sum = sum;
        if (next < end) {
            v = chunk_values(kv_base, kv, next, vg, vd, end);
        }
    }
    outs[lid] = acc;
    sums[lid] = running_sum;
    workgroupBarrier();
    let slot = head * p.n_splits + split;
    if (lid == 0u) {
        // Each value group's sum once (all its threads hold it).
        var total = 0.0;
        for (var g = 0u; g < value_groups; g++) {
            total += sums[g * hd4];
        }
        partials[p.stats_offset + slot] = vec4<f32>(running_max, total, 0.0, 0.0);
    }
    if (lid < hd4) {
        var out = vec4<f32>(0.0);
        for (var g = 0u; g < value_groups; g++) {
            out += outs[g * hd4 + lid];
        }
        partials[slot * hd4 + lid] = out;
    }
}
