// The RMS norm's scale, shared by rms_norm.wgsl and head_rms_norm.wgsl (each declares
// WORKGROUP): the workgroup's sum of every thread's sum of squares `acc`, then
// 1 / sqrt(sum / n + eps). inverseSqrt() is allowed 2 ulp of error; a true division keeps HF's
// rounding. Call it in uniform control flow (it has barriers).
var<workgroup> partial: array<f32, WORKGROUP>;

fn inverse_rms(lid: u32, acc: f32, n: u32, eps: f32) -> f32 {
    partial[lid] = acc;
    for (var s = WORKGROUP / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
    }
    workgroupBarrier();
    return 1.0 / sqrt(partial[0] / f32(n) + eps);
}
