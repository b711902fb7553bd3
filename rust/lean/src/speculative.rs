//! Speculative decoding's drafts: guesses of the next few tokens, which the engine checks with
//! one batched forward pass (the target's argmax at every guessed position). The longest prefix
//! of the guess that equals the target's own argmaxes is kept, plus the target's next token, so
//! the output is the plain greedy output by construction; the rest of the pass is rolled back
//! (a KV cache length change). A pass over a few tokens costs about what one costs when decode
//! is bound by reading the weights, so every accepted guess is a token nearly for free.
//!
//! With sampling, each guess is kept with its probability (`Sampler::sample_guess`), so the output
//! distribution is unchanged.
//!
//! Prompt lookup is the draft here: the tokens that followed the latest earlier occurrence of the
//! text's last n-gram. Code edits, summaries, extraction and RAG answers repeat their input. A
//! caller that expects the output (OpenAI's "predicted outputs": the file being edited) can give
//! it as a prediction, searched first.

/// How drafts are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Speculation {
    /// Prompt lookup: match the last `max_ngram` tokens (then fewer, down to 1) in `prediction`
    /// (the occurrence nearest the output's own position in it), else earlier in the prompt and
    /// output (the latest occurrence), and guess the up to `max_draft` tokens that followed.
    Lookup {
        max_ngram: usize,
        max_draft: usize,
        /// Token ids the output is expected to resemble (may be empty).
        prediction: Vec<u32>,
    },
}

impl Speculation {
    /// Prompt lookup with drafts of up to `max_draft` tokens, matching n-grams of 3 to 1 tokens.
    pub fn lookup(max_draft: usize) -> Self {
        Speculation::Lookup {
            max_ngram: 3,
            max_draft,
            prediction: Vec::new(),
        }
    }

    /// The same, with the output expected to resemble `prediction`.
    pub fn with_prediction(self, prediction: Vec<u32>) -> Self {
        let Speculation::Lookup {
            max_ngram,
            max_draft,
            ..
        } = self;
        Speculation::Lookup {
            max_ngram,
            max_draft,
            prediction,
        }
    }
}

/// Counts of one generation's speculation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Batched verification passes run.
    pub verifications: usize,
    /// Guessed tokens those passes checked.
    pub drafted: usize,
    /// Guessed tokens that equalled the target's choice.
    pub accepted: usize,
}

impl SpeculationStats {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Makes drafts for one generation, adapting their length to how many were accepted: longer
/// after a draft accepted in full, shorter after a miss (as transformers' assisted generation).
#[derive(Clone, Debug)]
pub struct Drafter {
    max_ngram: usize,
    max_draft: usize,
    prediction: Vec<u32>,
    /// The length of the next draft.
    length: usize,
    pub stats: SpeculationStats,
}

impl Drafter {
    pub fn new(spec: &Speculation) -> Self {
        let Speculation::Lookup {
            max_ngram,
            max_draft,
            prediction,
        } = spec;
        Drafter {
            max_ngram: (*max_ngram).max(1),
            max_draft: *max_draft,
            prediction: prediction.clone(),
            length: *max_draft,
            stats: SpeculationStats::default(),
        }
    }

    /// A guess of the tokens after `ids` (the prompt, then `output` tokens generated so far), at
    /// most `limit` of them; empty when the last n-gram occurs nowhere.
    pub fn draft(&self, ids: &[u32], output: usize, limit: usize) -> Vec<u32> {
        let want = self.length.min(limit);
        if want == 0 || ids.is_empty() {
            return Vec::new();
        }
        let p = &self.prediction;
        for n in (1..=self.max_ngram.min(ids.len())).rev() {
            let tail = &ids[ids.len() - n..];
            // In the prediction: the occurrence with a token after it whose end is nearest the
            // output's length (where an output that follows the prediction would be).
            let nearest = (0..(p.len() + 1).saturating_sub(n + 1))
                .filter(|&j| &p[j..j + n] == tail)
                .min_by_key(|&j| (j + n).abs_diff(output));
            if let Some(start) = nearest {
                let from = start + n;
                return p[from..(from + want).min(p.len())].to_vec();
            }
            // In the prompt and output: the latest occurrence that has a token after it (so it
            // is not the tail itself).
            if n < ids.len() {
                if let Some(start) = (0..ids.len() - n).rev().find(|&j| &ids[j..j + n] == tail) {
                    let from = start + n;
                    return ids[from..(from + want).min(ids.len())].to_vec();
                }
            }
        }
        Vec::new()
    }

    /// Books a verification of a `drafted`-token guess of which `accepted` were right.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.stats.verifications += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        self.length = if accepted == drafted {
            (self.length + 2).min(self.max_draft)
        } else {
            self.length.saturating_sub(1).max(1)
        };
    }
}

/// How many of `draft` the target accepts: the length of the prefix where each guess equals the
/// target's argmax at the position before it (`argmaxes[i]` follows the pass's token `i`, whose
/// tokens are the last generated one and then the draft).
pub fn accepted_prefix(draft: &[u32], argmaxes: &[u32]) -> usize {
    draft
        .iter()
        .zip(argmaxes)
        .take_while(|(guess, target)| guess == target)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(max_ngram: usize, max_draft: usize) -> Drafter {
        Drafter::new(&Speculation::Lookup {
            max_ngram,
            max_draft,
            prediction: Vec::new(),
        })
    }

    #[test]
    fn the_latest_longest_match_gives_the_draft() {
        let d = drafter(3, 4);
        // "7 8 9" occurs at 1 (followed by 1 2) and at 6 (followed by 5 6 7 8); the tail is "7 8 9".
        let ids = [0, 7, 8, 9, 1, 2, 7, 8, 9, 5, 6, 7, 8, 3, 7, 8, 9];
        assert_eq!(d.draft(&ids, 0, 10), vec![5, 6, 7, 8]);
        assert_eq!(d.draft(&ids, 0, 2), vec![5, 6]);
        assert_eq!(d.draft(&ids, 0, 0), Vec::<u32>::new());
    }

    #[test]
    fn shorter_ngrams_are_tried_when_longer_ones_miss_and_a_draft_may_run_to_the_end() {
        let d = drafter(3, 8);
        // No earlier "4 5 9" nor "5 9"; "9" occurs at 2, followed by 3 4 5 9 (up to the end).
        let ids = [1, 2, 9, 3, 4, 5, 9];
        assert_eq!(d.draft(&ids, 0, 8), vec![3, 4, 5, 9]);
        assert_eq!(d.draft(&[1, 2, 3], 0, 8), Vec::<u32>::new());
        assert_eq!(d.draft(&[5], 0, 8), Vec::<u32>::new());
        assert_eq!(d.draft(&[], 0, 8), Vec::<u32>::new());
        // A run of one token: the match right before the tail still has a token after it.
        assert_eq!(d.draft(&[4, 4, 4, 4], 0, 8), vec![4]);
    }

    #[test]
    fn a_prediction_is_searched_first_nearest_the_outputs_position() {
        let spec = Speculation::lookup(3).with_prediction(vec![5, 6, 7, 1, 5, 6, 8, 9, 5, 6, 4]);
        let d = Drafter::new(&spec);
        // Prompt [1, 2], output [5, 6] so far: "5 6" occurs in the prediction at 0, 4 and 8;
        // the output's length (2) is nearest the first's end.
        assert_eq!(d.draft(&[1, 2, 5, 6], 2, 8), vec![7, 1, 5]);
        // Output 7 tokens long: the occurrence at 4 (end 6) is nearest.
        assert_eq!(d.draft(&[1, 2, 0, 0, 0, 0, 0, 5, 6], 7, 8), vec![8, 9, 5]);
        // Not in the prediction: the context.
        assert_eq!(d.draft(&[3, 2, 3], 1, 8), vec![2, 3]);
        // A one-token output that starts the prediction.
        assert_eq!(d.draft(&[2, 2, 5], 1, 2), vec![6, 7]);
    }

    #[test]
    fn the_draft_length_follows_acceptance() {
        let mut d = drafter(3, 6);
        let ids: Vec<u32> = (0..20).chain(0..20).collect();
        assert_eq!(d.draft(&ids[..25], 0, 100).len(), 6);
        d.record(6, 2);
        assert_eq!(d.length, 5);
        d.record(5, 0);
        d.record(4, 0);
        d.record(3, 0);
        d.record(2, 0);
        d.record(1, 0);
        assert_eq!(d.length, 1, "never below one");
        d.record(1, 1);
        assert_eq!(d.length, 3);
        d.record(3, 3);
        d.record(5, 5);
        assert_eq!(d.length, 6, "never above the maximum");
        assert_eq!(d.stats.verifications, 9);
        assert_eq!(d.stats.drafted, 30);
        assert_eq!(d.stats.accepted, 11);
    }

    #[test]
    fn the_accepted_prefix_stops_at_the_first_difference() {
        assert_eq!(accepted_prefix(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(accepted_prefix(&[1, 2, 3], &[1, 5, 3, 4]), 1);
        assert_eq!(accepted_prefix(&[1, 2, 3], &[0, 2, 3, 4]), 0);
        assert_eq!(accepted_prefix(&[], &[7]), 0);
    }
}
