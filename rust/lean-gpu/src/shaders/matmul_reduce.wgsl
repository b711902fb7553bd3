// The second pass of a matmul with K split (matmul.wgsl): y[t * out_stride + first_row + r] =
// the sum over ranges s, in order, of partial[s][t][r] (each slab n_tokens × rows), plus
// bias[first_row + r] with `bias`, added to y when accumulating. With `swiglu` the rows are
// (gate, up) pairs from an even first row (matmul.wgsl: SWIGLU) and y's column
// (first_row + r) / 2 gets act(gate) · up. One thread per output.

struct Params {
    rows: u32,
    n_tokens: u32,
    out_stride: u32,
    first_row: u32,
    splits: u32,
    accumulate: u32,
    bias: u32,
    swiglu: u32, // 0: none; the activation of the pairs: 1 SiLU, 2 GELU-tanh (activation.wgsl)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> partial: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
// Read with p.bias (y is bound here without).
@group(0) @binding(3) var<storage, read> bias: array<f32>;

// WORKGROUP (threads per workgroup) comes from kernels/matmul.rs: MATMUL_REDUCE_GROUP.

// The partial sums of output `i` (t × rows + r) over the ranges, in order.
fn split_sum(slab: u32, i: u32) -> f32 {
    var sum = partial[i];
    for (var s = 1u; s < p.splits; s++) {
        sum += partial[s * slab + i];
    }
    return sum;
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    let slab = p.rows * p.n_tokens;
    if (p.swiglu != 0u) {
        // Thread i: pair i % (rows / 2) of token i / (rows / 2).
        let pairs = p.rows / 2u;
        if (i >= pairs * p.n_tokens) {
            return;
        }
        let t = i / pairs;
        let r = 2u * (i % pairs);
        let gate = split_sum(slab, t * p.rows + r);
        let up = split_sum(slab, t * p.rows + r + 1u);
        y[t * p.out_stride + (p.first_row + r) / 2u] = activate(p.swiglu == 2u, gate) * up;
        return;
    }
    if (i >= slab) {
        return;
    }
    var sum = split_sum(slab, i);
    if (p.bias != 0u) {
        sum = sum + bias[p.first_row + i % p.rows];
    }
    let at = (i / p.rows) * p.out_stride + p.first_row + i % p.rows;
    if (p.accumulate != 0u) {
        sum = y[at] + sum;
    }
    y[at] = sum;
}
