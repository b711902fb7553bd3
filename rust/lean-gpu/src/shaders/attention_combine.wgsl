// Second pass of attention (see attention.wgsl): for each (token, head), the partials of the
// splits the token saw are merged — rescaled to the overall max, summed, divided by the total
// softmax sum. One workgroup per (token, head): a thread per split finds the weights, then a
// thread per output dimension sums.

struct Params {
    n_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    n_splits: u32,
    split_len: u32,
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
@group(0) @binding(2) var<storage, read> partials: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [token][head][head_dim]

const WORKGROUP: u32 = 64u;
// At most this many splits (kernels.rs: ATTENTION_SPLITS_PER_HEAD).
const MAX_SPLITS: u32 = 64u;

// Per split: its weight exp(max_s - overall max) / total.
var<workgroup> weights: array<f32, MAX_SPLITS>;
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
    let hd = p.head_dim;
    let len = step.pos0 + t + 1u;
    let used = (len + p.split_len - 1u) / p.split_len;
    let base = (t * p.n_heads + h) * p.n_splits * (hd + 2u);
    // Thread s < used holds split s's max and sum (WORKGROUP = MAX_SPLITS covers them all).
    var split_max = -3.4028234e38;
    var split_sum = 0.0;
    if (lid < used) {
        split_max = partials[base + lid * (hd + 2u)];
        split_sum = partials[base + lid * (hd + 2u) + 1u];
    }
    partial[lid] = split_max;
    let overall_max = reduce(lid, true);
    var scale = 0.0;
    if (lid < used) {
        scale = exp(split_max - overall_max);
    }
    partial[lid] = split_sum * scale;
    let total = reduce(lid, false);
    if (lid < MAX_SPLITS) {
        weights[lid] = scale;
    }
    workgroupBarrier();
    for (var d = lid; d < hd; d += WORKGROUP) {
        var acc = 0.0;
        for (var s = 0u; s < used; s++) {
            acc += partials[base + s * (hd + 2u) + 2u + d] * weights[s];
        }
        out[(t * p.n_heads + h) * hd + d] = acc / total;
    }
}
