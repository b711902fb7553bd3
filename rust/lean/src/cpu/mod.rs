//! The CPU backend: runs the transformer with lean-quant's SIMD kernels and rayon threads.
//!
//! A prompt is processed as a batch (matrix-matrix products over all its tokens, in chunks of
//! `PREFILL_CHUNK`), a generated token alone (matrix-vector products).
pub mod ops;

use crate::config::{Activation, ModelConfig};
use crate::error::{LeanError, Result};
use crate::model::{Matrix, Model};
pub use crate::session::Logits;
use crate::session::Session;
use lean_quant::{F32Matrix, COLUMN_BLOCK};
use ops::RopeTable;

/// Tokens per prefill batch: bounds the scratch memory while keeping the matmuls large.
pub const PREFILL_CHUNK: usize = 256;

/// Keys and values of every layer for `capacity` positions, laid out for `lean_quant::vecmat`
/// (scores = queries · keysᵀ, output = probabilities · values):
/// keys transposed and column-blocked, `[layer][kv_head][position / B][head_dim][position % B]`
/// with B = `COLUMN_BLOCK`, so that the scores of a run of positions read contiguous memory;
/// values row-major, `[layer][kv_head][position][head_dim]`. Both products then sum over plain
/// rows, with no horizontal reductions.
pub struct KvCache {
    capacity: usize,
    n_kv_heads: usize,
    head_dim: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl KvCache {
    pub fn new(n_layers: usize, capacity: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        // vec![0.0; n] is a zeroed allocation: pages are committed as positions fill.
        let n = n_layers * n_kv_heads * Self::padded(capacity) * head_dim;
        KvCache {
            capacity,
            n_kv_heads,
            head_dim,
            k: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Positions stored per head: whole key blocks.
    fn padded(capacity: usize) -> usize {
        capacity.div_ceil(COLUMN_BLOCK) * COLUMN_BLOCK
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }

    fn head_start(&self, layer: usize, kv_head: usize) -> usize {
        (layer * self.n_kv_heads + kv_head) * Self::padded(self.capacity) * self.head_dim
    }

    /// Keys of one head at positions `from..to`, transposed: `head_dim` x `to - from`. `from`
    /// is a multiple of `COLUMN_BLOCK` (`Window::first_block`).
    fn keys_t(&self, layer: usize, kv_head: usize, from: usize, to: usize) -> F32Matrix<'_> {
        debug_assert!(from.is_multiple_of(COLUMN_BLOCK));
        let s = self.head_start(layer, kv_head);
        let data =
            &self.k[s + from * self.head_dim..s + Self::padded(self.capacity) * self.head_dim];
        F32Matrix::column_blocked(data, self.head_dim, to - from, self.head_dim)
    }

    /// Values of one head at positions `from..to`: `to - from` x `head_dim`.
    fn values(&self, layer: usize, kv_head: usize, from: usize, to: usize) -> F32Matrix<'_> {
        let s = self.head_start(layer, kv_head);
        let data = &self.v[s + from * self.head_dim..s + to * self.head_dim];
        F32Matrix::row_major(data, to - from, self.head_dim, self.head_dim)
    }

    /// Stores one token's keys and values (`n_kv_heads × head_dim` each) at `pos`.
    fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let key_block = pos / COLUMN_BLOCK * COLUMN_BLOCK * hd + pos % COLUMN_BLOCK;
        for g in 0..self.n_kv_heads {
            let base = self.head_start(layer, g);
            for d in 0..hd {
                self.k[base + key_block + d * COLUMN_BLOCK] = k[g * hd + d];
            }
            self.v[base + pos * hd..base + (pos + 1) * hd]
                .copy_from_slice(&v[g * hd..(g + 1) * hd]);
        }
    }
}

/// Activations for a batch of up to `n` tokens, reused across calls (no allocation per token).
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    last: Vec<f32>,
    attention: AttentionScratch,
}

fn fit(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}

/// One conversation's state on the CPU: KV cache, position, scratch.
pub struct CpuSession {
    kv: KvCache,
    /// One per `ModelConfig::ropes`.
    ropes: Vec<RopeTable>,
    pos: usize,
    scratch: Scratch,
}

impl CpuSession {
    pub fn new(model: &Model, context_length: usize) -> Self {
        let c = &model.config;
        CpuSession {
            kv: KvCache::new(c.n_layers, context_length, c.n_kv_heads, c.head_dim),
            ropes: c
                .ropes
                .iter()
                .map(|r| RopeTable::new(r, context_length))
                .collect(),
            pos: 0,
            scratch: Scratch::default(),
        }
    }

    /// Tokens in the cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn context_length(&self) -> usize {
        self.kv.capacity()
    }

    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// Forgets cached positions from `pos` on (e.g. 0 for a new conversation).
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// Runs `tokens` through the model after the cached positions. Calls `on_logits(i, logits)`
    /// for the last token (or every token with `Logits::All`), i = index in `tokens`.
    pub fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        on_logits: impl FnMut(usize, &[f32]) + Send,
    ) -> Result<()> {
        if !model.has_weight_data() {
            return Err(LeanError::InvalidArgument(
                "this model's weight matrices were streamed to a GPU, not kept in memory: the \
                 CPU backend cannot run it"
                    .into(),
            ));
        }
        // The whole pass runs on a pool thread: the caller's thread would otherwise compete for
        // the cores with the pool's spinning workers between parallel kernels.
        #[cfg(feature = "threads")]
        return rayon::scope(|_| self.forward_on_this_thread(model, tokens, want, on_logits));
        #[cfg(not(feature = "threads"))]
        return self.forward_on_this_thread(model, tokens, want, on_logits);
    }

    fn forward_on_this_thread(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        mut on_logits: impl FnMut(usize, &[f32]),
    ) -> Result<()> {
        let vocab = model.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(LeanError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({vocab})"
            )));
        }
        if self.pos + tokens.len() > self.kv.capacity() {
            return Err(LeanError::PromptTooLong {
                prompt_tokens: self.pos + tokens.len(),
                context_length: self.kv.capacity(),
            });
        }
        let mut done = 0;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let is_last_chunk = done + chunk.len() == tokens.len();
            self.forward_chunk(model, chunk, want, is_last_chunk, |i, l| {
                on_logits(done + i, l)
            });
            done += chunk.len();
        }
        Ok(())
    }

    /// Runs the description in `model.config` (block, layers, ropes) over one chunk.
    fn forward_chunk(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        is_last_chunk: bool,
        mut on_logits: impl FnMut(usize, &[f32]),
    ) {
        let c = &model.config;
        let b = &c.block;
        let w = &model.weights;
        let n = tokens.len();
        let (e, qd, kvd, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
        let pos0 = self.pos;
        let s = &mut self.scratch;

        let x = fit(&mut s.x, n * e);
        for (t, &tok) in tokens.iter().enumerate() {
            let row = w.token_embd.ty.row_bytes(e).expect("validated at load");
            let data = &model.data(&w.token_embd)[tok as usize * row..(tok as usize + 1) * row];
            let x = &mut x[t * e..(t + 1) * e];
            lean_quant::dequantize_row(w.token_embd.ty, data, x);
            if let Some(scale) = b.embedding_scale {
                x.iter_mut().for_each(|v| *v *= scale);
            }
        }

        for (l, (lw, layer)) in w.layers.iter().zip(&c.layers).enumerate() {
            let h = fit(&mut s.h, n * e);
            ops::rms_norm(&s.x, &lw.attn_norm, c.rms_eps, h);
            let q = fit(&mut s.q, n * qd);
            let k = fit(&mut s.k, n * kvd);
            let v = fit(&mut s.v, n * kvd);
            linears(
                model,
                &mut [(&lw.wq, &mut *q), (&lw.wk, &mut *k), (&lw.wv, &mut *v)],
                h,
                n,
            );
            for (b, y) in [(&lw.bq, &mut *q), (&lw.bk, &mut *k), (&lw.bv, &mut *v)] {
                if let Some(b) = b {
                    ops::add_bias(y, b);
                }
            }
            // Per-head norms: rows of head_dim.
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                ops::rms_norm_in_place(q, qn, c.rms_eps);
                ops::rms_norm_in_place(k, kn, c.rms_eps);
            }
            let rope = &self.ropes[layer.rope];
            for t in 0..n {
                rope.apply(&mut q[t * qd..(t + 1) * qd], hd, pos0 + t);
                rope.apply(&mut k[t * kvd..(t + 1) * kvd], hd, pos0 + t);
                self.kv.store(
                    l,
                    pos0 + t,
                    &k[t * kvd..(t + 1) * kvd],
                    &v[t * kvd..(t + 1) * kvd],
                );
            }
            let attn = fit(&mut s.attn, n * qd);
            let heads = Heads::of(c, layer.window);
            attention(heads, &self.kv, l, q, pos0, n, attn, &mut s.attention);
            let o = fit(&mut s.o, n * e);
            linear(model, &lw.wo, attn, n, o);
            residual_add(
                &mut s.x,
                o,
                lw.post_attn_norm.as_deref(),
                c.rms_eps,
                &mut s.h,
            );

            let h = fit(&mut s.h, n * e);
            ops::rms_norm(&s.x, &lw.ffn_norm, c.rms_eps, h);
            let gate = fit(&mut s.gate, n * ff);
            let up = fit(&mut s.up, n * ff);
            linears(
                model,
                &mut [(&lw.w_gate, &mut *gate), (&lw.w_up, &mut *up)],
                h,
                n,
            );
            let act = fit(&mut s.act, n * ff);
            match b.activation {
                Activation::Silu => ops::silu_mul(gate, up, act),
                Activation::GeluTanh => ops::gelu_tanh_mul(gate, up, act),
            }
            let o = fit(&mut s.o, n * e);
            linear(model, &lw.w_down, act, n, o);
            residual_add(
                &mut s.x,
                o,
                lw.post_ffn_norm.as_deref(),
                c.rms_eps,
                &mut s.h,
            );
        }
        self.pos += n;

        // Logits only for the rows that need them.
        let first = match want {
            Logits::All => 0,
            Logits::Last if is_last_chunk => n - 1,
            Logits::Last => return,
        };
        let rows = n - first;
        let h = fit(&mut s.h, rows * e);
        ops::rms_norm(&s.x[first * e..], &w.output_norm, c.rms_eps, h);
        let vocab = c.vocab_size;
        let logits = fit(&mut s.last, rows * vocab);
        linear(model, &w.output, h, rows, logits);
        for r in 0..rows {
            on_logits(first + r, &logits[r * vocab..(r + 1) * vocab]);
        }
    }
}

/// x += y, or x += rms_norm(y) · weight where the block norms its outputs (`post_norms`).
fn residual_add(x: &mut [f32], y: &[f32], post_norm: Option<&[f32]>, eps: f32, h: &mut Vec<f32>) {
    match post_norm {
        Some(weight) => {
            let h = fit(h, y.len());
            ops::rms_norm(y, weight, eps, h);
            ops::add_in_place(x, h);
        }
        None => ops::add_in_place(x, y),
    }
}

impl Session for CpuSession {
    fn describe(&self) -> String {
        #[cfg(feature = "threads")]
        let threads = rayon::current_num_threads();
        #[cfg(not(feature = "threads"))]
        let threads = 1;
        let s = if threads == 1 { "" } else { "s" };
        format!("cpu ({}, {threads} thread{s})", lean_quant::isa())
    }
    fn context_length(&self) -> usize {
        CpuSession::context_length(self)
    }
    fn position(&self) -> usize {
        CpuSession::position(self)
    }
    fn kv_bytes(&self) -> usize {
        CpuSession::kv_bytes(self)
    }
    fn truncate(&mut self, pos: usize) {
        CpuSession::truncate(self, pos)
    }
    fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        on_logits: &mut (dyn FnMut(usize, &[f32]) + Send),
    ) -> Result<()> {
        CpuSession::forward(self, model, tokens, want, on_logits)
    }
}

/// y = x · Wᵀ for `n` rows of x: matrix-vector for one token, batched matmul for several.
fn linear(model: &Model, m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    let data = model.data(m);
    if n == 1 {
        lean_quant::matvec(m.ty, data, m.rows, m.cols, x, y);
    } else {
        lean_quant::matmul(m.ty, data, m.rows, m.cols, x, n, y);
    }
}

/// Several products of the same input (q/k/v, gate/up). For one token they run as one parallel
/// region over all their rows: a decode step of a small model is short enough that every extra
/// fork-join (waking the pool) shows.
fn linears(model: &Model, outputs: &mut [(&Matrix, &mut [f32])], x: &[f32], n: usize) {
    #[cfg(feature = "threads")]
    if n == 1 && rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        let macs: usize = outputs.iter().map(|(m, _)| m.rows * m.cols).sum();
        let task_macs = (macs / (rayon::current_num_threads() * 4)).max(1 << 16);
        let mut tasks: Vec<(&Matrix, usize, &mut [f32])> = Vec::new();
        for (m, y) in outputs.iter_mut() {
            let chunk = (task_macs / m.cols).max(1);
            for (i, ys) in y.chunks_mut(chunk).enumerate() {
                tasks.push((*m, i * chunk, ys));
            }
        }
        tasks.into_par_iter().for_each(|(m, first, ys)| {
            let row_bytes = m.len / m.rows;
            let data = &model.data(m)[first * row_bytes..(first + ys.len()) * row_bytes];
            lean_quant::matvec_serial(m.ty, data, ys.len(), m.cols, x, ys);
        });
        return;
    }
    for (m, y) in outputs.iter_mut() {
        linear(model, m, x, n, y);
    }
}

/// Query tokens per prefill attention task: its causal window ends at its last token, so
/// smaller blocks skip more masked positions; large enough that each task's key and value rows
/// serve many queries.
const ATTENTION_TOKEN_BLOCK: usize = 32;

/// Per-task buffers of `attention` (reused across layers and calls).
#[derive(Default)]
struct AttentionScratch {
    /// Head-major outputs of a prefill batch: `[head][token][head_dim]`.
    heads_out: Vec<f32>,
}

/// One attention task's buffers.
#[derive(Default)]
struct TaskScratch {
    q: Vec<f32>,
    scores: Vec<f32>,
}

/// The attention of one layer: head counts, the score scale and the sliding window.
#[derive(Copy, Clone)]
struct Heads {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scale: f32,
    window: Option<usize>,
}

impl Heads {
    fn of(c: &ModelConfig, window: Option<usize>) -> Self {
        Heads {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: c.block.attention_scale,
            window,
        }
    }

    fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// The first position a token at `pos` sees.
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// The key block holding `pos`'s first position: key views start at whole blocks, and the
/// positions before the window within it get probability 0.
fn first_block(pos: usize) -> usize {
    pos / COLUMN_BLOCK * COLUMN_BLOCK
}

/// `softmax(row[seen] · scale)` over the visible positions `seen` of a row of scores; the rest
/// of the row (masked) becomes 0, as HF's -inf mask makes it.
fn masked_softmax(row: &mut [f32], seen: std::ops::Range<usize>, scale: f32) {
    row[..seen.start].fill(0.0);
    row[seen.end..].fill(0.0);
    ops::softmax_scaled(&mut row[seen], scale);
}

/// Causal grouped-query attention for a batch of `n` tokens at positions pos0.. (token t sees
/// positions first_visible(pos0+t)..=pos0+t), as HF computes it:
/// softmax(q·kᵀ · scale) · v.
///
/// Both products run on `lean_quant::vecmat` against the cache's own layout (no copies of keys
/// or values). A prefill batch is cut into (head, block of tokens) tasks, each reading keys and
/// values only from its first token's window to its last token's position.
#[allow(clippy::too_many_arguments)]
fn attention(
    a: Heads,
    kv: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    n: usize,
    out: &mut [f32],
    s: &mut AttentionScratch,
) {
    if n == 1 {
        return decode_attention(a, kv, layer, q, pos0, out);
    }
    let (hd, qd) = (a.head_dim, a.q_dim());
    let group = a.n_heads / a.n_kv_heads;
    let heads_out = fit(&mut s.heads_out, a.n_heads * n * hd);
    // Task (head h, tokens t0..t0 + len): writes its block of `heads_out`.
    let block = ATTENTION_TOKEN_BLOCK * hd;
    let run = |(h, t0, o): (usize, usize, &mut [f32]), scratch: &mut TaskScratch| {
        let tokens = o.len() / hd;
        let end = pos0 + t0 + tokens;
        let from = first_block(a.first_visible(pos0 + t0));
        let g = h / group;
        let qh = fit(&mut scratch.q, tokens * hd);
        for (t, row) in qh.chunks_exact_mut(hd).enumerate() {
            row.copy_from_slice(&q[(t0 + t) * qd + h * hd..][..hd]);
        }
        let span = end - from;
        let scores = fit(&mut scratch.scores, tokens * span);
        lean_quant::vecmat(qh, tokens, kv.keys_t(layer, g, from, end), scores);
        for (t, row) in scores.chunks_exact_mut(span).enumerate() {
            let pos = pos0 + t0 + t;
            masked_softmax(row, a.first_visible(pos) - from..pos + 1 - from, a.scale);
        }
        lean_quant::vecmat(scores, tokens, kv.values(layer, g, from, end), o);
    };
    let tasks = heads_out
        .chunks_mut(n * hd)
        .enumerate()
        .flat_map(|(h, head)| {
            head.chunks_mut(block)
                .enumerate()
                .map(move |(b, o)| (h, b * ATTENTION_TOKEN_BLOCK, o))
        });
    #[cfg(feature = "threads")]
    {
        use rayon::prelude::*;
        tasks
            .collect::<Vec<_>>()
            .into_par_iter()
            .for_each_init(TaskScratch::default, |scratch, task| run(task, scratch));
    }
    #[cfg(not(feature = "threads"))]
    {
        let mut scratch = TaskScratch::default();
        tasks.for_each(|task| run(task, &mut scratch));
    }
    for (h, head) in heads_out.chunks_exact(n * hd).enumerate() {
        for (t, row) in head.chunks_exact(hd).enumerate() {
            out[t * qd + h * hd..][..hd].copy_from_slice(row);
        }
    }
}

/// Attention of one token (decode), per kv head (in parallel): the queries of the heads that
/// share it times its keys, then their probabilities times its values, each one `vecmat` that
/// loads every key and value row once for all those heads. A sliding window reads only its
/// positions (from the start of the key block holding the first).
fn decode_attention(a: Heads, kv: &KvCache, layer: usize, q: &[f32], pos0: usize, out: &mut [f32]) {
    let hd = a.head_dim;
    let group = a.n_heads / a.n_kv_heads;
    let (first, end) = (a.first_visible(pos0), pos0 + 1);
    let from = first_block(first);
    let span = end - from;
    let kv_head = |g: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let qg = &q[g * group * hd..(g + 1) * group * hd];
        let scores = fit(scores, group * span);
        lean_quant::vecmat(qg, group, kv.keys_t(layer, g, from, end), scores);
        for row in scores.chunks_exact_mut(span) {
            masked_softmax(row, first - from..span, a.scale);
        }
        lean_quant::vecmat(scores, group, kv.values(layer, g, from, end), o);
    };
    let out = &mut out[..a.q_dim()];
    #[cfg(feature = "threads")]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(group * hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (g, o)| kv_head(g, o, scores));
    }
    #[cfg(not(feature = "threads"))]
    {
        let mut scores = Vec::new();
        for (g, o) in out.chunks_mut(group * hd).enumerate() {
            kv_head(g, o, &mut scores);
        }
    }
}
