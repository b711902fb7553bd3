// Index of the largest of n values, the first one on ties (torch.argmax), for greedy decoding
// without reading the logits back. One workgroup.

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read_write> result: array<u32>;

const WORKGROUP: u32 = 256u;
var<workgroup> best_value: array<f32, WORKGROUP>;
var<workgroup> best_index: array<u32, WORKGROUP>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(local_invocation_index) lid: u32) {
    // Each thread scans its indices in increasing order, so `>` keeps its first maximum.
    var bv = values[min(lid, p.n - 1u)];
    var bi = min(lid, p.n - 1u);
    for (var i = lid + WORKGROUP; i < p.n; i += WORKGROUP) {
        let v = values[i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
    best_value[lid] = bv;
    best_index[lid] = bi;
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
    if (lid == 0u) {
        result[0] = best_index[0];
    }
}
