// Prefill: y[t * out_stride + first_row + r] = dot(row r of W, row t of x) for n_tokens rows
// of x. Tiled: a workgroup owns TILE rows × TILE tokens; per K step of KC elements it
// dequantizes the weight tile once into workgroup memory (weight_at() of the prepended block
// snippet) and stages the activations, then each thread accumulates 2 × 2 outputs, so every
// weight is decoded once per TILE tokens instead of once per token.

struct Params {
    part: Layout, // where the weight part's arrays lie
    rows: u32,          // rows in this part
    cols: u32,
    first_row: u32,     // column of y of the part's first row
    n_tokens: u32,
    out_stride: u32,    // rows of the whole matrix (y is n_tokens × out_stride)
    row_tiles: u32,     // ceil(rows / TILE)
    accumulate: u32,    // 1: y += x·Wᵀ (a residual add fused in); 0: y = x·Wᵀ
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Read only by the block snippets' slice_x (for matvec): not bound here.
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;

const TILE: u32 = 32u;
const KC: u32 = 32u;
const WORKGROUP: u32 = 256u;

var<workgroup> w_tile: array<f32, TILE * KC>; // [row][k]
var<workgroup> x_tile: array<f32, TILE * KC>; // [token][k]

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    let row0 = (group % p.row_tiles) * TILE;
    let tok0 = (group / p.row_tiles) * TILE;
    // Whole groups past the last tile leave together, before any barrier.
    if (tok0 >= p.n_tokens) {
        return;
    }
    let tr = (lid / 16u) * 2u; // this thread's rows tr, tr + 1 and tokens tt, tt + 1 in the tile
    let tt = (lid % 16u) * 2u;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var k0 = 0u; k0 < p.cols; k0 += KC) {
        for (var i = lid; i < TILE * KC; i += WORKGROUP) {
            let r = i / KC;
            let k = k0 + i % KC;
            var wv = 0.0;
            if (row0 + r < p.rows && k < p.cols) {
                wv = weight_at(row0 + r, k);
            }
            w_tile[i] = wv;
            var xv = 0.0;
            if (tok0 + r < p.n_tokens && k < p.cols) {
                xv = x[(tok0 + r) * p.cols + k];
            }
            x_tile[i] = xv;
        }
        workgroupBarrier();
        for (var k = 0u; k < KC; k++) {
            let w0 = w_tile[tr * KC + k];
            let w1 = w_tile[(tr + 1u) * KC + k];
            let x0 = x_tile[tt * KC + k];
            let x1 = x_tile[(tt + 1u) * KC + k];
            acc[0] += w0 * x0;
            acc[1] += w0 * x1;
            acc[2] += w1 * x0;
            acc[3] += w1 * x1;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + tr + i / 2u;
        let t = tok0 + tt + i % 2u;
        if (r < p.rows && t < p.n_tokens) {
            let at = t * p.out_stride + p.first_row + r;
            var sum = acc[i];
            if (p.accumulate != 0u) {
                sum = y[at] + sum;
            }
            y[at] = sum;
        }
    }
}
