// y[first_row + r] = dot(row r of W, x) for the rows of one weight part. The tensor type comes
// from a block snippet prepended to this file (quant_<type>.wgsl): slice_x() loads the
// activations of one 8-element slice, slice_dot() dots them with one row's slice.
//
// A workgroup owns ROWS_PER_THREAD rows; its threads take consecutive slices (so a subgroup's
// loads are contiguous), each thread dotting a slice's activations with all the rows (x is read
// once per 2 rows). A reduction entry point appended to this file (matvec_subgroup.wgsl or
// matvec_workgroup.wgsl) sums the threads' partials and calls store_rows(). WORKGROUP is set
// per pipeline (kernels.rs picks 64, 128 or 256 threads from the row length).
// (A thread reading a whole unit's quants in one 16-byte load, 8 vec4 of x, was 2x slower on an
// H200 for Q4_0 and Q8_0: 580 vs 1016 GB/s on 11008 x 2048.)
//
// Fused in for decode, where each separate dispatch would cost a launch and a drain (NORM and
// SILU are pipeline constants: a branch on a uniform between a thread's loads would keep the
// compiler from issuing the loads of its slices together):
// - NORM: x is RMS-normalized (LlamaRMSNorm, the weight applied to x). The threads sum x²
//   of their slices with the dots and reduce it with them, and the row's dot is scaled by
//   1 / sqrt(mean(x²) + eps) at the end: no extra pass over x, no extra wait. (Scaling the dot
//   instead of each x rounds differently, within the order-of-summation noise of any dot.)
// - SILU: x is the gate and the activations are silu(gate) * up, as silu_mul.wgsl computes
//   them (the same values).
// - SWIGLU: the rows are [gate_0, up_0, gate_1, up_1, ...] (a stacked gate|up matrix with its
//   rows interleaved at upload, stack.rs) and each workgroup's pair (2 rows a workgroup) writes
//   y[pair] = silu(gate) * up, as silu_mul.wgsl computes it: the FFN's activation straight out
//   of the matvec, no [gate | up] row in between.
// - `bias` and `accumulate`: y = (W·x + bias) or y += W·x, as separate adds would round.

struct Params {
    part: Layout,   // where the weight part's arrays lie
    rows: u32,      // rows in this part
    cols: u32,      // elements per row
    first_row: u32, // index in y of the part's first row
    accumulate: u32, // 1: y += W·x (a residual add fused in); 0: y = W·x
    bias: u32,       // 1: plus bias[row] (before an accumulate)
    eps: f32,        // of the norm (NORM)
    up_offset: u32,  // vec4s: where up starts in its binding (SILU)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
    _pad4: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
// x and x4 are one binding: F32 reads scalars, the block types 16-byte words.
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
// The norm's weights, zero-padded to whole slices (8 elements).
@group(0) @binding(5) var<storage, read> norm_weight: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> up: array<vec4<f32>>;

override WORKGROUP: u32 = 256u;
// x is RMS-normalized, by norm_weight and p.eps.
override NORM: bool = false;
// The activations are silu(x) * up (x: the gate).
override SILU: bool = false;
// The rows are (gate, up) pairs: y[pair] = silu(gate) * up.
override SWIGLU: bool = false;
const ROWS_PER_THREAD: u32 = 2u;

// g * sigmoid(g) as torch computes it (silu_mul.wgsl).
fn silu(g: vec4<f32>) -> vec4<f32> {
    return g * (1.0 / (1.0 + exp(-g)));
}

// acc + the partials of slice s with rows r0, r1: (dot with r0, dot with r1, x², 0) of the
// activations, which are x, norm_weight * x (norm; x² of x itself) or silu(x) * up (silu).
fn add_slice(acc: vec4<f32>, r0: u32, r1: u32, s: u32) -> vec4<f32> {
    var xs = slice_x(s);
    var squares = 0.0;
    if (NORM) {
        squares = dot_acc(dot_acc(0.0, xs[0], xs[0]), xs[1], xs[1]);
        xs[0] = norm_weight[2u * s] * xs[0];
        xs[1] = norm_weight[2u * s + 1u] * xs[1];
    }
    if (SILU) {
        xs[0] = silu(xs[0]) * up[p.up_offset + 2u * s];
        xs[1] = silu(xs[1]) * up[p.up_offset + 2u * s + 1u];
    }
    return acc + vec4<f32>(slice_dot(r0, s, xs), slice_dot(r1, s, xs), squares, 0.0);
}

// The partials of thread `lid` with the workgroup's rows: slices lid, lid + WORKGROUP, ...
// added in that order.
fn partial_dots(group: u32, lid: u32) -> vec4<f32> {
    let first = group * ROWS_PER_THREAD;
    // A row past the part's end repeats its last row (store_rows skips it): no branches here.
    let r0 = min(first, p.rows - 1u);
    let r1 = min(first + 1u, p.rows - 1u);
    let n = row_slices();
    var acc = vec4<f32>(0.0);
    var s = lid;
    // Two slices a trip, so that a thread has the loads of both in flight at once.
    for (; s + WORKGROUP < n; s += 2u * WORKGROUP) {
        acc = add_slice(add_slice(acc, r0, r1, s), r0, r1, s + WORKGROUP);
    }
    if (s < n) {
        acc = add_slice(acc, r0, r1, s);
    }
    return acc;
}

// Writes the dots of the workgroup `group` with its rows (the sums of its threads' partials).
fn store_rows(group: u32, sums: vec4<f32>) {
    var scale = 1.0;
    if (NORM) {
        // inverseSqrt() is allowed 2 ulp of error; a true division keeps HF's rounding.
        scale = 1.0 / sqrt(sums.z / f32(p.cols) + p.eps);
    }
    if (SWIGLU) {
        // The part's rows are whole pairs from an even first_row (kernels.rs checks).
        var g = sums.x;
        var u = sums.y;
        if (NORM) {
            g = g * scale;
            u = u * scale;
        }
        y[p.first_row / 2u + group] = (g * (1.0 / (1.0 + exp(-g)))) * u;
        return;
    }
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let r = group * ROWS_PER_THREAD + i;
        if (r < p.rows) {
            var v = sums[i];
            if (NORM) {
                v = v * scale;
            }
            if (p.bias != 0u) {
                v = v + bias[p.first_row + r];
            }
            if (p.accumulate != 0u) {
                v = y[p.first_row + r] + v;
            }
            y[p.first_row + r] = v;
        }
    }
}
