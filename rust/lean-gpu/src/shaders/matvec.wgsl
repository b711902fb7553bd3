// y[first_row + r] = dot(row r of W, x) for the rows of one weight part. The tensor type comes
// from a block snippet prepended to this file (quant_<type>.wgsl): slice_x() loads the
// activations of one 8-element slice, quad_dot() dots them with that slice of 4 rows (the
// row-quad types' snippets define it, matvec_row_by_row.wgsl does for the others).
//
// A workgroup owns ROWS_PER_THREAD rows; its threads take consecutive slices (so a subgroup's
// loads are contiguous), each thread dotting a slice's activations with all the rows: x (and
// a fused norm's weights or up) is read once per 4 rows. On an H200 those activation loads,
// not the weights, bounded the kernel (with x replaced by constants a Q4_0 11008 x 2048
// matvec took 6.3 instead of 11.6 µs): 4 rows a thread made decode 7% faster than 2, 8 rows
// 8% slower than 2 (fewer threads in flight). A reduction entry point appended to this file
// (matvec_subgroup.wgsl or matvec_workgroup.wgsl) sums the threads' partials and calls
// store_rows(). WORKGROUP is set per pipeline (kernels/matvec.rs picks 64 to 512 threads from the
// row length and the row count).
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
//   rows interleaved at upload, stack.rs) and each (gate, up) pair of a workgroup's rows
//   writes y[pair] = silu(gate) * up, as silu_mul.wgsl computes it: the FFN's activation
//   straight out of the matvec, no [gate | up] row in between.
// - GELU: SILU's and SWIGLU's activation is GELU-tanh instead of SiLU (activation.wgsl, Gemma 3).
// - `bias` and `accumulate`: y = (W·x + bias) or y += W·x, as separate adds would round.
//
// Several tokens (TOKENS, p.tokens > 1, the verification pass of speculative decoding): x, up
// and y hold a row per token (x_stride and y_stride f32 apart) and each workgroup computes its rows
// for one token exactly as a one-token matvec does (every token gets the bits its own matvec
// would give). The tokens of a row group are neighbouring workgroups, so its weights come from
// memory once and from the cache for the other tokens; the tokens spread over the device
// instead of queueing in one workgroup (a thread looping over 9 tokens, each reduced in turn,
// made a 3072 x 576 matvec 5.5x slower than one token on an H100).

struct Params {
    part: Layout,   // where the weight part's arrays lie
    rows: u32,      // rows in this part
    cols: u32,      // elements per row
    first_row: u32, // index in y of the part's first row
    accumulate: u32, // 1: y += W·x (a residual add fused in); 0: y = W·x
    bias: u32,       // 1: plus bias[row] (before an accumulate)
    eps: f32,        // of the norm (NORM)
    up_offset: u32,  // vec4s: where up starts in its binding (SILU)
    x_stride: u32,   // f32 from one token's row of x (and of up) to the next's (tokens > 1)
    y_stride: u32,   // f32 from one token's row of y to the next's (tokens > 1)
    tokens: u32,     // tokens of the dispatch, at least 1
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
// The same words in 16-byte loads (row-quad snippets).
@group(0) @binding(1) var<storage, read> w4: array<vec4<u32>>;
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
// The activations are act(x) * up (x: the gate).
override SILU: bool = false;
// The rows are (gate, up) pairs: y[pair] = act(gate) * up.
override SWIGLU: bool = false;
// act of SILU and SWIGLU (activation.wgsl): GELU-tanh; SiLU without.
override GELU: bool = false;
// Several tokens a dispatch (p.tokens, a verification pass); one without. The arithmetic is
// the same either way: only where x, up and y of the token start.
override TOKENS: bool = false;
// ROWS_PER_THREAD, rows a thread dots its slices with, and the reductions' array sizes
// TREE_SLOTS and SUBGROUP_SLOTS come from kernels/matvec.rs's header; in quads:
const QUADS: u32 = ROWS_PER_THREAD / 4u;

// A thread's (or a reduction's) sums: the dots with the workgroup's rows, and x² (NORM).
struct Partial {
    dots: array<vec4<f32>, QUADS>,
    squares: f32,
}

// Where up's activations of the token being dotted start, in vec4s (token_and_rows).
var<private> up_first: u32;

// (token, row group) of workgroup g, and points x_slice_vec4 (units.wgsl), the F32 snippet
// and add_slice at that token's rows.
fn token_and_rows(g: u32) -> vec2<u32> {
    if (!TOKENS) {
        // One token: offsets the compiler folds into the loads' addresses (with p.tokens read
        // at run time every one-token matvec paid for it: decode 4-5% slower on an H100).
        x_first = 0u;
        up_first = p.up_offset;
        return vec2<u32>(0u, g);
    }
    let c = g % p.tokens;
    x_first = c * p.x_stride;
    up_first = p.up_offset + c * (p.x_stride / 4u);
    return vec2<u32>(c, g / p.tokens);
}

// acc plus slice s's dots with the rows from `first` and its x², of the activations, which are
// x, norm_weight * x (norm; x² of x itself) or act(x) * up (silu).
fn add_slice(acc: Partial, first: u32, s: u32) -> Partial {
    var xs = slice_x(s);
    var squares = 0.0;
    if (NORM) {
        squares = dot_acc(dot_acc(0.0, xs[0], xs[0]), xs[1], xs[1]);
        xs[0] = norm_weight[2u * s] * xs[0];
        xs[1] = norm_weight[2u * s + 1u] * xs[1];
    }
    if (SILU) {
        xs[0] = activate4(GELU, xs[0]) * up[up_first + 2u * s];
        xs[1] = activate4(GELU, xs[1]) * up[up_first + 2u * s + 1u];
    }
    var sums = acc;
    for (var k = 0u; k < QUADS; k++) {
        sums.dots[k] += quad_dot(first + 4u * k, s, xs);
    }
    sums.squares += squares;
    return sums;
}

// The partials of thread `lid` with the workgroup's rows: slices lid, lid + WORKGROUP, ...
// added in that order.
fn partial_dots(group: u32, lid: u32) -> Partial {
    let first = group * ROWS_PER_THREAD;
    let n = row_slices();
    var acc: Partial; // zeros
    var s = lid;
    // Two slices a trip, so that a thread has the loads of both in flight at once.
    for (; s + WORKGROUP < n; s += 2u * WORKGROUP) {
        acc = add_slice(add_slice(acc, first, s), first, s + WORKGROUP);
    }
    if (s < n) {
        acc = add_slice(acc, first, s);
    }
    return acc;
}

// Writes token c's dots of the workgroup `group` with its rows (the sums of its threads'
// partials).
fn store_rows(group: u32, c: u32, sums: Partial) {
    var y_first = 0u;
    if (TOKENS) {
        y_first = c * p.y_stride;
    }
    var scale = 1.0;
    if (NORM) {
        // inverseSqrt() is allowed 2 ulp of error; a true division keeps HF's rounding.
        scale = 1.0 / sqrt(sums.squares / f32(p.cols) + p.eps);
    }
    if (SWIGLU) {
        // The part's rows are whole pairs from an even first_row (kernels/matvec.rs checks).
        for (var k = 0u; k < ROWS_PER_THREAD / 2u; k++) {
            if (group * ROWS_PER_THREAD + 2u * k < p.rows) {
                var g = sums.dots[k / 2u][2u * (k % 2u)];
                var u = sums.dots[k / 2u][2u * (k % 2u) + 1u];
                if (NORM) {
                    g = g * scale;
                    u = u * scale;
                }
                let pair = p.first_row / 2u + group * (ROWS_PER_THREAD / 2u) + k;
                y[y_first + pair] = activate(GELU, g) * u;
            }
        }
        return;
    }
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let r = group * ROWS_PER_THREAD + i;
        if (r < p.rows) {
            var v = sums.dots[i / 4u][i % 4u];
            if (NORM) {
                v = v * scale;
            }
            if (p.bias != 0u) {
                v = v + bias[p.first_row + r];
            }
            if (p.accumulate != 0u) {
                v = y[y_first + p.first_row + r] + v;
            }
            y[y_first + p.first_row + r] = v;
        }
    }
}
