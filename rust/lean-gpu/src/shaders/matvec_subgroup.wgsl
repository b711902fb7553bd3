// The matvec's reduction with subgroup operations (needs wgpu::Features::SUBGROUP):
// subgroupAdd, then one barrier for thread 0 to sum the subgroups' sums in subgroup order. All
// threads of a workgroup work on the same rows, so this holds however the device forms
// subgroups (of any size, full or not).

// A subgroup has at least 4 invocations (wgpu's and WebGPU's minimum): SUBGROUP_SLOTS holds
// the subgroups of the largest WORKGROUP (kernels/matvec.rs checks).
var<workgroup> partial: array<Partial, SUBGROUP_SLOTS>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) subgroups: u32,
        @builtin(subgroup_invocation_id) sg_lane: u32) {
    // Workgroup g computes rows of group g / tokens for token g % tokens (tokens_and_rows).
    let at = token_and_rows(wid.x + wid.y * groups.x);
    let group = at.y;
    // Whole groups past the part's rows (of a 2-D dispatch) leave together, before any barrier.
    if (group * ROWS_PER_THREAD >= p.rows) {
        return;
    }
    var sums = partial_dots(group, lid);
    for (var k = 0u; k < QUADS; k++) {
        sums.dots[k] = subgroupAdd(sums.dots[k]);
    }
    if (NORM) {
        sums.squares = subgroupAdd(sums.squares);
    }
    // The subgroup's first active invocation writes its sums.
    if (sg_lane == subgroupBroadcastFirst(sg_lane)) {
        partial[sg] = sums;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var total = partial[0];
        for (var i = 1u; i < subgroups; i++) {
            for (var k = 0u; k < QUADS; k++) {
                total.dots[k] += partial[i].dots[k];
            }
            total.squares += partial[i].squares;
        }
        store_rows(group, at.x, total);
    }
}
