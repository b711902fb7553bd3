// Index of the largest of n values, the first one on ties (torch.argmax), for greedy decoding
// without reading the logits back. Two passes, so that a vocabulary of 150k logits is read by
// many workgroups, not one: `spans` — workgroup g finds the first maximum of values
// [g * SPAN, (g + 1) * SPAN) and writes it to best[1 + 2g] (value bits) and best[2 + 2g]
// (index); `main` — one workgroup picks the first maximum of those and writes its index to
// best[0]. Both entry points use binding 1 for a different buffer (values, best).
//
// Several rows of n values (a verification pass's logits, a row per token) take a workgroup
// per (row, span) and one per row: row r's values start at r * n, its results at r * (1 + 2 *
// spans) (the same layout per row).

struct Params {
    n: u32,     // values a row
    spans: u32, // ceil(n / SPAN)
    rows: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read_write> spans_best: array<u32>;
@group(0) @binding(1) var<storage, read_write> best: array<u32>;

// WORKGROUP and SPAN (values per workgroup of the first pass) come from kernels/argmax.rs.
var<workgroup> best_value: array<f32, WORKGROUP>;
var<workgroup> best_index: array<u32, WORKGROUP>;

// Tree reduction of the threads' (value, index) to the first maximum, in best_value[0] and
// best_index[0].
fn reduce(lid: u32) {
    workgroupBarrier();
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = best_value[lid + s];
            let i = best_index[lid + s];
            if (v > best_value[lid] || (v == best_value[lid] && i < best_index[lid])) {
                best_value[lid] = v;
                best_index[lid] = i;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(WORKGROUP)
fn spans(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    // 2-D dispatch past the per-dimension limit: whole groups past the last leave together.
    let g = wid.x + wid.y * groups.x;
    if (g >= p.rows * p.spans) {
        return;
    }
    let row = g / p.spans;
    let span = g % p.spans;
    let row_values = row * p.n;
    let out = row * (1u + 2u * p.spans);
    let first = span * SPAN;
    let end = min(p.n, first + SPAN);
    // Each thread scans its indices in increasing order, so `>` keeps its first maximum; a
    // thread with none starts from the span's first value (a tie it loses on index).
    var bi = min(first + lid, end - 1u);
    var bv = values[row_values + bi];
    for (var i = first + lid + WORKGROUP; i < end; i += WORKGROUP) {
        let v = values[row_values + i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
    best_value[lid] = bv;
    best_index[lid] = bi;
    reduce(lid);
    if (lid == 0u) {
        spans_best[out + 1u + 2u * span] = bitcast<u32>(best_value[0]);
        spans_best[out + 2u + 2u * span] = best_index[0];
    }
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // a workgroup per row
    let row = wid.x + wid.y * groups.x;
    if (row >= p.rows) {
        return;
    }
    let out = row * (1u + 2u * p.spans);
    var bv = bitcast<f32>(best[out + 1u]);
    var bi = best[out + 2u];
    // Spans in increasing order: `>` keeps the first maximum.
    for (var g = lid; g < p.spans; g += WORKGROUP) {
        let v = bitcast<f32>(best[out + 1u + 2u * g]);
        if (v > bv) {
            bv = v;
            bi = best[out + 2u + 2u * g];
        }
    }
    best_value[lid] = bv;
    best_index[lid] = bi;
    reduce(lid);
    if (lid == 0u) {
        best[out] = best_index[0];
    }
}
