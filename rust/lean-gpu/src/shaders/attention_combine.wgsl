// Second pass of attention (see attention.wgsl): for each (token, head), the partials of the
// splits the token saw are merged — rescaled to the overall max, summed, divided by the total
// softmax sum. One workgroup per (token, head): a thread per split finds the weights, then each
// group of head_dim / 4 threads sums every groups-th split, a vec4 of dimensions per thread, all
// its loads issued at once (a loop of fixed count, guarded: latency, not bandwidth, is its cost).

struct Params {
    n_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    n_splits: u32,
    split_len: u32,
    stats_offset: u32, // vec4s: where the splits' (max, sum) start in `partials`
    _pad0: u32,
    _pad1: u32,
}

struct Step {
    pos0: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>; // [token][head][head_dim]

const WORKGROUP: u32 = 256u;
// At most this many splits (kernels.rs: ATTENTION_SPLITS_PER_HEAD).
const MAX_SPLITS: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
// Splits a group of threads takes at most (there are at least WORKGROUP / (MAX_HEAD_DIM / 4)
// groups).
const GROUP_SPLITS: u32 = MAX_SPLITS / (WORKGROUP / (MAX_HEAD_DIM / 4u));

// Per split: its weight exp(max_s - overall max).
var<workgroup> weights: array<f32, MAX_SPLITS>;
var<workgroup> partial: array<f32, MAX_SPLITS>;
var<workgroup> outs: array<vec4<f32>, WORKGROUP>;

// Tree reduction of `partial` by max (is_max) or sum; every thread gets the result.
fn reduce(lid: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    for (var s = MAX_SPLITS / 2u; s > 0u; s >>= 1u) {
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
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    let h = group % p.n_heads;
    let t = group / p.n_heads;
    if (t >= p.n_tokens) {
        return;
    }
    let hd4 = p.head_dim / 4u;
    let len = step.pos0 + t + 1u;
    let used = (len + p.split_len - 1u) / p.split_len;
    let first = (t * p.n_heads + h) * p.n_splits;
    // Thread s < used holds split s's max and sum.
    var stats = vec4<f32>(-3.4028234e38, 0.0, 0.0, 0.0);
    if (lid < used) {
        stats = partials[p.stats_offset + first + lid];
    }
    if (lid < MAX_SPLITS) {
        partial[lid] = stats.x;
    }
    let overall_max = reduce(lid, true);
    var scale = 0.0;
    if (lid < used) {
        scale = exp(stats.x - overall_max);
    }
    if (lid < MAX_SPLITS) {
        partial[lid] = stats.y * scale;
        weights[lid] = scale;
    }
    let total = reduce(lid, false); // its barriers also publish `weights`
    let split_groups = WORKGROUP / hd4;
    let g = lid / hd4;
    let d = lid % hd4;
    var acc = vec4<f32>(0.0);
    if (g < split_groups) {
        for (var i = 0u; i < GROUP_SPLITS; i++) {
            let s = g + i * split_groups;
            if (s < used) {
                acc = fma(vec4<f32>(weights[s]), partials[(first + s) * hd4 + d], acc);
            }
        }
    }
    outs[lid] = acc;
    workgroupBarrier();
    if (lid < hd4) {
        var sum = vec4<f32>(0.0);
        for (var k = 0u; k < split_groups; k++) {
            sum += outs[k * hd4 + lid];
        }
        out[(t * p.n_heads + h) * hd4 + lid] = sum / total;
    }
}
