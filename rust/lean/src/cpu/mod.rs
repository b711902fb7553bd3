//! The CPU backend: runs the transformer with lean-quant's SIMD kernels and rayon threads.
//!
//! A prompt is processed as a batch (matrix-matrix products over all its tokens, in chunks of
//! `PREFILL_CHUNK`). A generated token, and any run of up to `decode::TEAM_TOKENS` (speculative
//! decoding's verification passes, short chat turns), goes through the decode team's
//! matrix-vector products instead, each token's bits exactly as if it ran alone.
mod decode;
pub mod ops;
pub mod team;

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

/// The cache as the members of a decode team use it: each stores and reads only its own kv
/// heads (`decode.rs`).
struct KvShared<'a> {
    capacity: usize,
    n_kv_heads: usize,
    head_dim: usize,
    k: team::Shared<'a, f32>,
    v: team::Shared<'a, f32>,
}

impl KvCache {
    fn shared(&mut self) -> KvShared<'_> {
        KvShared {
            capacity: self.capacity,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            k: team::Shared::new(&mut self.k),
            v: team::Shared::new(&mut self.v),
        }
    }
}

impl KvShared<'_> {
    /// The elements of kv head `g` of `layer`, in either array.
    fn head(&self, layer: usize, g: usize) -> std::ops::Range<usize> {
        let len = KvCache::padded(self.capacity) * self.head_dim;
        let start = (layer * self.n_kv_heads + g) * len;
        start..start + len
    }

    /// `KvCache::store` for kv head `g` alone.
    ///
    /// # Safety
    /// No other member touches kv head `g` of `layer` during the call.
    unsafe fn store(&self, layer: usize, g: usize, pos: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let keys = self.k.part_mut(self.head(layer, g));
        let key_block = pos / COLUMN_BLOCK * COLUMN_BLOCK * hd + pos % COLUMN_BLOCK;
        for (d, &kd) in k.iter().enumerate() {
            keys[key_block + d * COLUMN_BLOCK] = kd;
        }
        self.v.part_mut(self.head(layer, g))[pos * hd..(pos + 1) * hd].copy_from_slice(v);
    }

    /// `KvCache::keys_t` for kv head `g`.
    ///
    /// # Safety
    /// No member writes kv head `g` of `layer` while the view lives.
    unsafe fn keys_t(&self, layer: usize, g: usize, from: usize, to: usize) -> F32Matrix<'_> {
        let keys = &self.k.part(self.head(layer, g))[from * self.head_dim..];
        F32Matrix::column_blocked(keys, self.head_dim, to - from, self.head_dim)
    }

    /// `KvCache::values` for kv head `g`.
    ///
    /// # Safety
    /// As `keys_t`.
    unsafe fn values(&self, layer: usize, g: usize, from: usize, to: usize) -> F32Matrix<'_> {
        let hd = self.head_dim;
        let values = &self.v.part(self.head(layer, g))[from * hd..to * hd];
        F32Matrix::row_major(values, to - from, hd, hd)
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
    /// One per member of a decode team.
    members: Vec<std::sync::Mutex<decode::MemberScratch>>,
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
            embed(model, tok, &mut x[t * e..(t + 1) * e]);
        }
        let logits_from = match want {
            Logits::All => Some(0),
            Logits::Last if is_last_chunk => Some(n - 1),
            Logits::Last => None,
        };
        if n <= decode::TEAM_TOKENS {
            return self.team_step(model, n, logits_from, on_logits);
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
        let Some(first) = logits_from else {
            return;
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

    /// A few tokens (their embeddings in `scratch.x`) through the model by the decode team:
    /// the bits each would get alone, in one pass that reads the weights once per member.
    /// Logits for the tokens from `logits_from` on.
    fn team_step(
        &mut self,
        model: &Model,
        n: usize,
        logits_from: Option<usize>,
        mut on_logits: impl FnMut(usize, &[f32]),
    ) {
        let c = &model.config;
        let s = &mut self.scratch;
        #[cfg(feature = "threads")]
        let members = rayon::current_num_threads();
        #[cfg(not(feature = "threads"))]
        let members = 1;
        if s.members.len() < members {
            s.members.resize_with(members, Default::default);
        }
        let vocab = c.vocab_size;
        let buffers = decode::StepBuffers {
            x: team::Shared::new(fit(&mut s.x, n * c.n_embd)),
            q: team::Shared::new(fit(&mut s.q, n * c.q_dim())),
            k: team::Shared::new(fit(&mut s.k, n * c.kv_dim())),
            v: team::Shared::new(fit(&mut s.v, n * c.kv_dim())),
            attn: team::Shared::new(fit(&mut s.attn, n * c.q_dim())),
            o: team::Shared::new(fit(&mut s.o, n * c.n_embd)),
            act: team::Shared::new(fit(&mut s.act, n * c.n_ff)),
            logits: logits_from.map(|first| {
                (
                    first,
                    team::Shared::new(fit(&mut s.last, (n - first) * vocab)),
                )
            }),
        };
        let kv = self.kv.shared();
        decode::step(model, &self.ropes, &kv, self.pos, n, &buffers, &s.members);
        self.pos += n;
        if let Some(first) = logits_from {
            for (r, row) in s.last[..(n - first) * vocab]
                .chunks_exact(vocab)
                .enumerate()
            {
                on_logits(first + r, row);
            }
        }
    }
}

/// The embedding of `token`, scaled where the block scales it.
fn embed(model: &Model, token: u32, x: &mut [f32]) {
    let w = &model.weights;
    let row = w
        .token_embd
        .ty
        .row_bytes(x.len())
        .expect("validated at load");
    let data = &model.data(&w.token_embd)[token as usize * row..(token as usize + 1) * row];
    lean_quant::dequantize_row(w.token_embd.ty, data, x);
    if let Some(scale) = model.config.block.embedding_scale {
        x.iter_mut().for_each(|v| *v *= scale);
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

/// Several products of the same input (q/k/v, gate/up).
fn linears(model: &Model, outputs: &mut [(&Matrix, &mut [f32])], x: &[f32], n: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelBytes;
    use crate::synthetic::{reduced_gguf, SyntheticShape, SyntheticWeights};

    /// Every row of `tokens`' logits after `prompt`, run as one pass.
    fn pass(model: &Model, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
        let mut session = CpuSession::new(model, 640);
        session
            .forward(model, prompt, Logits::Last, |_, _| {})
            .unwrap();
        let mut rows = Vec::new();
        session
            .forward(model, tokens, Logits::All, |_, l| rows.push(l.to_vec()))
            .unwrap();
        assert_eq!(session.position(), prompt.len() + tokens.len());
        rows
    }

    /// The same, one token at a time (plain decoding).
    fn one_by_one(model: &Model, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
        let mut session = CpuSession::new(model, 640);
        session
            .forward(model, prompt, Logits::Last, |_, _| {})
            .unwrap();
        let mut rows = Vec::new();
        for &t in tokens {
            session
                .forward(model, &[t], Logits::Last, |_, l| rows.push(l.to_vec()))
                .unwrap();
        }
        rows
    }

    /// A verification pass must leave the bits plain decoding would, or speculative greedy
    /// output could differ from plain greedy output on a near-tie. Shapes with biases (Qwen2.5),
    /// q/k norms (Qwen3), post-norms and a sliding window (Gemma 3, crossed by the run), GQA
    /// groups of 3 (SmolLM2-360M); runs of 2, 5 and `TEAM_TOKENS` tokens; Q4_0 and Q8_0.
    #[test]
    fn a_team_pass_of_several_tokens_equals_single_steps_bit_for_bit() {
        for shape in [
            SyntheticShape::SmolLm2_360M,
            SyntheticShape::Qwen2_5_0_5B,
            SyntheticShape::Qwen3_1_7B,
            SyntheticShape::Gemma3_1B,
        ] {
            for weights in SyntheticWeights::ALL {
                let bytes = reduced_gguf(shape, weights, 2, 3).unwrap();
                let model = Model::load(ModelBytes::Owned(bytes)).unwrap();
                let vocab = model.config.vocab_size as u32;
                let ids = |n: usize, salt: u32| -> Vec<u32> {
                    (0..n as u32)
                        .map(|i| (i * 7919 + salt * 104_729) % vocab)
                        .collect()
                };
                // Gemma 3's window (512): the runs cross its edge.
                let window = model.config.layers.iter().filter_map(|l| l.window).min();
                let prompt_len = window.map_or(37, |w| w - 3);
                let prompt = ids(prompt_len, 1);
                for n in [2, 5, decode::TEAM_TOKENS] {
                    let tokens = ids(n, 2);
                    let together = pass(&model, &prompt, &tokens);
                    let alone = one_by_one(&model, &prompt, &tokens);
                    assert_eq!(together.len(), n);
                    for (t, (a, b)) in together.iter().zip(&alone).enumerate() {
                        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(
                            same,
                            "{} {} n={n}: token {t} differs",
                            shape.name(),
                            weights.name()
                        );
                    }
                }
            }
        }
    }
}
