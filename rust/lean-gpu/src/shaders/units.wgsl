// Shared by every block snippet: the layout of a weight part (weights.rs writes it) and helpers.
// A slice is 8 consecutive elements of a row, a unit 32 (4 slices). A matvec thread dots one
// slice's activations (slice_x) with 4 rows (quad_dot); neighbouring threads take
// neighbouring slices, so a subgroup's loads of x and of the weights are contiguous.
// Every skeleton declares the bindings the snippets read: w and w4 (weights as words and as
// 16-byte words; an entry point reads one of them), x and x4 (activations as f32 and vec4), and the params p.part (this Layout)
// and p.cols.

struct Layout {
    units: u32,     // units per row
    row_bytes: u32, // bytes per row of a type kept as in the GGUF file
    region1: u32,   // word offsets of a repacked type's arrays after the first
    region2: u32,
    region3: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const NIBBLES: u32 = 0x0F0F0F0Fu;

// Where the activations of the token being dotted start in x, in f32 (a multiple of 4): the
// matvec of several tokens sets it per token (matvec.wgsl: token_and_rows); 0 for one token.
var<private> x_first: u32;

// x[8s .. 8s + 8] of the token's activations as two 16-byte loads (rows of whole units: the
// buffer holds them all).
fn x_slice_vec4(s: u32) -> array<vec4<f32>, 2> {
    let base = x_first / 4u;
    return array<vec4<f32>, 2>(x4[base + 2u * s], x4[base + 2u * s + 1u]);
}

// The bytes of v as the f32 values 2^23 + byte, exactly: the byte becomes the low mantissa bits
// of 2^23 (no int-to-float conversion, which GPUs issue at a fraction of the FMA rate).
fn magic_bytes(v: u32) -> vec4<f32> {
    let b = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4B000000u));
}

// A slice's 8 quants as exact floats (two vec4: elements 0..4, 4..8) and the factor its
// weights share: weight = scale * q. The types with such a factor decode a slice once, in
// slice_quants, for both slice_dot (scale times the quants' dot) and slice_weights.
struct Slice {
    scale: f32,
    q: array<vec4<f32>, 2>,
}

// scale * (q · xs), the quants' dot taken first.
fn scaled_dot(sl: Slice, xs: array<vec4<f32>, 2>) -> f32 {
    return sl.scale * dot_acc(dot_acc(0.0, sl.q[0], xs[0]), sl.q[1], xs[1]);
}

// The 8 weights scale * q.
fn scaled_weights(sl: Slice) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(sl.scale * sl.q[0], sl.scale * sl.q[1]);
}

// acc + dot(a, b), as four chained fused multiply-adds.
fn dot_acc(acc: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// The f16 with index h in the array of f16 that starts at word `region` of w, widened exactly.
fn f16_at(region: u32, h: u32) -> f32 {
    let word = w[region + h / 2u] >> ((h & 1u) * 16u);
    return unpack2x16float(word & 0xFFFFu).x;
}

// Index of item i of part row `row` (per_row items a row) in a plane interleaved by row quads
// (weights.rs: quad_at): the items i of a quad's 4 rows lie side by side.
fn quad_at(row: u32, i: u32, per_row: u32) -> u32 {
    return ((row / 4u) * per_row + i) * 4u + row % 4u;
}

// The f16 of item i (per_row items a row) of the 4 rows of the quad of `row0`, from a plane of
// them at word `region` (a multiple of 4) interleaved by row quads: two words, half of a
// 16-byte load (w4 only: naga rejects an entry point that reads both views of the binding; a
// part's bytes are padded to 16, so the load stays inside).
fn quad_f16(region: u32, row0: u32, i: u32, per_row: u32) -> vec4<f32> {
    let at = region + quad_at(row0, i, per_row) / 2u;
    let v = w4[at / 4u];
    let pair = select(v.xy, v.zw, (at & 2u) != 0u);
    return vec4<f32>(unpack2x16float(pair.x), unpack2x16float(pair.y));
}

// Slices per row.
fn row_slices() -> u32 {
    return 4u * p.part.units;
}
