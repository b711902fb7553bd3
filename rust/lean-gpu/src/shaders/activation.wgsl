// The gated FFN activations, act(gate) · up, as torch computes them in float32 (assembled into
// the shaders that apply one: silu_mul, matvec, matmul, matmul_reduce):
// - SiLU (SwiGLU): silu(g) = g * (1 / (1 + exp(-g)));
// - GELU-tanh (GeGLU, gelu_pytorch_tanh):
//   0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x³))), in torch's order: x³ = (x * x) * x, then (0.5 * x) * (1 + tanh(inner)).

fn silu(g: f32) -> f32 {
    return g * (1.0 / (1.0 + exp(-g)));
}

// tanh(y) within ~2 ulp whatever the driver's tanh and exp (WGSL allows exp 3 + 2|x| ulp of
// error, and some drivers' tanh lose precision for large |y|): Cephes' tanhf, an odd
// polynomial below |y| = 0.625, else 1 - 2 / (e^(2|y|) + 1) with e^x from Cephes' expf
// polynomial scaled by an exact ldexp. From |y| = 9.5 on the result is ±1 (f32's tanh rounds
// to 1 from |y| ≈ 9.01).
fn tanh_f32(y: f32) -> f32 {
    let a = abs(y);
    if (a < 0.625) {
        let z = y * y;
        let p = (((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
            + 1.33314422036e-1) * z - 3.33332819422e-1;
        return p * z * y + y;
    }
    let x = 2.0 * min(a, 9.5);
    // e^x = 2^n e^r, r = x - n ln 2 with ln 2 split so that n * 0.693359375 is exact.
    let n = round(x * 1.44269504);
    let r = (x - n * 0.693359375) - n * -2.12194440e-4;
    let poly = ((((1.9875691e-4 * r + 1.3981999e-3) * r + 8.333452e-3) * r + 4.1665796e-2) * r
        + 1.6666665e-1) * r + 0.5;
    let e = ldexp(poly * (r * r) + r + 1.0, i32(n));
    let t = 1.0 - 2.0 / (e + 1.0);
    return select(t, -t, y < 0.0);
}

fn gelu_tanh(x: f32) -> f32 {
    // torch: kBeta = M_SQRT2 * M_2_SQRTPI * 0.5 and kKappa = 0.044715, as f32
    let inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x));
    return (0.5 * x) * (1.0 + tanh_f32(inner));
}

// act(gate) for activation `gelu` (false: SiLU).
fn activate(gelu: bool, g: f32) -> f32 {
    if (gelu) {
        return gelu_tanh(g);
    }
    return silu(g);
}

fn activate4(gelu: bool, g: vec4<f32>) -> vec4<f32> {
    if (gelu) {
        return vec4<f32>(gelu_tanh(g.x), gelu_tanh(g.y), gelu_tanh(g.z), gelu_tanh(g.w));
    }
    return g * (1.0 / (1.0 + exp(-g)));
}
