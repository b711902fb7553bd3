//! The CPU backend: runs the transformer with lean-quant's SIMD kernels and rayon threads.
//!
//! A prompt is processed as a batch (matrix-matrix products over all its tokens, in chunks of
//! `PREFILL_CHUNK`), a generated token alone (matrix-vector products).
pub mod ops;

use crate::error::{LeanError, Result};
use crate::model::{Matrix, Model};
pub use crate::session::Logits;
use crate::session::Session;
use ops::RopeTable;

/// Tokens per prefill batch: bounds the scratch memory while keeping the matmuls large.
pub const PREFILL_CHUNK: usize = 256;

/// Keys and values of every layer for `capacity` positions, laid out for the attention kernels:
/// keys as `[layer][kv_head][position][head_dim]` (one contiguous matrix of key rows per head),
/// values transposed as `[layer][kv_head][head_dim][position]` (one contiguous row per dimension),
/// so both products of attention are plain f32 matrix kernels.
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
        let n = n_layers * n_kv_heads * capacity * head_dim;
        KvCache {
            capacity,
            n_kv_heads,
            head_dim,
            k: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }

    fn head_len(&self) -> usize {
        self.capacity * self.head_dim
    }

    /// Keys of one head: `capacity` rows of `head_dim`.
    fn keys(&self, layer: usize, kv_head: usize) -> &[f32] {
        let s = (layer * self.n_kv_heads + kv_head) * self.head_len();
        &self.k[s..s + self.head_len()]
    }

    /// Values of one head, transposed: `head_dim` rows of `capacity`.
    fn values_t(&self, layer: usize, kv_head: usize) -> &[f32] {
        let s = (layer * self.n_kv_heads + kv_head) * self.head_len();
        &self.v[s..s + self.head_len()]
    }

    /// Stores one token's keys and values (`n_kv_heads × head_dim` each) at `pos`.
    fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for g in 0..self.n_kv_heads {
            let base = (layer * self.n_kv_heads + g) * self.head_len();
            self.k[base + pos * hd..base + (pos + 1) * hd]
                .copy_from_slice(&k[g * hd..(g + 1) * hd]);
            for d in 0..hd {
                self.v[base + d * self.capacity + pos] = v[g * hd + d];
            }
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
    rope: RopeTable,
    pos: usize,
    scratch: Scratch,
}

impl CpuSession {
    pub fn new(model: &Model, context_length: usize) -> Self {
        let c = &model.config;
        CpuSession {
            kv: KvCache::new(c.n_layers, context_length, c.n_kv_heads, c.head_dim),
            rope: RopeTable::new(c, context_length),
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

    fn forward_chunk(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        is_last_chunk: bool,
        mut on_logits: impl FnMut(usize, &[f32]),
    ) {
        let c = &model.config;
        let w = &model.weights;
        let n = tokens.len();
        let (e, qd, kvd, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
        let pos0 = self.pos;
        let s = &mut self.scratch;

        let x = fit(&mut s.x, n * e);
        for (t, &tok) in tokens.iter().enumerate() {
            let row = w.token_embd.ty.row_bytes(e).expect("validated at load");
            let data = &model.data(&w.token_embd)[tok as usize * row..(tok as usize + 1) * row];
            lean_quant::dequantize_row(w.token_embd.ty, data, &mut x[t * e..(t + 1) * e]);
        }

        for (l, lw) in w.layers.iter().enumerate() {
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
            for t in 0..n {
                self.rope.apply(&mut q[t * qd..(t + 1) * qd], hd, pos0 + t);
                self.rope
                    .apply(&mut k[t * kvd..(t + 1) * kvd], hd, pos0 + t);
                self.kv.store(
                    l,
                    pos0 + t,
                    &k[t * kvd..(t + 1) * kvd],
                    &v[t * kvd..(t + 1) * kvd],
                );
            }
            let attn = fit(&mut s.attn, n * qd);
            attention(c, &self.kv, l, q, pos0, n, attn, &mut s.attention);
            let o = fit(&mut s.o, n * e);
            linear(model, &lw.wo, attn, n, o);
            ops::add_in_place(&mut s.x, o);

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
            ops::silu_mul(gate, up, act);
            let o = fit(&mut s.o, n * e);
            linear(model, &lw.w_down, act, n, o);
            ops::add_in_place(&mut s.x, o);
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
            for (y, row) in ys.iter_mut().zip(data.chunks_exact(row_bytes)) {
                *y = lean_quant::dot(m.ty, row, x);
            }
        });
        return;
    }
    for (m, y) in outputs.iter_mut() {
        linear(model, m, x, n, y);
    }
}

#[derive(Default)]
struct AttentionScratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    values_t: Vec<f32>,
    out: Vec<f32>,
}

fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 bit pattern is valid bytes; the length covers exactly the same memory.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
}

/// Causal grouped-query attention for a batch of `n` tokens at positions pos0.. (token t sees
/// positions 0..=pos0+t), as HF computes it: softmax(q·kᵀ · head_dim^-½) · v.
///
/// Per kv head, the queries of all the heads that share it (and all tokens) form one matrix, so
/// q·kᵀ and p·v run on lean-quant's f32 kernels (SIMD, threaded).
#[allow(clippy::too_many_arguments)]
fn attention(
    c: &crate::config::ModelConfig,
    kv: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    n: usize,
    out: &mut [f32],
    s: &mut AttentionScratch,
) {
    let (hd, qd) = (c.head_dim, c.q_dim());
    let group = c.n_heads / c.n_kv_heads;
    let len = pos0 + n;
    let rows = group * n; // query rows per kv head: (head in group, token)
    let scale = 1.0 / (hd as f32).sqrt();
    let f32t = lean_gguf::TensorType::F32;
    if n == 1 {
        return decode_attention(c, kv, layer, q, pos0, out);
    }
    for g in 0..c.n_kv_heads {
        let qg = fit(&mut s.q, rows * hd);
        for j in 0..group {
            let h = g * group + j;
            for t in 0..n {
                qg[(j * n + t) * hd..][..hd].copy_from_slice(&q[t * qd + h * hd..][..hd]);
            }
        }
        // scores = q · kᵀ over the first `len` key rows
        let keys = &kv.keys(layer, g)[..len * hd];
        let scores = fit(&mut s.scores, rows * len);
        lean_quant::matmul(f32t, f32_bytes(keys), len, hd, qg, rows, scores);
        // Causal mask and softmax, row by row (in parallel: a long prompt has many exps).
        let mask_softmax = |(r, row): (usize, &mut [f32])| {
            let visible = pos0 + r % n + 1;
            ops::softmax_scaled(&mut row[..visible], scale);
            row[visible..].fill(0.0);
        };
        #[cfg(feature = "threads")]
        {
            use rayon::prelude::*;
            scores
                .par_chunks_exact_mut(len)
                .enumerate()
                .for_each(mask_softmax);
        }
        #[cfg(not(feature = "threads"))]
        scores
            .chunks_exact_mut(len)
            .enumerate()
            .for_each(mask_softmax);
        // out = p · v: the transposed value rows, cut to `len` positions
        let vt_all = kv.values_t(layer, g);
        let vt = fit(&mut s.values_t, hd * len);
        for d in 0..hd {
            vt[d * len..(d + 1) * len]
                .copy_from_slice(&vt_all[d * kv.capacity..d * kv.capacity + len]);
        }
        let og = fit(&mut s.out, rows * hd);
        lean_quant::matmul(f32t, f32_bytes(vt), hd, len, scores, rows, og);
        for j in 0..group {
            let h = g * group + j;
            for t in 0..n {
                out[t * qd + h * hd..][..hd].copy_from_slice(&og[(j * n + t) * hd..][..hd]);
            }
        }
    }
}

/// Attention of one token (decode): every query head in parallel; scores are dots with the key
/// rows, the output dots of the probabilities with the transposed value rows (no copies).
fn decode_attention(
    c: &crate::config::ModelConfig,
    kv: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let hd = c.head_dim;
    let group = c.n_heads / c.n_kv_heads;
    let len = pos0 + 1;
    let scale = 1.0 / (hd as f32).sqrt();
    let f32t = lean_gguf::TensorType::F32;
    let head = |h: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let g = h / group;
        let keys = kv.keys(layer, g);
        let qh = &q[h * hd..(h + 1) * hd];
        scores.clear();
        scores.extend(
            keys[..len * hd]
                .chunks_exact(hd)
                .map(|k| lean_quant::dot(f32t, f32_bytes(k), qh)),
        );
        ops::softmax_scaled(scores, scale);
        let vt = kv.values_t(layer, g);
        for (d, od) in o.iter_mut().enumerate() {
            *od = lean_quant::dot(
                f32t,
                f32_bytes(&vt[d * kv.capacity..d * kv.capacity + len]),
                scores,
            );
        }
    };
    #[cfg(feature = "threads")]
    {
        use rayon::prelude::*;
        out[..c.q_dim()]
            .par_chunks_mut(hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (h, o)| head(h, o, scores));
    }
    #[cfg(not(feature = "threads"))]
    {
        let mut scores = Vec::new();
        for (h, o) in out[..c.q_dim()].chunks_mut(hd).enumerate() {
            head(h, o, &mut scores);
        }
    }
}
