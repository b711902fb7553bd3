// Embedding lookup: out[t] = row ids[t] of the embedding matrix, dequantized with the
// prepended block snippet's weight_at(), times p.scale in f32. A matrix split across bindings
// runs one dispatch per part; each writes the tokens whose row falls in its part. One thread
// per output element.

struct Params {
    part: Layout, // where the weight part's arrays lie
    n_tokens: u32,
    cols: u32,
    first_row: u32, // rows first_row .. first_row + rows live in this part
    rows: u32,
    scale: f32, // the value times this (Gemma 3: sqrt(hidden)); 1: as stored
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
// The same words in 16-byte loads (row-quad snippets).
@group(0) @binding(1) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// Read only by the block snippets' slice_x (for matvec): not bound here.
@group(0) @binding(4) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> x4: array<vec4<f32>>;

// WORKGROUP (threads per workgroup) comes from kernels/embed.rs: ELEMENTWISE_GROUP.

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WORKGROUP + lid;
    if (i >= p.n_tokens * p.cols) {
        return;
    }
    let t = i / p.cols;
    let e = i % p.cols;
    let id = ids[t];
    if (id < p.first_row || id >= p.first_row + p.rows) {
        return;
    }
    var v = weight_at(id - p.first_row, e);
    if (p.scale != 1.0) {
        v = v * p.scale;
    }
    out[i] = v;
}
