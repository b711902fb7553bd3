//! Choosing the next token, with transformers' names and semantics: logits processors
//! (repetition penalty, then the warpers temperature → top-k → top-p → min-p, in the order
//! `GenerationMixin._get_logits_processor` applies them), then greedy argmax or a draw from the
//! softmax with a seeded, deterministic RNG.
use crate::error::{LeanError, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy decoding (argmax); the warpers are then not applied.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches top_p; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens below min_p × the top token's probability; 0 disables.
    pub min_p: f32,
    /// CTRL-style penalty on every token already in the sequence (prompt included); 1.0 disables.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(LeanError::InvalidArgument(m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!(
                "temperature must be a finite number ≥ 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// SplitMix64: small, fast, and the same sequence on every platform (wasm included).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Candidate (token, logit) pairs, reused between steps.
    candidates: Vec<(u32, f32)>,
}

/// RepetitionPenaltyLogitsProcessor: a seen token's logit is divided by the penalty when
/// positive, multiplied when negative.
pub fn apply_repetition_penalty(logits: &mut [f32], seen: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut done = std::collections::HashSet::new();
    for &t in seen {
        if let Some(l) = logits.get_mut(t as usize) {
            if done.insert(t) {
                *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
            }
        }
    }
}

/// Constrained decoding: every token whose bit is clear in `mask` (bit `i % 32` of word `i / 32`
/// for token `i`) gets a logit of -inf, so that no sampler can pick it and greedy is the argmax
/// over the allowed tokens. Tokens past the mask's end are disallowed.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = mask.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits >> b & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Index of the largest logit; the first one on ties (as torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding under a constraint: the index of the largest logit among the tokens `mask`
/// allows (bit `i % 32` of word `i / 32` for token `i`; tokens past the mask's end are
/// disallowed, as in `apply_mask`), the first one on ties (as `argmax`). A NaN logit counts as
/// -inf and -0.0 equals 0.0; an allowed token whose logit is -inf is still chosen when no allowed
/// one is larger. `None` when no token is allowed. Wherever an allowed logit is a number above
/// -inf this is `argmax` after `apply_mask`; it is also the GPU's masked argmax
/// (lean-gpu's argmax_masked.wgsl), bit for bit.
pub fn argmax_masked(logits: &[f32], mask: &[u32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (w, chunk) in logits.chunks(32).enumerate() {
        let bits = mask.get(w).copied().unwrap_or(0);
        if bits == 0 {
            continue;
        }
        for (b, &l) in chunk.iter().enumerate() {
            if bits >> b & 1 == 0 {
                continue;
            }
            let v = if l.is_nan() { f32::NEG_INFINITY } else { l };
            if best.is_none_or(|(_, bv)| v > bv) {
                best = Some((w * 32 + b, v));
            }
        }
    }
    best.map(|(i, _)| i as u32)
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Sampler {
            params,
            rng,
            candidates: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token. `seen` is the whole sequence so far (prompt and generated tokens).
    pub fn sample(&mut self, logits: &mut [f32], seen: &[u32]) -> u32 {
        apply_repetition_penalty(logits, seen, self.params.repetition_penalty);
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let probs = self.warp(logits);
        let u = self.rng.next_f64();
        draw(&self.candidates, &probs, u, None)
    }

    /// Speculative sampling of a guessed token `guess` (a draft that proposes it with certainty,
    /// as prompt lookup does): accepts it with its probability p under this sampler's
    /// distribution, else draws from the distribution without it (renormalized). The token that
    /// comes out is distributed exactly as `sample`'s (P(guess) = p; P(x) = (1 - p) · p_x / (1 - p)
    /// for any other x), so speculation does not change what sampling generates, only which
    /// random numbers it uses. Greedy: the argmax, accepted when it is the guess. Returns the
    /// token and whether it is the guess.
    pub fn sample_guess(&mut self, logits: &mut [f32], seen: &[u32], guess: u32) -> (u32, bool) {
        apply_repetition_penalty(logits, seen, self.params.repetition_penalty);
        if self.params.is_greedy() {
            let id = argmax(logits);
            return (id, id == guess);
        }
        let probs = self.warp(logits);
        let c = &self.candidates;
        let p_guess = c
            .iter()
            .position(|x| x.0 == guess)
            .map_or(0.0, |i| probs[i]);
        if self.rng.next_f64() < p_guess {
            return (guess, true);
        }
        let u = self.rng.next_f64() * (1.0 - p_guess);
        (draw(c, &probs, u, Some(guess)), false)
    }

    /// The warpers (temperature → top-k → top-p → min-p) over `logits`: leaves the surviving
    /// (token, scaled logit) pairs in `self.candidates`, most likely first, and returns their
    /// probabilities.
    fn warp(&mut self, logits: &[f32]) -> Vec<f64> {
        let p = &self.params;
        // TemperatureLogitsWarper
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l / p.temperature)),
        );
        c.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        // TopKLogitsWarper: keep every token whose logit reaches the k-th largest (ties kept).
        if p.top_k > 0 && p.top_k < c.len() {
            let threshold = c[p.top_k - 1].1;
            let keep = c.iter().take_while(|x| x.1 >= threshold).count();
            c.truncate(keep);
        }
        // TopPLogitsWarper: drop the least likely tokens whose cumulative probability (ascending)
        // stays ≤ 1 - top_p; always keep the most likely one.
        if p.top_p < 1.0 {
            let probs = softmax(c.iter().map(|x| x.1));
            let mut cumulative = 0.0f64;
            let mut drop = 0;
            for &pr in probs.iter().rev() {
                cumulative += pr;
                if cumulative <= 1.0 - p.top_p as f64 {
                    drop += 1;
                } else {
                    break;
                }
            }
            let keep = (c.len() - drop).max(1);
            c.truncate(keep);
        }
        // MinPLogitsWarper: drop tokens with probability < min_p × top probability.
        if p.min_p > 0.0 {
            let probs = softmax(c.iter().map(|x| x.1));
            let threshold = p.min_p as f64 * probs[0];
            let keep = probs
                .iter()
                .take_while(|&&pr| pr >= threshold)
                .count()
                .max(1);
            c.truncate(keep);
        }
        softmax(c.iter().map(|x| x.1))
    }
}

/// The candidate at `u` (uniform in [0, total mass)) of the cumulative distribution `probs`,
/// skipping `except`; the last one counted when rounding leaves `u` past the end.
fn draw(candidates: &[(u32, f32)], probs: &[f64], mut u: f64, except: Option<u32>) -> u32 {
    let mut last = candidates[0].0;
    for (&(id, _), &pr) in candidates.iter().zip(probs) {
        if Some(id) == except {
            continue;
        }
        if u < pr {
            return id;
        }
        u -= pr;
        last = id;
    }
    last
}

/// Softmax in f64 of logits sorted in descending order.
fn softmax(logits: impl Iterator<Item = f32> + Clone) -> Vec<f64> {
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exps: Vec<f64> = logits.map(|l| (l as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(p: SamplingParams) -> Sampler {
        Sampler::new(p).unwrap()
    }

    #[test]
    fn greedy_takes_first_max() {
        let mut s = sampler(SamplingParams::default());
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn masked_argmax_is_argmax_over_the_allowed() {
        let mut rng = Rng::new(3);
        for n in [1usize, 31, 32, 33, 100, 1000] {
            let logits: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() * 8.0) as f32 - 4.0)
                .collect();
            let mask: Vec<u32> = (0..n.div_ceil(32)).map(|_| rng.next_u64() as u32).collect();
            let mut masked = logits.clone();
            apply_mask(&mut masked, &mask);
            let allowed = (0..n).any(|i| mask[i / 32] >> (i % 32) & 1 == 1);
            let want = allowed.then(|| argmax(&masked));
            assert_eq!(argmax_masked(&logits, &mask), want, "n {n}");
        }
        // the first on ties; the max disallowed; tokens past the mask's end disallowed
        assert_eq!(argmax_masked(&[1.0, 3.0, 3.0, 3.0], &[0b1100]), Some(2));
        assert_eq!(argmax_masked(&[9.0, 3.0, 1.0], &[0b110]), Some(1));
        let mut logits = vec![0.0; 40];
        logits[35] = 5.0;
        assert_eq!(argmax_masked(&logits, &[1 << 3]), Some(3));
        // nothing allowed: None, never a panic
        assert_eq!(argmax_masked(&[1.0, 2.0], &[0]), None);
        assert_eq!(argmax_masked(&[1.0, 2.0], &[]), None);
        assert_eq!(argmax_masked(&[], &[u32::MAX]), None);
        // -inf allowed: still chosen when nothing allowed beats it; NaN counts as -inf
        let inf = f32::NEG_INFINITY;
        assert_eq!(argmax_masked(&[5.0, inf, inf], &[0b110]), Some(1));
        assert_eq!(argmax_masked(&[f32::NAN, inf, -1.0], &[0b011]), Some(0));
        assert_eq!(argmax_masked(&[f32::NAN, -1e30, -1.0], &[0b011]), Some(1));
        // -0.0 ties with 0.0: the first wins
        assert_eq!(argmax_masked(&[-1.0, -0.0, 0.0], &[0b111]), Some(1));
    }

    #[test]
    fn repetition_penalty_follows_transformers() {
        let mut l = [2.0f32, -2.0, 1.0];
        apply_repetition_penalty(&mut l, &[0, 1, 0], 2.0);
        assert_eq!(l, [1.0, -4.0, 1.0]);
        // penalised token 0 (2.0 → 1.0) now ties with 2; greedy takes the first
        let mut s = sampler(SamplingParams {
            repetition_penalty: 4.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&mut [2.0, -2.0, 1.0], &[0]), 2);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = sampler(SamplingParams {
            temperature: 1.5,
            top_k: 1,
            seed: 7,
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&mut [0.1, 0.5, 0.4, 0.45], &[]), 1);
        }
    }

    #[test]
    fn top_p_keeps_smallest_nucleus() {
        // probs ≈ [0.665, 0.245, 0.090]: top_p 0.7 keeps the first two, never the third
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_p: 0.7,
            seed: 1,
            ..Default::default()
        });
        let mut counts = [0; 3];
        for _ in 0..2000 {
            counts[s.sample(&mut [2.0, 1.0, 0.0], &[]) as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!(counts[1] > 400 && counts[0] > 1000, "{counts:?}");
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // probs ≈ [0.665, 0.245, 0.090]; min_p 0.2 → threshold 0.133 drops token 2
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            seed: 3,
            ..Default::default()
        });
        for _ in 0..500 {
            assert_ne!(s.sample(&mut [2.0, 1.0, 0.0], &[]), 2);
        }
    }

    #[test]
    fn sampling_matches_distribution_and_seed_is_deterministic() {
        let draw = |seed| {
            let mut s = sampler(SamplingParams {
                temperature: 1.0,
                seed,
                ..Default::default()
            });
            (0..4000)
                .map(|_| s.sample(&mut [0.0, 2f32.ln(), 0.0], &[]))
                .collect::<Vec<_>>()
        };
        let a = draw(42);
        assert_eq!(a, draw(42));
        assert_ne!(a, draw(43));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.5).abs() < 0.03, "p(1) = {ones}");
    }

    #[test]
    fn invalid_params_are_rejected() {
        assert!(Sampler::new(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        })
        .is_err());
        assert!(Sampler::new(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        })
        .is_err());
        assert!(Sampler::new(SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        })
        .is_err());
    }

    /// Speculative sampling keeps the distribution: for every guess (likely, unlikely, cut by
    /// top-k), the tokens `sample_guess` returns are distributed as the warped softmax, within
    /// 5 standard deviations over 200k draws; the guess is accepted at its own probability.
    #[test]
    fn speculative_sampling_keeps_the_distribution() {
        let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0];
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 4,
            seed: 11,
            ..Default::default()
        };
        // The warped distribution: top-4 of softmax(logits / 0.8).
        let e: Vec<f64> = logits[..4]
            .iter()
            .map(|&l| ((l / 0.8) as f64).exp())
            .collect();
        let total: f64 = e.iter().sum();
        let want: Vec<f64> = e.iter().map(|x| x / total).chain([0.0]).collect();
        let n = 200_000;
        for guess in [0u32, 2, 4] {
            let mut s = sampler(params.clone());
            let mut counts = [0usize; 5];
            let mut accepted = 0;
            for _ in 0..n {
                let (id, hit) = s.sample_guess(&mut logits.clone(), &[], guess);
                counts[id as usize] += 1;
                accepted += usize::from(hit);
                assert_eq!(hit, id == guess);
            }
            for (i, &c) in counts.iter().enumerate() {
                let p = want[i];
                let sd = (p * (1.0 - p) / n as f64).sqrt().max(1e-9);
                let got = c as f64 / n as f64;
                assert!(
                    (got - p).abs() < 5.0 * sd + 1e-12,
                    "guess {guess}: token {i}: {got} vs {p}"
                );
            }
            let p = want[guess as usize];
            let rate = accepted as f64 / n as f64;
            assert!((rate - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-12);
        }
        // Greedy: the argmax, accepted only when guessed.
        let mut g = sampler(SamplingParams::default());
        assert_eq!(g.sample_guess(&mut logits.clone(), &[], 0), (0, true));
        assert_eq!(g.sample_guess(&mut logits.clone(), &[], 3), (0, false));
    }
}
