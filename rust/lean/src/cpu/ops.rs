//! The element-wise and attention operations of the forward pass, written to follow HF
//! transformers' float32 arithmetic step by step (same operations in the same order per element),
//! so that only summation order and the last bit of `exp` can differ from the reference. (torch
//! itself computes `exp` on CPU with a vectorized approximation, not libm's `expf`.)
use crate::config::{Rope, RopeStyle};

/// HF LlamaRMSNorm: `w * (x * rsqrt(mean(x²) + eps))`, per row of `x`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let inv = inverse_rms(xr, eps);
        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = wv * (xv * inv);
        }
    }
}

/// `rms_norm` of every row of `x` in place (rows of `w.len()`: per-head q/k norms).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let inv = inverse_rms(row, eps);
        for (v, &wv) in row.iter_mut().zip(w) {
            *v = wv * (*v * inv);
        }
    }
}

/// 1 / sqrt(mean(x²) + eps), as HF's RMSNorm computes it in float32.
fn inverse_rms(row: &[f32], eps: f32) -> f32 {
    let sum_sq: f32 = sum_f32(row.iter().map(|v| v * v));
    1.0 / (sum_sq / row.len() as f32 + eps).sqrt()
}

/// Sums with 8 independent partial sums (vectorizes; closer to torch's blocked reduction than a
/// single running sum).
fn sum_f32(it: impl Iterator<Item = f32>) -> f32 {
    let mut acc = [0f32; 8];
    for (i, v) in it.enumerate() {
        acc[i % 8] += v;
    }
    acc.iter().sum()
}

/// Adds `b` to every row of `x`.
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bv) in row.iter_mut().zip(b) {
            *v += bv;
        }
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// SwiGLU: `silu(gate) * up`, silu(g) = g * sigmoid(g) as torch computes it.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let sigmoid = 1.0 / (1.0 + exp(-g));
        *o = (g * sigmoid) * u;
    }
}

/// GeGLU: `gelu_tanh(gate) * up`, as torch's `gelu(approximate="tanh")` computes it in
/// float32: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    // torch: M_SQRT2 * M_2_SQRTPI * 0.5 and 0.044715 as float.
    const BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
    const KAPPA: f32 = 0.044715;
    for ((o, &x), &u) in out.iter_mut().zip(gate).zip(up) {
        let cube = x * x * x;
        let inner = BETA * (x + KAPPA * cube);
        *o = (0.5 * x * (1.0 + inner.tanh())) * u;
    }
}

/// `e^x` in f32 within 2 ulp of the exact value (like torch's vectorized CPU `exp`), in plain
/// arithmetic that the compiler vectorizes (libm's `expf` is a call per element: the slowest
/// part of softmax and SwiGLU). Overflows to infinity above ~88.72; below ~-87.34 it returns
/// the smallest normal's neighbourhood instead of subnormals (the exact value is below 1e-37,
/// nothing next to the sums of 1 it meets in softmax and sigmoid).
#[inline]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HIGH is exact for |n| <= 128.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer (to nearest) without a rounding instruction.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_54, 88.722_84);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HIGH) - n * LN2_LOW;
    // Cephes' expf polynomial for e^r on |r| <= ln 2 / 2.
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    // 2^n as two powers of two built in the exponent field (n runs from -126 to 128, past
    // what one normal f32 covers); multiplying by them is exact until the result overflows.
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let power = |k: i32| f32::from_bits(((k + 127) << 23) as u32);
    let half = n_int >> 1;
    e_r * power(half) * power(n_int - half)
}

/// cos/sin per (position, frequency), computed as HF's rotary embedding does in float32:
/// inv_freq = 1 / base^(2i/d) (divided by the linear factor, then by the frequency's own factor
/// where the model has them: the llama3 scaling's bands are divisions by 1 and by a power of
/// two, exact, so only its smoothed band can differ from HF, by an ulp), angle = position ·
/// inv_freq.
pub struct RopeTable {
    pub half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    style: RopeStyle,
    rope_dim: usize,
}

impl RopeTable {
    pub fn new(rope: &Rope, positions: usize) -> Self {
        let half = rope.dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / rope.dim as f32;
                let f = 1.0 / rope.base.powf(exponent) / rope.linear_factor;
                match &rope.freq_factors {
                    Some(factors) => f / factors[i],
                    None => f,
                }
            })
            .collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in &inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        RopeTable {
            half,
            cos,
            sin,
            style: rope.style,
            rope_dim: rope.dim,
        }
    }

    /// The table as (cos, sin) pairs, [position][frequency]: what the GPU backend uploads, so
    /// both backends rotate with the same values.
    pub fn cos_sin_pairs(&self) -> Vec<[f32; 2]> {
        self.cos
            .iter()
            .zip(&self.sin)
            .map(|(&c, &s)| [c, s])
            .collect()
    }

    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates every head of one token's q or k (`x` = n_heads × head_dim) at position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let cos = &self.cos[pos * self.half..(pos + 1) * self.half];
        let sin = &self.sin[pos * self.half..(pos + 1) * self.half];
        for head in x.chunks_exact_mut(head_dim) {
            let head = &mut head[..self.rope_dim];
            for i in 0..self.half {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + self.half),
                };
                let (x0, x1) = (head[a], head[b]);
                // HF: q*cos + rotate_half(q)*sin, rotate_half = (-x1, x0)
                head[a] = x0 * cos[i] + (-x1) * sin[i];
                head[b] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}

/// In place: `softmax(x · scale)` (HF scales the scores, then softmax in float32). Lanes of
/// partial maxima and sums let every pass vectorize.
pub fn softmax_scaled(x: &mut [f32], scale: f32) {
    const LANES: usize = 8;
    let mut max = [f32::NEG_INFINITY; LANES];
    for chunk in x.chunks_mut(LANES) {
        for (v, m) in chunk.iter_mut().zip(&mut max) {
            *v *= scale;
            *m = if *v > *m { *v } else { *m };
        }
    }
    let max = max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = [0f32; LANES];
    for chunk in x.chunks_mut(LANES) {
        for (v, s) in chunk.iter_mut().zip(&mut sum) {
            *v = exp(*v - max);
            *s += *v;
        }
    }
    let sum: f32 = sum.iter().sum();
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, -1.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
        let inv = 1.0 / ((ms + 1e-5f64).sqrt());
        for i in 0..4 {
            let want = w[i] as f64 * x[i] as f64 * inv;
            assert!(
                (out[i] as f64 - want).abs() < 1e-6,
                "{i}: {} vs {want}",
                out[i]
            );
        }
    }

    /// Within 2 ulp of the exact exponential over the whole range softmax and SwiGLU use, with
    /// the edges: overflow to infinity, NaN through, and 1 at 0.
    #[test]
    fn exp_is_within_two_ulp() {
        let ulps = |got: f32, want: f64| {
            let want = want as f32;
            (got.to_bits() as i64 - want.to_bits() as i64).abs()
        };
        let mut worst = (0, 0.0f32);
        let steps = 2_000_000;
        for i in 0..=steps {
            let x = -87.0 + 175.5 * i as f32 / steps as f32;
            let err = ulps(exp(x), (x as f64).exp());
            if err > worst.0 {
                worst = (err, x);
            }
        }
        assert!(worst.0 <= 2, "exp({}) is {} ulp off", worst.1, worst.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), exp(-87.34));
        assert!(exp(-88.0) < 1.2e-38);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_follows_scores() {
        // scores 0 and ln(3)/2 scaled by 2: weights 1/4 and 3/4
        let mut x = [0.0f32, 3f32.ln() / 2.0];
        softmax_scaled(&mut x, 2.0);
        assert!(
            (x[0] - 0.25).abs() < 1e-6 && (x[1] - 0.75).abs() < 1e-6,
            "{x:?}"
        );
    }
}
