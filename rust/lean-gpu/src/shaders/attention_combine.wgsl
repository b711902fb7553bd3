// Second pass of attention (see attention.wgsl): for each (token, head), the partials of the
// splits the token saw are merged — rescaled to the overall max, summed, divided by the total
// softmax sum. One workgroup per (token, head); each group of head_dim / 4 threads takes every
// split_groups-th split, a vec4 of dimensions per thread. Built for latency: every thread issues
// its partials' loads at once (a loop of fixed count, guarded), with a thread per split loading
// its (max, sum); one barrier publishes those, each thread then reads them all (broadcast reads,
// no tree of barriers), and one more meets the groups' sums.

struct Params {
    n_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    n_splits: u32,
    stats_offset: u32, // vec4s: where the splits' (max, sum) start in `partials`
    capacity: u32,
    window: u32, // positions a token sees at most (u32 max: all)
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
// From kernels/attention.rs's header: MAX_SPLITS, splits at most (ATTENTION_SPLITS_PER_HEAD),
// attention.wgsl's CHUNK and, per pipeline as there (64, 128 or 256), MAX_HEAD_DIM, sizing
// the register array. Splits a group of threads takes at most (there are at least
// WORKGROUP / (MAX_HEAD_DIM / 4) groups):
const GROUP_SPLITS: u32 = MAX_SPLITS / (WORKGROUP / (MAX_HEAD_DIM / 4u));
const LOWEST: f32 = -3.4028234e38;

// Per split: its (max, sum).
var<workgroup> stats: array<vec2<f32>, MAX_SPLITS>;
var<workgroup> outs: array<vec4<f32>, WORKGROUP>;

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
    // attention.wgsl's clamp, window and split_length
    let len = min(step.pos0 + t + 1u, p.capacity);
    let seen = min(len, p.window);
    let span = p.n_splits * CHUNK;
    let split_len = (seen + span - 1u) / span * CHUNK;
    let used = (seen + split_len - 1u) / split_len;
    let first = (t * p.n_heads + h) * p.n_splits;
    let split_groups = WORKGROUP / hd4;
    let g = lid / hd4;
    let d = lid % hd4;
    var parts: array<vec4<f32>, GROUP_SPLITS>;
    if (g < split_groups) {
        for (var i = 0u; i < GROUP_SPLITS; i++) {
            let s = g + i * split_groups;
            if (s < used) {
                parts[i] = partials[(first + s) * hd4 + d];
            }
        }
    }
    if (lid < MAX_SPLITS) {
        var st = vec2<f32>(LOWEST, 0.0);
        if (lid < used) {
            st = partials[p.stats_offset + first + lid].xy;
        }
        stats[lid] = st;
    }
    workgroupBarrier();
    var overall_max = LOWEST;
    for (var s = 0u; s < used; s++) {
        overall_max = max(overall_max, stats[s].x);
    }
    var acc = vec4<f32>(0.0);
    if (g < split_groups) {
        for (var i = 0u; i < GROUP_SPLITS; i++) {
            let s = g + i * split_groups;
            if (s < used) {
                acc = fma(vec4<f32>(exp(stats[s].x - overall_max)), parts[i], acc);
            }
        }
    }
    outs[lid] = acc;
    workgroupBarrier();
    if (lid < hd4) {
        var total = 0.0;
        for (var s = 0u; s < used; s++) {
            total += stats[s].y * exp(stats[s].x - overall_max);
        }
        var sum = vec4<f32>(0.0);
        for (var k = 0u; k < split_groups; k++) {
            sum += outs[k * hd4 + lid];
        }
        out[(t * p.n_heads + h) * hd4 + lid] = sum / total;
    }
}
