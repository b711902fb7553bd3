// y[first_row + r] = dot(row r of W, x) for the rows of one weight part. The tensor type comes
// from a block snippet prepended to this file (quant_<type>.wgsl): slice_x() loads the
// activations of one 8-element slice, slice_dot() dots them with one row's slice.
//
// A workgroup owns ROWS_PER_THREAD rows; its threads take consecutive slices (so a subgroup's
// loads are contiguous), each thread dotting a slice's activations with all the rows (x is read
// once per ROWS_PER_THREAD rows). kernels.rs prepends ROWS_PER_THREAD and `Dots`, the vector
// of a thread's partial dots (vec2 or vec4). A reduction entry point appended to this file
// (matvec_subgroup.wgsl or matvec_workgroup.wgsl) sums the threads' partial dots and calls
// store_rows(). WORKGROUP is set per pipeline (kernels.rs picks 64, 128 or 256 threads from the
// row length).
//
// With `norm`, x is first RMS-normalized as rms_norm.wgsl does (the same expressions, so the
// same values): every workgroup sums x² itself, which costs it a read of x that is in cache,
// where a separate dispatch would cost decode a whole launch and drain. With `silu`, x is the
// gate and the activations are silu(gate) * up, as silu_mul.wgsl computes them (the same
// reason: the down projection reads them straight from the gate and up projections' output).

struct Params {
    part: Layout,   // where the weight part's arrays lie
    rows: u32,      // rows in this part
    cols: u32,      // elements per row
    first_row: u32, // index in y of the part's first row
    accumulate: u32, // 1: y += W·x (a residual add fused in); 0: y = W·x
    bias: u32,       // 1: plus bias[row] (before an accumulate)
    norm: u32,       // 1: x is RMS-normalized first, by norm_weight and eps
    eps: f32,
    silu: u32,       // 1: the activations are silu(x) * up (x: the gate)
    up_offset: u32,  // vec4s: where up starts in its binding
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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
var<workgroup> squares: array<f32, 256>; // the largest WORKGROUP

// g * sigmoid(g) as torch computes it (silu_mul.wgsl).
fn silu(g: vec4<f32>) -> vec4<f32> {
    return g * (1.0 / (1.0 + exp(-g)));
}

// 1 / sqrt(mean(x²) + eps) over the row x, as rms_norm.wgsl computes it; every thread gets it.
fn norm_scale(lid: u32) -> f32 {
    var acc = 0.0;
    // slice_x reads the row as the dots do (F32 rows ending inside a slice: zeros)
    for (var s = lid; s < row_slices(); s += WORKGROUP) {
        let xs = slice_x(s);
        acc = dot_acc(dot_acc(acc, xs[0], xs[0]), xs[1], xs[1]);
    }
    squares[lid] = acc;
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            squares[lid] += squares[lid + s];
        }
    }
    workgroupBarrier();
    return 1.0 / sqrt(squares[0] / f32(p.cols) + p.eps);
}

// The activations of slice s, with the norm (by inv) or silu · up applied when asked for.
fn activations(s: u32, inv: f32) -> array<vec4<f32>, 2> {
    var xs = slice_x(s);
    if (p.norm != 0u) {
        xs[0] = norm_weight[2u * s] * (xs[0] * inv);
        xs[1] = norm_weight[2u * s + 1u] * (xs[1] * inv);
    }
    if (p.silu != 0u) {
        xs[0] = silu(xs[0]) * up[p.up_offset + 2u * s];
        xs[1] = silu(xs[1]) * up[p.up_offset + 2u * s + 1u];
    }
    return xs;
}

// The partial dots with the workgroup's rows of its thread `lid`: slices lid, lid + WORKGROUP,
// ... added in that order.
fn partial_dots(group: u32, lid: u32) -> Dots {
    let first = group * ROWS_PER_THREAD;
    var inv = 0.0;
    if (p.norm != 0u) {
        inv = norm_scale(lid);
    }
    let n = row_slices();
    var acc = Dots(0.0);
    var s = lid;
    // Two slices a trip, so that a thread has the loads of both in flight at once: a loop trip
    // waits for its loads, and rows are short enough that this latency, not bandwidth, bounds.
    for (; s + WORKGROUP < n; s += 2u * WORKGROUP) {
        let xa = activations(s, inv);
        let xb = activations(s + WORKGROUP, inv);
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            // A row past the part's end repeats its last row (store_rows skips it).
            let r = min(first + i, p.rows - 1u);
            acc[i] += slice_dot(r, s, xa);
            acc[i] += slice_dot(r, s + WORKGROUP, xb);
        }
    }
    if (s < n) {
        let xs = activations(s, inv);
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            acc[i] += slice_dot(min(first + i, p.rows - 1u), s, xs);
        }
    }
    return acc;
}

// Writes the dots of the workgroup `group` with its rows.
fn store_rows(group: u32, dots: Dots) {
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let r = group * ROWS_PER_THREAD + i;
        if (r < p.rows) {
            var v = dots[i];
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
