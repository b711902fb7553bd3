// HF LlamaRMSNorm per row: out = w * (x * (1 / sqrt(mean(x²) + eps))). One workgroup per row.
// With ADD the norm is added into out instead (Gemma 3's post-attention and post-FFN norms:
// residual + norm(y)).
// Decode runs this on one short row between dependent matvecs, so it is built for latency: a
// thread issues all its loads at once (a fixed-count loop the compiler unrolls, HELD elements
// kept in registers for the second pass) instead of one load per loop trip.

struct Params {
    n: u32,      // elements per row
    n_rows: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WORKGROUP: u32 = 256u;
// Elements a thread keeps in registers: rows of up to 4096 elements are read once.
const HELD: u32 = 16u;
// out += the norm (a pipeline constant).
override ADD: bool = false;

// Writes out[at] = v, or out[at] += v with ADD.
fn store(at: u32, v: f32) {
    if (ADD) {
        out[at] = out[at] + v;
    } else {
        out[at] = v;
    }
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * groups.x;
    // Uniform per workgroup: the whole group leaves together, before any barrier.
    if (row >= p.n_rows) {
        return;
    }
    let base = row * p.n;
    var held: array<f32, HELD>;
    var acc = 0.0;
    for (var k = 0u; k < HELD; k++) {
        let i = lid + k * WORKGROUP;
        if (i < p.n) {
            held[k] = x[base + i];
            acc = fma(held[k], held[k], acc);
        }
    }
    // Longer rows: the rest is read twice.
    for (var i = lid + HELD * WORKGROUP; i < p.n; i += WORKGROUP) {
        let v = x[base + i];
        acc = fma(v, v, acc);
    }
    let inv = inverse_rms(lid, acc, p.n, p.eps);
    for (var k = 0u; k < HELD; k++) {
        let i = lid + k * WORKGROUP;
        if (i < p.n) {
            store(base + i, weight[i] * (held[k] * inv));
        }
    }
    for (var i = lid + HELD * WORKGROUP; i < p.n; i += WORKGROUP) {
        store(base + i, weight[i] * (x[base + i] * inv));
    }
}
