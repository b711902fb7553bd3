//! A few tokens through the model (one generated token, or a speculative verification pass of
//! up to `TEAM_TOKENS`), as a team program (`team.rs`): every member runs this code, takes its
//! share of each stage, and syncs where a stage needs all of the last.
//!
//! Per layer: attention norm (every member, into its own buffer) → q|k|v rows → sync → per kv
//! head: biases, q/k norms, rope, cache store, attention → sync → output rows + residual → sync
//! → feed-forward norm (every member) → gate/up rows and their activation → sync → down rows +
//! residual → sync. Five barriers a layer (two more with post-norms), no fork-join.
//!
//! Each token's arithmetic is exactly what it would be alone (the same matvec kernels, norms,
//! attention over positions up to its own), so a pass over n tokens leaves the bits n single
//! steps would: a verification pass agrees with plain greedy decoding bit for bit.
use super::ops;
use super::team::{self, Shared, Team};
use super::{fit, masked_softmax, Heads, KvShared};
use crate::config::Activation;
use crate::model::{Matrix, Model};
use std::ops::Range;
use std::sync::Mutex;

/// The most tokens a team pass takes; longer runs go through the prefill path (batched matmul).
pub(super) const TEAM_TOKENS: usize = 16;

/// Rows of a matrix handed out at once: whole row tiles of the matvec kernels.
const ROW_ALIGN: usize = 16;

/// One member's own buffers, reused across steps.
#[derive(Default)]
pub(super) struct MemberScratch {
    /// A normed copy of each token's residual stream (attention, feed-forward, output norms).
    h: Vec<f32>,
    /// A post-norm's normed output (`post_norms`).
    normed: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
}

/// The activations all members share during one step: `n` tokens, each token's vector after
/// the last (`x` is `n` × n_embd, `q` `n` × q_dim, ...).
pub(super) struct StepBuffers<'a> {
    pub x: Shared<'a, f32>,
    pub q: Shared<'a, f32>,
    pub k: Shared<'a, f32>,
    pub v: Shared<'a, f32>,
    pub attn: Shared<'a, f32>,
    pub o: Shared<'a, f32>,
    pub act: Shared<'a, f32>,
    /// The vocabulary's logits of tokens `first..n`, when the step wants them: `(first, rows)`.
    pub logits: Option<(usize, Shared<'a, f32>)>,
}

/// Runs `n` tokens (their embeddings already in `buffers.x`) at positions `pos..pos + n`
/// through every layer, and the output head for the tokens `buffers.logits` asks for.
pub(super) fn step(
    model: &Model,
    ropes: &[ops::RopeTable],
    kv: &KvShared,
    pos: usize,
    n: usize,
    buffers: &StepBuffers,
    members: &[Mutex<MemberScratch>],
) {
    team::run(|team| {
        let mut member = members[team.index()]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: every write below is to this member's share (rows from `Team::share`, kv heads
        // from `Team::share`), and every read of another member's share follows a `sync`.
        unsafe { member_step(team, model, ropes, kv, pos, n, buffers, &mut member) }
    });
}

#[allow(clippy::too_many_arguments)]
unsafe fn member_step(
    team: &Team,
    model: &Model,
    ropes: &[ops::RopeTable],
    kv: &KvShared,
    pos: usize,
    n: usize,
    b: &StepBuffers,
    m: &mut MemberScratch,
) {
    let c = &model.config;
    let w = &model.weights;
    let (e, qd, kvd, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
    let eps = c.rms_eps;
    let group = c.n_heads / c.n_kv_heads;
    for (l, (lw, layer)) in w.layers.iter().zip(&c.layers).enumerate() {
        let h = fit(&mut m.h, n * e);
        ops::rms_norm(b.x.all(), &lw.attn_norm, eps, h);
        let rows = team.share(qd + 2 * kvd, ROW_ALIGN);
        matvec_shared(model, &lw.wq, h, n, &b.q, &rows, 0);
        matvec_shared(model, &lw.wk, h, n, &b.k, &rows, qd);
        matvec_shared(model, &lw.wv, h, n, &b.v, &rows, qd + kvd);
        team.sync();

        let heads = Heads::of(c, layer.window);
        let rope = &ropes[layer.rope];
        for g in team.share(c.n_kv_heads, 1) {
            // Every token's key and value first: token t attends to positions up to pos + t.
            for t in 0..n {
                let qs = t * qd + g * group * hd..t * qd + (g + 1) * group * hd;
                let ks = t * kvd + g * hd..t * kvd + (g + 1) * hd;
                let (q, k, v) = (
                    b.q.part_mut(qs.clone()),
                    b.k.part_mut(ks.clone()),
                    b.v.part_mut(ks.clone()),
                );
                let (qb, kb) = (qs.start - t * qd, ks.start - t * kvd);
                for (bias, y, from) in [
                    (&lw.bq, &mut *q, qb),
                    (&lw.bk, &mut *k, kb),
                    (&lw.bv, &mut *v, kb),
                ] {
                    if let Some(bias) = bias {
                        let len = y.len();
                        ops::add_in_place(y, &bias[from..from + len]);
                    }
                }
                if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                    ops::rms_norm_in_place(q, qn, eps);
                    ops::rms_norm_in_place(k, kn, eps);
                }
                rope.apply(q, hd, pos + t);
                rope.apply(k, hd, pos + t);
                kv.store(l, g, pos + t, k, v);
            }
            for t in 0..n {
                let qs = t * qd + g * group * hd..t * qd + (g + 1) * group * hd;
                let q = b.q.part(qs.clone());
                let out = b.attn.part_mut(qs);
                kv_head_attention(heads, kv, l, g, q, pos + t, out, &mut m.scores);
            }
        }
        team.sync();

        project_residual(
            team,
            model,
            &lw.wo,
            b.attn.all(),
            n,
            b,
            lw.post_attn_norm.as_deref(),
            eps,
            &mut m.normed,
        );

        let h = fit(&mut m.h, n * e);
        ops::rms_norm(b.x.all(), &lw.ffn_norm, eps, h);
        let rows = team.share(ff, ROW_ALIGN);
        let len = rows.len();
        let gate = fit(&mut m.gate, n * len);
        let up = fit(&mut m.up, n * len);
        matvec(model, &lw.w_gate, h, n, rows.clone(), gate);
        matvec(model, &lw.w_up, h, n, rows.clone(), up);
        for t in 0..n {
            let act = b.act.part_mut(t * ff + rows.start..t * ff + rows.end);
            let (gate, up) = (
                &m.gate[t * len..(t + 1) * len],
                &m.up[t * len..(t + 1) * len],
            );
            match c.block.activation {
                Activation::Silu => ops::silu_mul(gate, up, act),
                Activation::GeluTanh => ops::gelu_tanh_mul(gate, up, act),
            }
        }
        team.sync();

        project_residual(
            team,
            model,
            &lw.w_down,
            b.act.all(),
            n,
            b,
            lw.post_ffn_norm.as_deref(),
            eps,
            &mut m.normed,
        );
    }
    if let Some((first, logits)) = &b.logits {
        let wanted = n - first;
        let h = fit(&mut m.h, wanted * e);
        ops::rms_norm(&b.x.all()[first * e..], &w.output_norm, eps, h);
        let rows = team.share(c.vocab_size, ROW_ALIGN);
        matvec_shared(model, &w.output, h, wanted, logits, &rows, 0);
    }
}

/// The rows of `m` in `share`, a member's share of a row space in which `m`'s rows start at
/// `offset` (several matrices share one row space, e.g. q|k|v).
fn rows_of(m: &Matrix, share: &Range<usize>, offset: usize) -> Range<usize> {
    let (lo, hi) = (share.start.max(offset), share.end.min(offset + m.rows));
    if lo >= hi {
        return 0..0;
    }
    lo - offset..hi - offset
}

/// `y[t * rows.len() + i] = row rows.start + i of m · x[t]` for the `n` rows `x[t]` of `x`:
/// each token's sums exactly as `lean_quant::matvec_serial` makes them alone.
fn matvec(model: &Model, m: &Matrix, x: &[f32], n: usize, rows: Range<usize>, y: &mut [f32]) {
    if rows.is_empty() {
        return;
    }
    if n == 1 {
        // Plain decoding: no list to allocate.
        return matvec_columns(
            model,
            m,
            &x[..m.cols],
            rows.clone(),
            &mut [&mut y[..rows.len()]],
        );
    }
    let mut ys: Vec<&mut [f32]> = y[..n * rows.len()].chunks_exact_mut(rows.len()).collect();
    matvec_columns(model, m, &x[..n * m.cols], rows, &mut ys);
}

/// Rows `rows` of `m` times each of the `ys.len()` activations in `x`, into `ys`.
fn matvec_columns(model: &Model, m: &Matrix, x: &[f32], rows: Range<usize>, ys: &mut [&mut [f32]]) {
    let row_bytes = m.len / m.rows;
    let data = &model.data(m)[rows.start * row_bytes..rows.end * row_bytes];
    if let [y] = ys {
        lean_quant::matvec_serial(m.ty, data, rows.len(), m.cols, x, y);
    } else {
        lean_quant::matvec_columns(m.ty, data, rows.len(), m.cols, x, ys);
    }
}

/// `out[t * m.rows + r] = row r of m · x[t]` for m's rows in `share` and each of the `n` rows
/// of `x`.
///
/// # Safety
/// As `Shared::part_mut` for those rows of `out`.
unsafe fn matvec_shared(
    model: &Model,
    m: &Matrix,
    x: &[f32],
    n: usize,
    out: &Shared<f32>,
    share: &Range<usize>,
    offset: usize,
) {
    let rows = rows_of(m, share, offset);
    if rows.is_empty() {
        return;
    }
    if n == 1 {
        let y = out.part_mut(rows.clone());
        return matvec_columns(model, m, &x[..m.cols], rows, &mut [y]);
    }
    let mut ys: Vec<&mut [f32]> = (0..n)
        .map(|t| out.part_mut(t * m.rows + rows.start..t * m.rows + rows.end))
        .collect();
    matvec_columns(model, m, &x[..n * m.cols], rows, &mut ys);
}

/// o = input · mᵀ on this member's rows for each token, then x += o there (or x +=
/// rms_norm(o)·w with a post-norm, which needs all of o first), then a sync: the next norm reads
/// all of x.
///
/// # Safety
/// `input` was complete (synced) before the call.
#[allow(clippy::too_many_arguments)]
unsafe fn project_residual(
    team: &Team,
    model: &Model,
    m: &Matrix,
    input: &[f32],
    n: usize,
    b: &StepBuffers,
    post_norm: Option<&[f32]>,
    eps: f32,
    normed: &mut Vec<f32>,
) {
    let e = m.rows;
    let rows = &team.share(e, ROW_ALIGN);
    matvec_shared(model, m, input, n, &b.o, rows, 0);
    if let Some(weight) = post_norm {
        team.sync();
        let normed = fit(normed, n * e);
        ops::rms_norm(b.o.all(), weight, eps, normed);
    }
    for t in 0..n {
        let span = t * e + rows.start..t * e + rows.end;
        let add = match post_norm {
            None => b.o.part(span.clone()),
            Some(_) => &normed[span.clone()],
        };
        ops::add_in_place(b.x.part_mut(span), add);
    }
    team.sync();
}

/// Attention of one token for the query heads that share kv head `g`: their queries times its
/// keys, then their probabilities times its values, each one `vecmat` that loads every key and
/// value row once for all of them. A sliding window reads only its positions (from the start of
/// the key block holding the first).
///
/// # Safety
/// As `KvShared::keys_t`: kv head `g` of `layer` is this member's.
#[allow(clippy::too_many_arguments)]
unsafe fn kv_head_attention(
    a: Heads,
    kv: &KvShared,
    layer: usize,
    g: usize,
    q: &[f32],
    pos: usize,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let group = a.n_heads / a.n_kv_heads;
    let (first, end) = (a.first_visible(pos), pos + 1);
    let from = super::first_block(first);
    let span = end - from;
    let scores = fit(scores, group * span);
    lean_quant::vecmat(q, group, kv.keys_t(layer, g, from, end), scores);
    for row in scores.chunks_exact_mut(span) {
        masked_softmax(row, first - from..span, a.scale);
    }
    lean_quant::vecmat(scores, group, kv.values(layer, g, from, end), out);
}
