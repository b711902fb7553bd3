//! A verification pass of speculative decoding (`Output::Argmaxes`) leaves every token the
//! bits of its own decode step: logits and argmax, on reduced synthetic models of each
//! architecture's shape.
use super::{GpuSession, Output};
use crate::context::GpuContext;
use crate::kernels::{argmax_len, Kernels};
use lean::synthetic::{reduced_gguf, SyntheticShape, SyntheticWeights};
use lean::{Model, ModelBytes, Session};
use std::sync::Arc;

/// The device and both matvec reductions' kernels (the subgroup ones where the device has
/// subgroups); None without an adapter (a failure under CI).
fn gpu() -> Option<(Arc<GpuContext>, Vec<Arc<Kernels>>)> {
    match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => {
            let mut kernels = vec![Arc::new(
                pollster::block_on(Kernels::new(&ctx)).expect("kernels compile"),
            )];
            if let Ok(k) = pollster::block_on(Kernels::with_subgroup_matvec(&ctx)) {
                kernels.push(Arc::new(k));
            }
            Some((Arc::new(ctx), kernels))
        }
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a GPU adapter: {e}"
            );
            eprintln!("skipping: {e}");
            None
        }
    }
}

impl GpuSession {
    /// Logits of each of `tokens` decoded one step at a time from position `at`.
    fn decode_steps(&mut self, at: usize, tokens: &[u32]) -> Vec<Vec<f32>> {
        self.truncate(at);
        let vocab = self.model.config.vocab_size;
        tokens
            .iter()
            .map(|&t| {
                self.run_chunk(&[t], Output::Last).unwrap();
                self.wait(self.ctx.read_f32(&self.act.logits, vocab))
                    .unwrap()
            })
            .collect()
    }

    /// Logits and argmax of each of `tokens` from one verification pass at position `at`.
    fn verification_pass(&mut self, at: usize, tokens: &[u32]) -> (Vec<f32>, Vec<u32>) {
        self.truncate(at);
        let n = tokens.len();
        let vocab = self.model.config.vocab_size;
        self.run_chunk(tokens, Output::Argmaxes).unwrap();
        let logits = self.act.logits_all.as_ref().expect("made by run_chunk");
        let rows = self.wait(self.ctx.read_f32(logits, n * vocab)).unwrap();
        let len = argmax_len(vocab);
        let ids = self
            .wait(self.ctx.read_u32(&self.act.argmax, n * len))
            .unwrap();
        (rows, ids.into_iter().step_by(len).collect())
    }
}

/// Shapes with biases (Qwen2.5), q/k norms (Qwen3), post-norms, GELU and a sliding window
/// (Gemma 3, crossed by the tokens), GQA groups of 3 (SmolLM2-360M); passes of 2, 5 and 16
/// tokens; Q4_0 (Q6_K heads where they fit), and Q8_0 on one.
#[test]
fn a_verification_pass_equals_decode_steps_bit_for_bit() {
    let Some((ctx, all_kernels)) = gpu() else {
        return;
    };
    for shape in [
        SyntheticShape::SmolLm2_360M,
        SyntheticShape::Qwen2_5_0_5B,
        SyntheticShape::Qwen3_1_7B,
        SyntheticShape::Gemma3_1B,
    ] {
        // Q8_0 (other kernels, a Q8_0 head) on the smallest shape: lavapipe is slow.
        let all_weights = match shape {
            SyntheticShape::SmolLm2_360M => &SyntheticWeights::ALL[..],
            _ => &SyntheticWeights::ALL[..1],
        };
        for &weights in all_weights {
            let bytes = reduced_gguf(shape, weights, 2, 5).unwrap();
            let model = Model::load(ModelBytes::Owned(bytes)).unwrap();
            let vocab = model.config.vocab_size as u32;
            let ids = |n: usize, salt: u32| -> Vec<u32> {
                (0..n as u32)
                    .map(|i| (i * 7919 + salt * 104_729) % vocab)
                    .collect()
            };
            let window = model.config.layers.iter().filter_map(|l| l.window).min();
            let prompt = ids(window.map_or(37, |w| w - 3), 1);
            // Both reductions on the smallest shape; the rest with the subgroup one where the
            // device has it (as lean-cli runs).
            let kernels = match shape {
                SyntheticShape::SmolLm2_360M => all_kernels.clone(),
                _ => all_kernels[all_kernels.len() - 1..].to_vec(),
            };
            for kernels in kernels {
                let mut session = GpuSession::new(ctx.clone(), kernels, &model, 1024).unwrap();
                session.forward_argmax(&model, &prompt).unwrap();
                for n in [2, 5, crate::kernels::MATVEC_MAX_TOKENS] {
                    let what = format!("{} {} n={n}", shape.name(), weights.name());
                    let tokens = ids(n, 2);
                    let alone = session.decode_steps(prompt.len(), &tokens);
                    let (rows, argmaxes) = session.verification_pass(prompt.len(), &tokens);
                    for (t, want) in alone.iter().enumerate() {
                        let got = &rows[t * want.len()..(t + 1) * want.len()];
                        let same = got
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{what}: token {t}'s logits differ from its decode step's"
                        );
                        assert_eq!(
                            argmaxes[t],
                            lean::sampling::argmax(want),
                            "{what}: token {t}"
                        );
                    }
                    // What speculative decoding calls: the argmaxes (greedy), the rows
                    // (sampling, or greedy under a constraint).
                    session.truncate(prompt.len());
                    assert_eq!(
                        session.forward_argmax_all(&model, &tokens).unwrap(),
                        argmaxes
                    );
                    session.truncate(prompt.len());
                    let mut logit_rows = Vec::new();
                    session
                        .forward_logits_all(&model, &tokens, &mut logit_rows)
                        .unwrap();
                    let same = logit_rows
                        .iter()
                        .zip(&rows)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same && logit_rows.len() == rows.len(), "{what}: logit rows");
                    // Under a constraint: each row's masked argmax on the device, a mask per
                    // row (every k-th token for row k, none for the second row).
                    let words = crate::kernels::mask_words(vocab as usize);
                    let masks: Vec<u32> = (0..n)
                        .flat_map(|t| {
                            (0..words as u32).map(move |w| match t {
                                1 => 0,
                                _ => (0..32)
                                    .filter(|b| (w * 32 + b) % (t as u32 + 1) == 0)
                                    .fold(0, |m, b| m | 1 << b),
                            })
                        })
                        .collect();
                    session.truncate(prompt.len());
                    let masked = session
                        .forward_argmax_all_masked(&model, &tokens, &masks)
                        .unwrap();
                    for (t, want) in alone.iter().enumerate() {
                        let mask = &masks[t * words..(t + 1) * words];
                        let expected = lean::sampling::argmax_masked(want, mask);
                        assert_eq!(masked[t], expected, "{what}: token {t} under its mask");
                    }
                }
            }
        }
    }
}
