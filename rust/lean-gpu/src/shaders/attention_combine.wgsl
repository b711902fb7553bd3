// Second pass of attention (see attention.wgsl): for each (token, head), the partials of the
// splits the token saw are merged — rescaled to the overall max, summed, divided by the total
// softmax sum. One workgroup per (token, head), one thread per output dimension.

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
    var overall_max = -3.4028234e38;
    for (var s = 0u; s < used; s++) {
        overall_max = max(overall_max, partials[base + s * (hd + 2u)]);
    }
    var total = 0.0;
    for (var s = 0u; s < used; s++) {
        let at = base + s * (hd + 2u);
        total += partials[at + 1u] * exp(partials[at] - overall_max);
    }
    for (var d = lid; d < hd; d += WORKGROUP) {
        var acc = 0.0;
        for (var s = 0u; s < used; s++) {
            let at = base + s * (hd + 2u);
            acc += partials[at + 2u + d] * exp(partials[at] - overall_max);
        }
        out[(t * p.n_heads + h) * hd + d] = acc / total;
    }
}
