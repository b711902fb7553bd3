// y[first_row + r] = dot(row r of W, x) for the rows of one weight part. The tensor type is
// supplied by a block snippet prepended to this file (quant_<type>.wgsl), which defines
// BLOCK_LEN, BLOCK_BYTES, PARTS and part_dot(): each block is cut into PARTS pieces so that
// rows of few blocks still keep all threads busy. THREADS_PER_ROW threads share a row and sum
// their partial dots in workgroup memory (no subgroup operations needed).

struct Params {
    rows: u32,          // rows in this part
    cols: u32,          // elements per row (whole blocks)
    row_bytes: u32,
    weight_offset: u32, // byte offset of the part's first row in `w` (a multiple of 4)
    first_row: u32,     // index in y of the part's first row
    accumulate: u32,    // 1: y += W·x (a residual add fused in); 0: y = W·x
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WORKGROUP: u32 = 256u;
const THREADS_PER_ROW: u32 = 32u;
const ROWS_PER_GROUP: u32 = WORKGROUP / THREADS_PER_ROW;

var<workgroup> partial: array<f32, WORKGROUP>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // 2-D dispatch when the rows need more than max_compute_workgroups_per_dimension groups.
    let group = wid.x + wid.y * groups.x;
    let lane = lid % THREADS_PER_ROW;
    let row = group * ROWS_PER_GROUP + lid / THREADS_PER_ROW;
    var acc = 0.0;
    if (row < p.rows) {
        let row_byte = p.weight_offset + row * p.row_bytes;
        let items = (p.cols / BLOCK_LEN) * PARTS;
        for (var i = lane; i < items; i += THREADS_PER_ROW) {
            let block = i / PARTS;
            acc += part_dot(row_byte + block * BLOCK_BYTES, i % PARTS, block * BLOCK_LEN);
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = THREADS_PER_ROW / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < p.rows) {
        var sum = partial[lid];
        if (p.accumulate != 0u) {
            sum = y[p.first_row + row] + sum;
        }
        y[p.first_row + row] = sum;
    }
}
