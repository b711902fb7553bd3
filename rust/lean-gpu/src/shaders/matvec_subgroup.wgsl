// The matvec's reduction with subgroup operations (needs wgpu::Features::SUBGROUP):
// subgroupAdd, then one barrier for thread 0 to sum the subgroups' sums in subgroup order. All
// threads of a workgroup work on the same rows, so this holds however the device forms
// subgroups (of any size, full or not).

var<workgroup> partial: array<vec4<f32>, 256>; // a subgroup has at least one invocation

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) subgroups: u32,
        @builtin(subgroup_invocation_id) sg_lane: u32) {
    let group = wid.x + wid.y * groups.x;
    // Whole groups past the part's rows (of a 2-D dispatch) leave together, before any barrier.
    if (group * ROWS_PER_THREAD >= p.rows) {
        return;
    }
    let sum = subgroupAdd(partial_dots(group, lid));
    // The subgroup's first active invocation writes its sum.
    if (sg_lane == subgroupBroadcastFirst(sg_lane)) {
        partial[sg] = sum;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var total = vec4<f32>(0.0);
        for (var i = 0u; i < subgroups; i++) {
            total += partial[i];
        }
        store_rows(group, total);
    }
}
