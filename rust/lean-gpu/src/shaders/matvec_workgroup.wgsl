// The matvec's reduction in core WGSL (no subgroups, e.g. Firefox's WebGPU): a tree over the
// workgroup's threads in workgroup memory, one barrier per halving.

var<workgroup> partial: array<vec4<f32>, 256>; // the largest WORKGROUP

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // 2-D dispatch when the rows need more than max_compute_workgroups_per_dimension groups.
    let group = wid.x + wid.y * groups.x;
    // Whole groups past the part's rows (of a 2-D dispatch) leave together, before any barrier.
    if (group * ROWS_PER_THREAD >= p.rows) {
        return;
    }
    partial[lid] = partial_dots(group, lid);
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
    }
    // Thread 0 wrote the final sum itself: no barrier needed before reading it.
    if (lid == 0u) {
        store_rows(group, partial[0]);
    }
}
