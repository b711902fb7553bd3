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
//! Drafts come from prompt lookup: the tokens that followed the latest earlier occurrence of the
//! text's last n-gram. Code edits, summaries, extraction and RAG answers repeat their input. A
//! caller that expects the output (OpenAI's "predicted outputs": the file being edited) can give
//! it as a prediction, searched first. Or from a draft model: a smaller model with the same
//! vocabulary decodes the guess greedily ([`DraftModel`]), with a KV cache of its own that keeps
//! the prefix it shares with the text.
//!
//! Speculation pays only where a pass over a few tokens costs little more than one token and
//! guesses are accepted; in open chat they rarely are. So a cost check (on by default, where the
//! platform has a clock) compares seconds per token: plain decoding's, a moving average over the
//! steps it pauses guessing for (which a GPU session queues ahead, as plain decoding does), and
//! speculation's, summed over its latest 4 steps: verification passes and the steps that found
//! no guess (a GPU queues one pass behind such a step, as plain decoding does; the next step's
//! verification discards it when that step does guess). Judging 4 steps at a time,
//! each set judged once, keeps one slow step (the first ones after prefill take 4–10× a plain
//! step on a CPU) from deciding several pauses in a row. While speculation's tokens come dearer
//! it runs plain steps for a while (4, then twice as many after each further loss, up to 64),
//! then probes with a one-token guess that grows again if accepted. The first judgment has no
//! plain time yet: it pauses 4 steps to take one.

use crate::engine::constraint_error;
use crate::error::{LeanError, Result};
use crate::model::Model;
use crate::session::Session;
use lean_constraint::Constraint;

/// How drafts are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Speculation {
    /// Prompt lookup: match the last `max_ngram` tokens (then fewer) in `prediction` (the
    /// occurrence nearest the output's own position in it, down to 1 token), else earlier in the
    /// prompt and output (the latest occurrence, down to [`MIN_CONTEXT_NGRAM`] tokens), and guess
    /// the up to `max_draft` tokens that followed.
    Lookup {
        max_ngram: usize,
        max_draft: usize,
        /// Token ids the output is expected to resemble (may be empty).
        prediction: Vec<u32>,
        /// Pause guessing while passes cost more per token than plain steps (see the module).
        cost_check: bool,
    },
    /// The engine's draft model (`Engine::set_draft_model`) guesses up to `max_draft` tokens,
    /// greedily.
    DraftModel { max_draft: usize, cost_check: bool },
}

impl Speculation {
    /// Prompt lookup with drafts of up to `max_draft` tokens, matching n-grams of 3 tokens and
    /// fewer.
    pub fn lookup(max_draft: usize) -> Self {
        Speculation::Lookup {
            max_ngram: 3,
            max_draft,
            prediction: Vec::new(),
            cost_check: true,
        }
    }

    /// Guesses of up to `max_draft` tokens by the engine's draft model.
    pub fn draft_model(max_draft: usize) -> Self {
        Speculation::DraftModel {
            max_draft,
            cost_check: true,
        }
    }

    /// The same, guessing at every step however the passes pay (tests that count guesses;
    /// benchmarks of the passes themselves).
    pub fn without_cost_check(self) -> Self {
        match self {
            Speculation::Lookup {
                max_ngram,
                max_draft,
                prediction,
                ..
            } => Speculation::Lookup {
                max_ngram,
                max_draft,
                prediction,
                cost_check: false,
            },
            Speculation::DraftModel { max_draft, .. } => Speculation::DraftModel {
                max_draft,
                cost_check: false,
            },
        }
    }

    /// Whether guessing pauses while passes do not pay.
    pub fn cost_check(&self) -> bool {
        match self {
            Speculation::Lookup { cost_check, .. } | Speculation::DraftModel { cost_check, .. } => {
                *cost_check
            }
        }
    }

    /// The same, with the output expected to resemble `prediction` (prompt lookup searches it
    /// first; a draft model has no use for it).
    pub fn with_prediction(self, prediction: Vec<u32>) -> Self {
        match self {
            Speculation::Lookup {
                max_ngram,
                max_draft,
                cost_check,
                ..
            } => Speculation::Lookup {
                max_ngram,
                max_draft,
                prediction,
                cost_check,
            },
            draft_model => draft_model,
        }
    }

    /// The longest guess.
    pub fn max_draft(&self) -> usize {
        match self {
            Speculation::Lookup { max_draft, .. } | Speculation::DraftModel { max_draft, .. } => {
                *max_draft
            }
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
    /// Steps run without a guess because the cost check paused guessing.
    pub paused_steps: usize,
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
    /// Prompt lookup's longest n-gram; 0 when the engine's draft model makes the guesses.
    max_ngram: usize,
    max_draft: usize,
    prediction: Vec<u32>,
    /// The length of the next draft.
    length: usize,
    /// `None` without the cost check.
    cost: Option<CostCheck>,
    pub stats: SpeculationStats,
}

/// The cost check's state: a moving average of plain decoding's seconds a step, the seconds,
/// tokens and steps of speculation since its last judgment, and the pause.
#[derive(Clone, Debug, Default)]
struct CostCheck {
    plain: Option<f64>,
    spec_seconds: f64,
    spec_tokens: usize,
    spec_steps: usize,
    /// Plain steps left before the next guess.
    pause: usize,
    /// The pause after the next loss.
    backoff: usize,
}

/// The shortest match prompt lookup guesses from in the prompt and output. A lone token's
/// earlier occurrence rarely predicts what follows: with every step guessing, 512 tokens of the
/// three bench-spec tasks, SmolLM2-135M and Qwen2.5-Coder-0.5B kept 0.5–0.9 tokens a pass from
/// one-token matches, against 0.6–3.5 from two and 4–7 from three (BENCHMARKS.md). A pass that
/// keeps less than a token costs more than the plain step it replaces, so open chat, where most
/// matches are of one token, lost. The prediction (OpenAI's `prediction`) is the output's own
/// expected text, so single tokens are matched there.
pub const MIN_CONTEXT_NGRAM: usize = 2;

/// Weight of the newest time in plain decoding's average.
const COST_SMOOTHING: f64 = 0.25;
/// Steps of speculation judged together.
const JUDGED_STEPS: usize = 4;
/// The cost check's shortest and longest pauses, in steps.
const MIN_PAUSE: usize = 4;
const MAX_PAUSE: usize = 64;

fn average(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |old| old + COST_SMOOTHING * (new - old))
}

impl Drafter {
    pub fn new(spec: &Speculation) -> Self {
        let (max_ngram, prediction) = match spec {
            Speculation::Lookup {
                max_ngram,
                prediction,
                ..
            } => ((*max_ngram).max(1), prediction.clone()),
            Speculation::DraftModel { .. } => (0, Vec::new()),
        };
        Drafter {
            max_ngram,
            max_draft: spec.max_draft(),
            prediction,
            length: spec.max_draft(),
            cost: spec.cost_check().then_some(CostCheck {
                backoff: MIN_PAUSE,
                ..CostCheck::default()
            }),
            stats: SpeculationStats::default(),
        }
    }

    /// Whether the cost check has paused guessing: the next step runs plain.
    pub fn paused(&self) -> bool {
        self.cost.as_ref().is_some_and(|c| c.pause > 0)
    }

    /// While paused, the plain steps that follow the one about to run before the next guess
    /// (a session may queue them ahead); 0 otherwise.
    pub fn plain_steps_after_this(&self) -> usize {
        self.cost.as_ref().map_or(0, |c| c.pause.saturating_sub(1))
    }

    /// The passes a session may queue behind a step that runs without a guess: the rest of the
    /// pause, and with prompt lookup at least one. A step whose lookup found nothing is mostly
    /// followed by another (open chat), and a pass queued behind it keeps a GPU busy while its
    /// id comes back; where the next step does find a guess, its verification discards that
    /// pass (its work is lost, and the verification waits behind it). A draft model guesses at
    /// every step, so it queues nothing beyond the pause.
    pub fn passes_to_queue_after_this(&self) -> usize {
        let pause_left = self.plain_steps_after_this();
        if self.uses_draft_model() {
            pause_left
        } else {
            pause_left.max(1)
        }
    }

    /// Books a step that ran without a guess and took `seconds` (0 where the platform has no
    /// clock: the cost check then never pauses): a plain decoding step while paused, else a
    /// step of speculation whose guessing found nothing.
    pub fn record_plain(&mut self, seconds: f64) {
        let Some(cost) = &mut self.cost else {
            return;
        };
        if cost.pause > 0 {
            cost.pause -= 1;
            self.stats.paused_steps += 1;
            if seconds > 0.0 {
                cost.plain = Some(average(cost.plain, seconds));
            }
        } else if seconds > 0.0 {
            self.weigh(seconds, 1);
        }
    }

    /// Whether the engine's draft model makes the guesses (else prompt lookup).
    pub fn uses_draft_model(&self) -> bool {
        self.max_ngram == 0
    }

    /// How long the next guess may be, at most `limit`.
    pub fn next_length(&self, limit: usize) -> usize {
        self.length.min(limit)
    }

    /// Prompt lookup's guess of the tokens after `ids` (the prompt, then `output` tokens generated
    /// so far), at most `limit` of them; empty when the last n-gram occurs nowhere.
    pub fn draft(&self, ids: &[u32], output: usize, limit: usize) -> Vec<u32> {
        let want = self.next_length(limit);
        if want == 0 || ids.is_empty() || self.uses_draft_model() {
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
            if n < ids.len() && n >= MIN_CONTEXT_NGRAM.min(self.max_ngram) {
                if let Some(start) = (0..ids.len() - n).rev().find(|&j| &ids[j..j + n] == tail) {
                    let from = start + n;
                    return ids[from..(from + want).min(ids.len())].to_vec();
                }
            }
        }
        Vec::new()
    }

    /// Books a verification of a `drafted`-token guess of which `accepted` were right, which
    /// took `seconds` with the guessing (0 where the platform has no clock).
    pub fn record(&mut self, drafted: usize, accepted: usize, seconds: f64) {
        self.stats.verifications += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        self.length = if accepted == drafted {
            (self.length + 2).min(self.max_draft)
        } else {
            self.length.saturating_sub(1).max(1)
        };
        if seconds > 0.0 {
            self.weigh(seconds, accepted + 1);
        }
    }

    /// Adds a step of speculation that gave `tokens` in `seconds` to the cost check; every
    /// [`JUDGED_STEPS`] steps, pauses guessing if their tokens came dearer than plain decoding's.
    fn weigh(&mut self, seconds: f64, tokens: usize) {
        let Some(cost) = &mut self.cost else {
            return;
        };
        cost.spec_seconds += seconds;
        cost.spec_tokens += tokens;
        cost.spec_steps += 1;
        if cost.spec_steps < JUDGED_STEPS {
            return;
        }
        let Some(plain) = cost.plain else {
            // No plain time yet: a few plain steps, queued ahead where the session can; these
            // steps are judged after them.
            cost.pause = MIN_PAUSE;
            return;
        };
        let per_token = cost.spec_seconds / cost.spec_tokens as f64;
        (cost.spec_seconds, cost.spec_tokens, cost.spec_steps) = (0.0, 0, 0);
        if per_token > plain {
            cost.pause = cost.backoff;
            cost.backoff = (cost.backoff * 2).min(MAX_PAUSE);
            // The first guess after the pause is a cheap probe; it grows if accepted.
            self.length = 1;
        } else {
            // Paying again: the next pause (if any) shorter.
            cost.backoff = (cost.backoff / 2).max(MIN_PAUSE);
        }
    }
}

/// A smaller model with the target's vocabulary that guesses by greedy decoding, with its own
/// session (any backend). Its cache keeps the ids it holds, so each guess runs only the tokens
/// since the common prefix: the target's tokens accepted or chosen since the last guess.
pub struct DraftModel {
    model: Model,
    session: Box<dyn Session>,
    /// The ids whose keys/values the session holds, position by position.
    cached: Vec<u32>,
}

impl DraftModel {
    /// `model` drafting for a target whose GGUF vocabulary is `target_vocabulary`: the token
    /// lists must be the same, else the guesses would mean other text (an `InvalidArgument`
    /// naming the first difference).
    pub fn new(
        model: Model,
        session: Box<dyn Session>,
        target_vocabulary: &[&str],
    ) -> Result<Self> {
        let draft_vocabulary = model.vocabulary()?;
        if draft_vocabulary.len() != target_vocabulary.len() {
            return Err(LeanError::InvalidArgument(format!(
                "the draft model's vocabulary has {} tokens, the model's {}: a draft model must \
                 share the model's tokenizer",
                draft_vocabulary.len(),
                target_vocabulary.len()
            )));
        }
        if let Some(id) =
            (0..draft_vocabulary.len()).find(|&i| draft_vocabulary[i] != target_vocabulary[i])
        {
            return Err(LeanError::InvalidArgument(format!(
                "the draft model's token {id} is {:?}, the model's {:?}: a draft model must \
                 share the model's tokenizer",
                draft_vocabulary[id], target_vocabulary[id]
            )));
        }
        Ok(DraftModel {
            model,
            session,
            cached: Vec::new(),
        })
    }

    /// Replaces the session with a CPU session (its device was lost), when the model's
    /// weights are in memory; the cache starts empty (the next guess prefills what it needs).
    pub fn fall_back_to_cpu(&mut self) {
        if self.model.has_weight_data() {
            let ctx = self.session.context_length();
            self.session = Box::new(crate::cpu::CpuSession::new(&self.model, ctx));
            self.cached.clear();
        }
    }

    /// One line for logs: the model and its backend.
    pub fn describe(&self) -> String {
        format!("{} on {}", self.model.describe(), self.session.describe())
    }

    /// A greedy guess of up to `n` tokens after `ids`, each below `vocab_limit` (the target's
    /// vocabulary size): shorter where the draft model's context ends. Runs the ids past the
    /// prefix it has cached, then one token a pass; a failure forgets the cache. Under a
    /// `constraint` each guess is the draft model's masked argmax (a token it allows), the guess
    /// ends before a stop id and after the token that completes the output, and the constraint
    /// is rolled back to where it was.
    pub fn propose(
        &mut self,
        ids: &[u32],
        n: usize,
        vocab_limit: usize,
        constraint: Option<&mut Constraint>,
    ) -> Result<Vec<u32>> {
        // The last guess is not run: ids.len() + n - 1 positions.
        let n = n.min((self.session.context_length() + 1).saturating_sub(ids.len()));
        if n == 0 || ids.is_empty() {
            return Ok(Vec::new());
        }
        let guess = match constraint {
            None => self.run(ids, n, vocab_limit),
            Some(constraint) => {
                let mut followed = 0;
                let guess = self.run_constrained(ids, n, constraint, &mut followed);
                let back = constraint.rollback(followed).map_err(constraint_error);
                guess.and_then(|guess| back.map(|()| guess))
            }
        };
        if guess.is_err() {
            self.cached.clear();
            self.session.truncate(0);
        }
        guess
    }

    /// Forgets what the cache holds past the prefix it shares with `ids` and returns the ids
    /// still to run (at least the last one: its logits give the first guess).
    fn sync<'a>(&mut self, ids: &'a [u32]) -> &'a [u32] {
        if self.cached.len() != self.session.position() {
            self.cached.clear();
        }
        let common = self
            .cached
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        self.cached.truncate(common);
        self.session.truncate(common);
        &ids[common..]
    }

    fn run(&mut self, ids: &[u32], n: usize, vocab_limit: usize) -> Result<Vec<u32>> {
        let fresh = self.sync(ids);
        let mut next = self.session.forward_argmax(&self.model, fresh)?;
        self.cached.extend_from_slice(fresh);
        let mut guess = Vec::with_capacity(n);
        while (next as usize) < vocab_limit {
            guess.push(next);
            if guess.len() == n {
                break;
            }
            next = self.session.decode_argmax(&self.model, next, 0)?;
            self.cached.push(guess[guess.len() - 1]);
        }
        Ok(guess)
    }

    /// `run` under a constraint, which accepts each guessed token (`followed` counts them, for
    /// the caller to roll back).
    fn run_constrained(
        &mut self,
        ids: &[u32],
        n: usize,
        constraint: &mut Constraint,
        followed: &mut usize,
    ) -> Result<Vec<u32>> {
        let fresh = self.sync(ids);
        // An Arc's copy, not the ids': the loop lends the constraint to the session.
        let vocab = constraint.vocabulary().clone();
        let mut next = self
            .session
            .forward_argmax_masked(&self.model, fresh, constraint)?;
        self.cached.extend_from_slice(fresh);
        let mut guess = Vec::with_capacity(n);
        while let Some(id) = next.filter(|id| !vocab.stop_ids().contains(id)) {
            guess.push(id);
            constraint.accept(id).map_err(constraint_error)?;
            *followed += 1;
            if guess.len() == n || constraint.is_complete() {
                break;
            }
            next = self
                .session
                .forward_argmax_masked(&self.model, &[id], constraint)?;
            self.cached.push(id);
        }
        Ok(guess)
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
            cost_check: false,
        })
    }

    /// Speculation's steps are judged 4 at a time: sets whose tokens cost more than plain steps
    /// pause guessing for 4, then 8, 16 ... 64 steps; a set that pays shortens the next pause;
    /// without a clock (0 s) nothing pauses.
    #[test]
    fn the_cost_check_pauses_guessing_while_passes_do_not_pay() {
        let mut d = Drafter::new(&Speculation::lookup(4));
        // No plain time yet: after 4 steps of speculation, 4 plain steps, the rest of them
        // queued ahead.
        for _ in 0..4 {
            assert!(!d.paused());
            d.record(4, 0, 0.003);
        }
        for left in (0..4).rev() {
            assert!(d.paused());
            assert_eq!(d.plain_steps_after_this(), left);
            d.record_plain(0.001);
        }
        assert!(!d.paused());
        // 3 ms for 1 token against 1 ms plain: those 4 steps and the next are judged a loss,
        // then each 4 more: pause 4, then 8 ...
        let mut pauses = Vec::new();
        let mut steps_between = Vec::new();
        for _ in 0..5 {
            let mut steps = 0;
            while !d.paused() {
                d.record(4, 0, 0.003);
                steps += 1;
            }
            steps_between.push(steps);
            let mut steps = 0;
            while d.paused() {
                // The rest of the pause may be queued ahead; none past it.
                let pause = [4, 8, 16, 32, 64][pauses.len()];
                assert_eq!(d.plain_steps_after_this(), pause - 1 - steps);
                d.record_plain(0.001);
                steps += 1;
            }
            assert_eq!(d.plain_steps_after_this(), 0);
            pauses.push(steps);
        }
        assert_eq!(steps_between, [1, 4, 4, 4, 4]);
        assert_eq!(pauses, [4, 8, 16, 32, 64]);
        assert_eq!(d.next_length(8), 1, "after a pause, a one-token probe");
        for _ in 0..4 {
            d.record(4, 0, 0.003);
        }
        assert!(d.paused(), "the longest pause is kept");
        while d.paused() {
            d.record_plain(0.001);
        }
        // Passes that pay (5 tokens in 2 ms) shorten the pause after each set of 4.
        for _ in 0..20 {
            d.record(4, 4, 0.002);
            assert!(!d.paused());
        }
        // One bad pass among good ones does not lose the set: 9 ms for 16 tokens.
        for step in 0..4 {
            d.record(
                4,
                if step == 3 { 0 } else { 4 },
                if step == 3 { 0.003 } else { 0.002 },
            );
        }
        assert!(!d.paused());
        // The pause after the next loss is back to the shortest.
        for _ in 0..4 {
            d.record(4, 0, 0.003);
        }
        assert_eq!(d.plain_steps_after_this(), 3);
        assert_eq!(d.stats.paused_steps, 4 + 4 + 8 + 16 + 32 + 64 + 64);

        let mut no_clock = Drafter::new(&Speculation::lookup(4));
        for _ in 0..10 {
            no_clock.record(4, 0, 0.0);
            no_clock.record_plain(0.0);
            assert!(!no_clock.paused());
        }
        let mut unchecked = Drafter::new(&Speculation::lookup(4).without_cost_check());
        unchecked.record_plain(0.001);
        for _ in 0..8 {
            unchecked.record(4, 0, 0.1);
        }
        assert!(!unchecked.paused());
    }

    /// A step whose guessing found nothing is speculation's cost too: on a GPU its lookup and
    /// the passes it discards make it dearer than a paused step. Where such steps cost more than
    /// the paused ones, guessing pauses; where they cost the same (a CPU), it does not.
    #[test]
    fn steps_without_a_guess_count_against_speculation() {
        let mut gpu = Drafter::new(&Speculation::lookup(8));
        let (mut unguessed, mut pauses) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            let mut steps = 0;
            while !gpu.paused() {
                // Unguessed, waiting for its id: 1.5 ms against 1 ms queued.
                gpu.record_plain(0.0015);
                steps += 1;
            }
            unguessed.push(steps);
            let mut steps = 0;
            while gpu.paused() {
                gpu.record_plain(0.001);
                steps += 1;
            }
            pauses.push(steps);
        }
        // The first set waits for the plain time its pause takes, and is judged on the next step.
        assert_eq!(unguessed, [4, 1, 4, 4]);
        assert_eq!(pauses, [4, 4, 8, 16]);
        assert_eq!(gpu.stats.verifications, 0);

        let mut cpu = Drafter::new(&Speculation::lookup(8));
        for _ in 0..4 {
            cpu.record_plain(0.001);
        }
        while cpu.paused() {
            cpu.record_plain(0.001);
        }
        for _ in 0..20 {
            cpu.record_plain(0.001);
            assert!(!cpu.paused());
        }
        // A paying pass among them keeps guessing on.
        cpu.record(4, 3, 0.0012);
        assert!(!cpu.paused());
        assert_eq!(cpu.stats.paused_steps, 4);
    }

    /// Behind a step without a guess a session may queue the rest of the pause, and with prompt
    /// lookup always one pass (the next step mostly finds no guess either); a draft model, which
    /// guesses at every step, queues only the pause.
    #[test]
    fn one_pass_is_queued_behind_an_unguessed_lookup_step() {
        let mut lookup = Drafter::new(&Speculation::lookup(8));
        assert_eq!(lookup.passes_to_queue_after_this(), 1);
        for _ in 0..4 {
            lookup.record_plain(0.001);
        }
        // No plain time yet: a pause of 4 steps, the last one with a pass queued behind it.
        let mut queued = Vec::new();
        while lookup.paused() {
            queued.push(lookup.passes_to_queue_after_this());
            lookup.record_plain(0.001);
        }
        assert_eq!(queued, [3, 2, 1, 1]);
        assert_eq!(
            Drafter::new(&Speculation::lookup(8).without_cost_check()).passes_to_queue_after_this(),
            1
        );

        let mut draft = Drafter::new(&Speculation::draft_model(4));
        assert_eq!(draft.passes_to_queue_after_this(), 0);
        for _ in 0..4 {
            draft.record(4, 0, 0.004);
        }
        let mut queued = Vec::new();
        while draft.paused() {
            queued.push(draft.passes_to_queue_after_this());
            draft.record_plain(0.001);
        }
        assert_eq!(queued, [3, 2, 1, 0]);
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
        // No earlier "4 5 9"; "5 9" occurs at 1, followed by 3 4 5 9 (up to the end).
        let ids = [1, 5, 9, 3, 4, 5, 9];
        assert_eq!(d.draft(&ids, 0, 8), vec![3, 4, 5, 9]);
        // A lone token's match guesses nothing: "9" occurs at 2, but no "5 9" before the tail.
        assert_eq!(d.draft(&[1, 2, 9, 3, 4, 5, 9], 0, 8), Vec::<u32>::new());
        // Unless the lookup matches single tokens only.
        assert_eq!(drafter(1, 8).draft(&[1, 2, 9, 3, 9], 0, 8), vec![3, 9]);
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
        // Not in the prediction: the context, with two tokens or more.
        assert_eq!(d.draft(&[3, 2, 0, 3, 2], 1, 8), vec![0, 3, 2]);
        assert_eq!(d.draft(&[3, 2, 3], 1, 8), Vec::<u32>::new());
        // A one-token output that starts the prediction.
        assert_eq!(d.draft(&[2, 2, 5], 1, 2), vec![6, 7]);
    }

    #[test]
    fn the_draft_length_follows_acceptance() {
        let mut d = drafter(3, 6);
        let ids: Vec<u32> = (0..20).chain(0..20).collect();
        assert_eq!(d.draft(&ids[..25], 0, 100).len(), 6);
        d.record(6, 2, 0.0);
        assert_eq!(d.length, 5);
        d.record(5, 0, 0.0);
        d.record(4, 0, 0.0);
        d.record(3, 0, 0.0);
        d.record(2, 0, 0.0);
        d.record(1, 0, 0.0);
        assert_eq!(d.length, 1, "never below one");
        d.record(1, 1, 0.0);
        assert_eq!(d.length, 3);
        d.record(3, 3, 0.0);
        d.record(5, 5, 0.0);
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
