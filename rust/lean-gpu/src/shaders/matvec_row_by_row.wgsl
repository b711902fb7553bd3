// matvec.wgsl's quad_dot for the types whose rows are stored one after another (not in row
// quads): the block snippet's slice_dot for each row. A row past the part's end repeats its
// last row (store_rows skips it): no branches.
fn quad_dot(row0: u32, s: u32, xs: array<vec4<f32>, 2>) -> vec4<f32> {
    let r = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.rows - 1u));
    return vec4<f32>(slice_dot(r.x, s, xs), slice_dot(r.y, s, xs), slice_dot(r.z, s, xs),
                     slice_dot(r.w, s, xs));
}
