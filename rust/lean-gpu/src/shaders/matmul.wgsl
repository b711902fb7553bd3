// Prefill: y[t * out_stride + first_row + r] = dot(row r of W, row t of x) for n_tokens rows
// of x. A workgroup owns TILE_ROWS rows × TILE_TOKENS tokens (both, K_STEP and WARP_ROWS come
// from kernels/matmul.rs's header: MATMUL_TILE). Per step of K_STEP elements of K its threads
// decode the weight tile a whole slice (8 elements) at a time with slice_weights() of the
// prepended block snippet, and stage the activations, both in workgroup memory laid out [k][row] and
// [k][token] (loaded a step ahead into registers, stored after the step's FMAs); then each
// thread accumulates 8 rows × 4 tokens from vec4 loads (two of weights, one of activations per
// 32 FMAs). Every weight is decoded once per TILE_TOKENS tokens; f32 products and sums.
// When the tiles alone are too few workgroups to fill the device, K is split into ranges, each
// range's workgroups write their partial sums to their own slab of y (kernels/matmul.rs binds
// scratch there), and matmul_reduce.wgsl adds the slabs up in order (and applies BIAS or
// SWIGLU, which kernels/matmul.rs sets only on unsplit dispatches).

struct Params {
    part: Layout,       // where the weight part's arrays lie
    rows: u32,          // rows in this part
    cols: u32,
    first_row: u32,     // column of y of the part's first row
    n_tokens: u32,
    out_stride: u32,    // rows of the whole matrix (y is n_tokens × out_stride)
    row_tiles: u32,     // ceil(rows / TILE_ROWS)
    token_tiles: u32,   // ceil(n_tokens / TILE_TOKENS)
    accumulate: u32,    // 1: y += x·Wᵀ (a residual add fused in); 0: y = x·Wᵀ
    splits: u32,        // K split into this many ranges (1: not split)
    split_len: u32,     // elements of K per range, a multiple of 32
    split_stride: u32,  // y elements between the outputs of consecutive ranges
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
// The same words in 16-byte loads (row-quad snippets).
@group(0) @binding(1) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Read only by the block snippets' slice_x (for matvec): not bound here.
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;
// Read with BIAS: y's column c gets bias[c] (x is bound here without).
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// Fusions, pipeline constants (a branch on a uniform would cost registers in the inner loop):
// BIAS: y = x·Wᵀ + bias (the q|k|v projection's bias).
override BIAS: bool = false;
// SWIGLU: the rows are [gate_0, up_0, gate_1, up_1, ...] (a stacked gate|up matrix with its rows
// interleaved, stack.rs) from an even first row; y's column (first_row + r) / 2 of token t gets
// act(gate) · up of rows r and r + 1, so y's rows are half as wide as the matrix.
override SWIGLU: bool = false;
// SWIGLU's activation (activation.wgsl): GELU-tanh; SiLU without.
override GELU: bool = false;

// Threads: each owns 8 rows (two quads, half a tile apart) and 4 tokens. (8 × 8 per thread,
// fewer threads, was slower on an H200.)
const ROW_THREADS: u32 = TILE_ROWS / 8u;
const TOKEN_THREADS: u32 = TILE_TOKENS / 4u;
const WORKGROUP: u32 = ROW_THREADS * TOKEN_THREADS;
const ROW_QUADS: u32 = TILE_ROWS / 4u;
// Each k's row of x_tile is padded by a quad: the staging stores of neighbouring k then fall
// in different banks.
const TOKEN_QUADS: u32 = TILE_TOKENS / 4u + 1u;
const STEP_SLICES: u32 = K_STEP / 8u;

var<workgroup> w_tile: array<vec4<f32>, K_STEP * ROW_QUADS>;   // [k][rows / 4]
var<workgroup> x_tile: array<vec4<f32>, K_STEP * TOKEN_QUADS>; // [k][tokens / 4]

// Slices of the weight tile and activations of the x tile each thread stages per step.
const WEIGHT_ITERS: u32 = TILE_ROWS * STEP_SLICES / WORKGROUP;
const X_ITERS: u32 = TILE_TOKENS * K_STEP / WORKGROUP;

struct Staged {
    w: array<array<vec4<f32>, 2>, WEIGHT_ITERS>,
    x: array<f32, X_ITERS>,
}

// Loads (and decodes) this thread's share of the step at k0: slice s0 + i / TILE_ROWS of tile
// row i % TILE_ROWS for i = lid + j × WORKGROUP (neighbouring threads take neighbouring rows,
// so their stores hit different banks; rows past the part's end repeat its last row, their
// outputs never stored), and x[tok0 + t][k0 + k] for i = t × K_STEP + k, zero past n_tokens
// and cols (F32 rows may end inside a step; their padding weights are zero, but x there is
// another token's).
fn load_step(lid: u32, row0: u32, tok0: u32, k0: u32) -> Staged {
    var st: Staged;
    let s0 = k0 / 8u;
    for (var j = 0u; j < WEIGHT_ITERS; j++) {
        let i = lid + j * WORKGROUP;
        st.w[j] = slice_weights(min(row0 + i % TILE_ROWS, p.rows - 1u), s0 + i / TILE_ROWS);
    }
    for (var j = 0u; j < X_ITERS; j++) {
        let i = lid + j * WORKGROUP;
        let k = i % K_STEP;
        let t = i / K_STEP;
        var v = 0.0;
        if (tok0 + t < p.n_tokens && k0 + k < p.cols) {
            v = x[(tok0 + t) * p.cols + k0 + k];
        }
        st.x[j] = v;
    }
    return st;
}

// Stores a step's share into the tiles: weights [k][row], activations [k][token].
fn store_step(lid: u32, st: Staged) {
    for (var j = 0u; j < WEIGHT_ITERS; j++) {
        let i = lid + j * WORKGROUP;
        let r = i % TILE_ROWS;
        let at = 8u * (i / TILE_ROWS) * ROW_QUADS + r / 4u;
        let c = r % 4u;
        let v = st.w[j];
        w_tile[at][c] = v[0].x;
        w_tile[at + ROW_QUADS][c] = v[0].y;
        w_tile[at + 2u * ROW_QUADS][c] = v[0].z;
        w_tile[at + 3u * ROW_QUADS][c] = v[0].w;
        w_tile[at + 4u * ROW_QUADS][c] = v[1].x;
        w_tile[at + 5u * ROW_QUADS][c] = v[1].y;
        w_tile[at + 6u * ROW_QUADS][c] = v[1].z;
        w_tile[at + 7u * ROW_QUADS][c] = v[1].w;
    }
    for (var j = 0u; j < X_ITERS; j++) {
        let i = lid + j * WORKGROUP;
        let k = i % K_STEP;
        let t = i / K_STEP;
        x_tile[k * TOKEN_QUADS + t / 4u][t % 4u] = st.x[j];
    }
}

// Writes a row's 4 tokens (those below n_tokens) to the slab of y at `out`.
fn store_row(out: u32, row: u32, t0: u32, v: vec4<f32>) {
    if (row >= p.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + j;
        if (t < p.n_tokens) {
            let at = out + t * p.out_stride + p.first_row + row;
            var sum = v[j];
            if (BIAS) {
                sum = sum + bias[p.first_row + row];
            }
            if (p.accumulate != 0u) {
                sum = y[at] + sum;
            }
            y[at] = sum;
        }
    }
}

// SWIGLU: writes act(gate) · up for the 4 tokens of the pair at rows `row` (gate) and
// `row + 1` (up), row even.
fn store_pair(row: u32, t0: u32, gate: vec4<f32>, up: vec4<f32>) {
    if (row >= p.rows) {
        return;
    }
    // act(g) · up as torch (and silu_mul.wgsl) computes it.
    let act = activate4(GELU, gate) * up;
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + j;
        if (t < p.n_tokens) {
            y[t * p.out_stride + (p.first_row + row) / 2u] = act[j];
        }
    }
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.x + wid.y * groups.x;
    let row0 = (group % p.row_tiles) * TILE_ROWS;
    let tok0 = ((group / p.row_tiles) % p.token_tiles) * TILE_TOKENS;
    let split = group / p.row_tiles / p.token_tiles;
    // Whole groups past the last tile leave together, before any barrier.
    if (split >= p.splits) {
        return;
    }
    let k_begin = split * p.split_len;
    let k_end = min(p.cols, k_begin + p.split_len);
    // A warp of 32 threads takes WARP_ROWS row quads × 32 / WARP_ROWS token quads
    // (kernels/matmul.rs: MatmulTile): few weight addresses per load of w_tile, which the warp broadcasts.
    let lane = lid % 32u;
    let warp = lid / 32u;
    let warps_across = ROW_THREADS / WARP_ROWS;
    let rq = lane % WARP_ROWS + WARP_ROWS * (warp % warps_across);
    let tq = lane / WARP_ROWS + (32u / WARP_ROWS) * (warp / warps_across);
    // Accumulators of rows 4 rq ..+ 4 (a) and TILE_ROWS / 2 + 4 rq ..+ 4 (b), each over
    // tokens 4 tq ..+ 4; named, not an array, so that they stay in registers.
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var b0 = vec4<f32>(0.0);
    var b1 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var b3 = vec4<f32>(0.0);
    store_step(lid, load_step(lid, row0, tok0, k_begin));
    workgroupBarrier();
    for (var k0 = k_begin; k0 < k_end; k0 += K_STEP) {
        // The next step's loads go out before this step's FMAs and land in registers (the
        // last step reloads itself: no branch around them). On an H200 this made prefill
        // 4-8% faster; two tile buffers instead (one barrier a step, 24.5 KiB) were 18% slower.
        let next = select(k0, k0 + K_STEP, k0 + K_STEP < k_end);
        let staged = load_step(lid, row0, tok0, next);
        for (var k = 0u; k < K_STEP; k++) {
            let xv = x_tile[k * TOKEN_QUADS + tq];
            let wa = w_tile[k * ROW_QUADS + rq];
            let wb = w_tile[k * ROW_QUADS + ROW_THREADS + rq];
            a0 = fma(vec4<f32>(wa.x), xv, a0);
            a1 = fma(vec4<f32>(wa.y), xv, a1);
            a2 = fma(vec4<f32>(wa.z), xv, a2);
            a3 = fma(vec4<f32>(wa.w), xv, a3);
            b0 = fma(vec4<f32>(wb.x), xv, b0);
            b1 = fma(vec4<f32>(wb.y), xv, b1);
            b2 = fma(vec4<f32>(wb.z), xv, b2);
            b3 = fma(vec4<f32>(wb.w), xv, b3);
        }
        // Every thread's reads of the tiles done before they are overwritten.
        workgroupBarrier();
        store_step(lid, staged);
        workgroupBarrier();
    }
    let ra = row0 + 4u * rq;
    let rb = ra + TILE_ROWS / 2u;
    let t0 = tok0 + 4u * tq;
    if (SWIGLU) {
        // A quad's rows start even: two (gate, up) pairs.
        store_pair(ra, t0, a0, a1);
        store_pair(ra + 2u, t0, a2, a3);
        store_pair(rb, t0, b0, b1);
        store_pair(rb + 2u, t0, b2, b3);
        return;
    }
    let out = split * p.split_stride;
    store_row(out, ra, t0, a0);
    store_row(out, ra + 1u, t0, a1);
    store_row(out, ra + 2u, t0, a2);
    store_row(out, ra + 3u, t0, a3);
    store_row(out, rb, t0, b0);
    store_row(out, rb + 1u, t0, b1);
    store_row(out, rb + 2u, t0, b2);
    store_row(out, rb + 3u, t0, b3);
}

