// Greedy decoding under a constraint: the index of the largest of n values among the tokens a
// bitset allows (bit i % 32 of word i / 32 for value i), the first one on ties, or NONE when
// none is allowed; exactly lean::sampling::argmax_masked. Two passes, as argmax.wgsl: `spans`
// — workgroup g finds the best allowed value of [g * SPAN, (g + 1) * SPAN) and writes its key to
// best[1 + 2g] and its index to best[2 + 2g]; `main` — one workgroup picks the best of those and
// writes its index to best[0]. Both entry points use binding 1 for a different buffer (values,
// best). No subgroup operations (a browser's WebGPU may have none).
//
// Several rows (a verification pass under a constraint: a row of logits and a mask per token)
// take a workgroup per (row, span) and one per row: row r's values start at r * n, its mask at
// r * ceil(n / 32), its results at r * (1 + 2 * spans) (the same layout per row).
//
// Values are compared as u32 keys that order like the floats (so the comparison is exact on
// every device, subnormals included): a NaN is -inf's key, -0.0 is 0.0's. "Better" is a larger
// key, or the same key at a lower index: a total order, so the reduction's shape does not
// change the result. Every key (even -inf's) is above 0, the key of "no token yet".

struct Params {
    n: u32,     // values a row
    spans: u32, // ceil(n / SPAN)
    rows: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read> mask: array<u32>;
@group(0) @binding(3) var<storage, read_write> spans_best: array<u32>;
@group(0) @binding(1) var<storage, read_write> best: array<u32>;

// WORKGROUP and SPAN (values per workgroup of the first pass) come from kernels/argmax_masked.rs.
const NONE: u32 = 0xffffffffu;

var<workgroup> best_key: array<u32, WORKGROUP>;
var<workgroup> best_index: array<u32, WORKGROUP>;

// The order-preserving key of a float: negatives flipped below the positives.
fn key_of(v: f32) -> u32 {
    var bits = bitcast<u32>(v);
    let magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        bits = 0xff800000u; // NaN counts as -inf
    } else if (magnitude == 0u) {
        bits = 0u; // -0.0 equals 0.0
    }
    if ((bits & 0x80000000u) != 0u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

fn better(k: u32, i: u32, bk: u32, bi: u32) -> bool {
    return k > bk || (k == bk && i < bi);
}

// Tree reduction of the threads' (key, index) to the best, in best_key[0] and best_index[0].
fn reduce(lid: u32) {
    workgroupBarrier();
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let k = best_key[lid + s];
            let i = best_index[lid + s];
            if (better(k, i, best_key[lid], best_index[lid])) {
                best_key[lid] = k;
                best_index[lid] = i;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(WORKGROUP)
fn spans(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // A dispatch past the per-dimension limit is spread over rows (kernels/mod.rs: dispatch);
    // its extra groups have no span (uniform: the whole group skips the loop and the write).
    let g = wid.x + wid.y * groups.x;
    let row = g / p.spans;
    let span = g % p.spans;
    let row_values = row * p.n;
    let row_mask = row * ((p.n + 31u) / 32u);
    let first = span * SPAN;
    let end = select(0u, min(p.n, first + SPAN), row < p.rows);
    var bk = 0u;
    var bi = NONE;
    // Each thread scans its indices in increasing order, so `>` keeps its first best; the
    // logits of disallowed tokens are never read.
    for (var i = first + lid; i < end; i += WORKGROUP) {
        if (((mask[row_mask + (i >> 5u)] >> (i & 31u)) & 1u) != 0u) {
            let k = key_of(values[row_values + i]);
            if (k > bk) {
                bk = k;
                bi = i;
            }
        }
    }
    best_key[lid] = bk;
    best_index[lid] = bi;
    reduce(lid);
    if (lid == 0u && row < p.rows) {
        let out = row * (1u + 2u * p.spans);
        spans_best[out + 1u + 2u * span] = best_key[0];
        spans_best[out + 2u + 2u * span] = best_index[0];
    }
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // a workgroup per row (uniform: a group past the last skips the loop and the write)
    let row = wid.x + wid.y * groups.x;
    let out = row * (1u + 2u * p.spans);
    let spans = select(0u, p.spans, row < p.rows);
    var bk = 0u;
    var bi = NONE;
    // Spans in increasing order: `>` keeps the first best.
    for (var g = lid; g < spans; g += WORKGROUP) {
        let k = best[out + 1u + 2u * g];
        if (k > bk) {
            bk = k;
            bi = best[out + 2u + 2u * g];
        }
    }
    best_key[lid] = bk;
    best_index[lid] = bi;
    reduce(lid);
    if (lid == 0u && row < p.rows) {
        best[out] = best_index[0];
    }
}
