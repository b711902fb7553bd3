// y[first_row + r] = dot(row r of W, x) for the rows of one weight part. The tensor type comes
// from a block snippet prepended to this file (quant_<type>.wgsl): slice_x() loads the
// activations of one 8-element slice, slice_dot() dots them with one row's slice.
//
// A workgroup owns ROWS_PER_THREAD rows; its threads take consecutive slices (so a subgroup's
// loads are contiguous), each thread dotting a slice's activations with all the rows (x is read
// once per ROWS_PER_THREAD rows). kernels.rs prepends ROWS_PER_THREAD and `Dots`, the vector
// of a thread's partial dots (vec2 or vec4). A reduction entry point appended to this file (matvec_subgroup.wgsl or
// matvec_workgroup.wgsl) sums the threads' partial dots and calls store_rows(). WORKGROUP is
// set per pipeline (kernels.rs picks 64, 128 or 256 threads from the row length).

struct Params {
    part: Layout,   // where the weight part's arrays lie
    rows: u32,      // rows in this part
    cols: u32,      // elements per row
    first_row: u32, // index in y of the part's first row
    accumulate: u32, // 1: y += W·x (a residual add fused in); 0: y = W·x
    bias: u32,       // 1: plus bias[row] (before an accumulate)
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

override WORKGROUP: u32 = 256u;

// The partial dots with the workgroup's rows of its thread `lid`.
fn partial_dots(group: u32, lid: u32) -> Dots {
    let first = group * ROWS_PER_THREAD;
    var acc = Dots(0.0);
    for (var s = lid; s < row_slices(); s += WORKGROUP) {
        let xs = slice_x(s);
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            // A row past the part's end repeats its last row (store_rows skips it).
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
