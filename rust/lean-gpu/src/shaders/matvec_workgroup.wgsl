// The matvec's reduction in core WGSL (no subgroups, e.g. Firefox's WebGPU): a tree over the
// workgroup's threads in workgroup memory, one barrier per halving.

// Sized for the largest WORKGROUP of this reduction (TREE_SLOTS, kernels/matvec.rs).
var<workgroup> tree_dots: array<array<vec4<f32>, QUADS>, TREE_SLOTS>;
var<workgroup> tree_squares: array<f32, TREE_SLOTS>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // 2-D dispatch when the rows need more than max_compute_workgroups_per_dimension groups.
    // Workgroup g computes rows of group g / tokens for token g % tokens (tokens_and_rows).
    let at = token_and_rows(wid.x + wid.y * groups.x);
    let group = at.y;
    // Whole groups past the part's rows (of a 2-D dispatch) leave together, before any barrier.
    if (group * ROWS_PER_THREAD >= p.rows) {
        return;
    }
    let sums = partial_dots(group, lid);
    tree_dots[lid] = sums.dots;
    tree_squares[lid] = sums.squares;
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            for (var k = 0u; k < QUADS; k++) {
                tree_dots[lid][k] += tree_dots[lid + s][k];
            }
            tree_squares[lid] += tree_squares[lid + s];
        }
    }
    // Thread 0 wrote the final sums itself: no barrier needed before reading them.
    if (lid == 0u) {
        store_rows(group, at.x, Partial(tree_dots[0], tree_squares[0]));
    }
}
