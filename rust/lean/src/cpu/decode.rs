//! One generated token through the model, as a team program (`team.rs`): every member runs
//! this code, takes its share of each stage, and syncs where a stage needs all of the last.
//!
//! Per layer: attention norm (every member, into its own buffer) → q|k|v rows → sync → per kv
//! head: biases, q/k norms, rope, cache store, attention → sync → output rows + residual → sync
//! → feed-forward norm (every member) → gate/up rows and their activation → sync → down rows +
//! residual → sync. Five barriers a layer (two more with post-norms), no fork-join.
use super::ops;
use super::team::{self, Shared, Team};
use super::{fit, masked_softmax, Heads, KvShared};
use crate::config::Activation;
use crate::model::{Matrix, Model};
use std::ops::Range;
use std::sync::Mutex;

/// Rows of a matrix handed out at once: whole row tiles of the matvec kernels.
const ROW_ALIGN: usize = 16;

/// One member's own buffers, reused across tokens.
#[derive(Default)]
pub(super) struct MemberScratch {
    /// A normed copy of the residual stream (attention, feed-forward, output norms).
    h: Vec<f32>,
    /// A post-norm's normed output (`post_norms`).
    normed: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
}

/// The activations all members share during one step.
pub(super) struct StepBuffers<'a> {
    pub x: Shared<'a, f32>,
    pub q: Shared<'a, f32>,
    pub k: Shared<'a, f32>,
    pub v: Shared<'a, f32>,
    pub attn: Shared<'a, f32>,
    pub o: Shared<'a, f32>,
    pub act: Shared<'a, f32>,
    /// The vocabulary's logits, when the step wants them.
    pub logits: Option<Shared<'a, f32>>,
}

/// Runs one token (its embedding already in `buffers.x`) at position `pos` through every layer,
/// and the output head when `buffers.logits` is there.
pub(super) fn step(
    model: &Model,
    ropes: &[ops::RopeTable],
    kv: &KvShared,
    pos: usize,
    buffers: &StepBuffers,
    members: &[Mutex<MemberScratch>],
) {
    team::run(|team| {
        let mut member = members[team.index()]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: every write below is to this member's share (rows from `Team::share`, kv heads
        // from `Team::share`), and every read of another member's share follows a `sync`.
        unsafe { member_step(team, model, ropes, kv, pos, buffers, &mut member) }
    });
}

unsafe fn member_step(
    team: &Team,
    model: &Model,
    ropes: &[ops::RopeTable],
    kv: &KvShared,
    pos: usize,
    b: &StepBuffers,
    m: &mut MemberScratch,
) {
    let c = &model.config;
    let w = &model.weights;
    let (e, qd, kvd, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
    let eps = c.rms_eps;
    let group = c.n_heads / c.n_kv_heads;
    for (l, (lw, layer)) in w.layers.iter().zip(&c.layers).enumerate() {
        let h = fit(&mut m.h, e);
        ops::rms_norm(b.x.all(), &lw.attn_norm, eps, h);
        let rows = team.share(qd + 2 * kvd, ROW_ALIGN);
        matvec_shared(model, &lw.wq, h, &b.q, &rows, 0);
        matvec_shared(model, &lw.wk, h, &b.k, &rows, qd);
        matvec_shared(model, &lw.wv, h, &b.v, &rows, qd + kvd);
        team.sync();

        let heads = Heads::of(c, layer.window);
        let rope = &ropes[layer.rope];
        for g in team.share(c.n_kv_heads, 1) {
            let qs = g * group * hd..(g + 1) * group * hd;
            let ks = g * hd..(g + 1) * hd;
            let (q, k, v) = (
                b.q.part_mut(qs.clone()),
                b.k.part_mut(ks.clone()),
                b.v.part_mut(ks.clone()),
            );
            for (bias, y, range) in [
                (&lw.bq, &mut *q, &qs),
                (&lw.bk, &mut *k, &ks),
                (&lw.bv, &mut *v, &ks),
            ] {
                if let Some(bias) = bias {
                    ops::add_in_place(y, &bias[range.clone()]);
                }
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                ops::rms_norm_in_place(q, qn, eps);
                ops::rms_norm_in_place(k, kn, eps);
            }
            rope.apply(q, hd, pos);
            rope.apply(k, hd, pos);
            kv.store(l, g, pos, k, v);
            kv_head_attention(heads, kv, l, g, q, pos, b.attn.part_mut(qs), &mut m.scores);
        }
        team.sync();

        project_residual(
            team,
            model,
            &lw.wo,
            b.attn.all(),
            b,
            lw.post_attn_norm.as_deref(),
            eps,
            &mut m.normed,
        );

        let h = fit(&mut m.h, e);
        ops::rms_norm(b.x.all(), &lw.ffn_norm, eps, h);
        let rows = team.share(ff, ROW_ALIGN);
        let gate = fit(&mut m.gate, rows.len());
        let up = fit(&mut m.up, rows.len());
        matvec(model, &lw.w_gate, h, rows.clone(), gate);
        matvec(model, &lw.w_up, h, rows.clone(), up);
        let act = b.act.part_mut(rows);
        match c.block.activation {
            Activation::Silu => ops::silu_mul(&m.gate, &m.up, act),
            Activation::GeluTanh => ops::gelu_tanh_mul(&m.gate, &m.up, act),
        }
        team.sync();

        project_residual(
            team,
            model,
            &lw.w_down,
            b.act.all(),
            b,
            lw.post_ffn_norm.as_deref(),
            eps,
            &mut m.normed,
        );
    }
    if let Some(logits) = &b.logits {
        let h = fit(&mut m.h, e);
        ops::rms_norm(b.x.all(), &w.output_norm, eps, h);
        let rows = team.share(c.vocab_size, ROW_ALIGN);
        matvec_shared(model, &w.output, h, logits, &rows, 0);
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

/// `y = rows of m · x`.
fn matvec(model: &Model, m: &Matrix, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    if rows.is_empty() {
        return;
    }
    let row_bytes = m.len / m.rows;
    let data = &model.data(m)[rows.start * row_bytes..rows.end * row_bytes];
    lean_quant::matvec_serial(m.ty, data, rows.len(), m.cols, x, y);
}

/// `out[r] = row r of m · x` for m's rows in `share`.
///
/// # Safety
/// As `Shared::part_mut` for those rows of `out`.
unsafe fn matvec_shared(
    model: &Model,
    m: &Matrix,
    x: &[f32],
    out: &Shared<f32>,
    share: &Range<usize>,
    offset: usize,
) {
    let rows = rows_of(m, share, offset);
    matvec(model, m, x, rows.clone(), out.part_mut(rows));
}

/// o = input · mᵀ on this member's rows, then x += o there (or x += rms_norm(o)·w with a
/// post-norm, which needs all of o first), then a sync: the next norm reads all of x.
///
/// # Safety
/// `input` was complete (synced) before the call.
#[allow(clippy::too_many_arguments)]
unsafe fn project_residual(
    team: &Team,
    model: &Model,
    m: &Matrix,
    input: &[f32],
    b: &StepBuffers,
    post_norm: Option<&[f32]>,
    eps: f32,
    normed: &mut Vec<f32>,
) {
    let rows = &team.share(b.x.len(), ROW_ALIGN);
    matvec_shared(model, m, input, &b.o, rows, 0);
    match post_norm {
        None => ops::add_in_place(b.x.part_mut(rows.clone()), b.o.part(rows.clone())),
        Some(weight) => {
            team.sync();
            let normed = fit(normed, b.o.len());
            ops::rms_norm(b.o.all(), weight, eps, normed);
            ops::add_in_place(b.x.part_mut(rows.clone()), &normed[rows.clone()]);
        }
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
