// The second pass of a matmul with K split (matmul.wgsl): y[t * out_stride + first_row + r] =
// the sum over ranges s, in order, of partial[s][t][r] (each slab n_tokens × rows), added to y
// when accumulating. One thread per output.

struct Params {
    rows: u32,
    n_tokens: u32,
    out_stride: u32,
    first_row: u32,
    splits: u32,
    accumulate: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> partial: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

const WORKGROUP: u32 = 256u;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    let slab = p.rows * p.n_tokens;
    if (i >= slab) {
        return;
    }
    var sum = partial[i];
    for (var s = 1u; s < p.splits; s++) {
        sum += partial[s * slab + i];
    }
    let at = (i / p.rows) * p.out_stride + p.first_row + i % p.rows;
    if (p.accumulate != 0u) {
        sum = y[at] + sum;
    }
    y[at] = sum;
}
