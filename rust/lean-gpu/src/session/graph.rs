//! Recording the forward pass of a step (one token or a prefill chunk) into a `Plan`, from the
//! model's description (`lean::config`): projections, norms, attention, the FFN and the head.
use super::load::Stack;
use super::GpuSession;
use crate::error::{GpuError, Result};
use crate::kernels::{
    fresh_rope_supported, Activation, AttentionShape, FreshTokens, MatmulExtras, MatvecExtras,
    Rope, RopePairing, RowField,
};
use crate::plan::Plan;
use crate::weights::GpuMatrix;
use lean::config::RopeStyle;

/// Which logits a recorded step produces.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(super) enum Output {
    /// None (a prefill chunk before the last).
    Nothing,
    /// The last token's logits and their argmax.
    Last,
    /// Every token's logits.
    All,
    /// Every token's argmax (speculative decoding's verification pass, at most
    /// MATVEC_MAX_TOKENS tokens), from a decode-shaped pass: each product a matvec of all the
    /// tokens (a row group's weights read from memory once; every token's sums those of its own
    /// decode step), the
    /// norms fused into them, each token's attention decode's split-K kernel at its position.
    Argmaxes,
}

impl GpuSession {
    /// y = x · Wᵀ for n rows of x (y += x · Wᵀ with `accumulate`: the residual add fused in):
    /// a matvec of the n tokens for a decode-shaped pass (`shaped`), the tiled matmul for
    /// several tokens otherwise.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: usize,
        accumulate: bool,
        shaped: bool,
    ) -> Result<()> {
        let (ctx, k) = (&*self.ctx, &*self.kernels);
        if shaped {
            let extras = MatvecExtras {
                accumulate,
                tokens: n,
                x_width: m.cols(),
                ..Default::default()
            };
            return k.matvec_with(ctx, plan, m, x, (y, RowField::whole(m.rows())), extras);
        }
        match accumulate {
            false => k.matmul(ctx, plan, m, x, y, n),
            true => k.matmul_add(ctx, plan, m, x, y, n),
        }
    }

    /// The residual stream `act.x` += x · Wᵀ for `n` rows (the add fused into the matvec or
    /// matmul), or += rms_norm(x · Wᵀ) · `post_norm` where the block norms its outputs (the
    /// product goes through `act.h`, free at this point of a layer).
    fn residual(
        &self,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        post_norm: Option<&wgpu::Buffer>,
        n: usize,
        shaped: bool,
    ) -> Result<()> {
        let a = &self.act;
        let Some(weight) = post_norm else {
            return self.linear(plan, m, x, &a.x, n, true, shaped);
        };
        self.linear(plan, m, x, &a.h, n, false, shaped)?;
        let (e, eps) = (self.model.config.n_embd, self.model.config.rms_eps);
        self.kernels
            .rms_norm_add(&self.ctx, plan, &a.h, weight, &a.x, e, n, eps)
    }

    /// y = x · Wᵀ (+ bias) for each matrix of `s`, into its field of y's rows (`s.width` wide),
    /// the bias fused in: for a decode-shaped pass (`shaped`: one token, or a verification
    /// pass) a matvec of the tokens with the RMS norm by `norm` fused in too (x is the raw
    /// residual stream), otherwise the matmuls (x already normalized).
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        plan: &mut Plan,
        s: &Stack,
        x: &wgpu::Buffer,
        norm: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        n: usize,
        shaped: bool,
    ) -> Result<()> {
        let (ctx, k) = (&*self.ctx, &*self.kernels);
        let eps = self.model.config.rms_eps;
        for (offset, m) in &s.matrices {
            let at = RowField {
                width: s.width,
                offset: *offset,
            };
            match shaped {
                true => {
                    let extras = MatvecExtras {
                        norm: norm.map(|weight| (weight, eps)),
                        bias: s.bias.as_ref(),
                        tokens: n,
                        x_width: m.cols(),
                        ..Default::default()
                    };
                    k.matvec_with(ctx, plan, m, x, (y, at), extras)?
                }
                false => {
                    let extras = MatmulExtras {
                        bias: s.bias.as_ref(),
                        ..Default::default()
                    };
                    k.matmul_with(ctx, plan, m, x, (y, at), n, extras)?
                }
            }
        }
        Ok(())
    }

    /// Records the forward pass of `n` tokens (ids in `act.ids`, first position in the step
    /// buffer) through every layer, then the output head per `output`.
    pub(super) fn record(&self, n: usize, output: Output) -> Result<Plan> {
        let (ctx, k, a) = (&*self.ctx, &*self.kernels, &self.act);
        // Decode's graph: one token, or a verification pass of a few.
        let shaped = n == 1 || output == Output::Argmaxes;
        let c = &self.model.config;
        let (e, qd, kvd, ff, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.head_dim);
        let qkv_field = |offset| RowField {
            width: qd + 2 * kvd,
            offset,
        };
        let qkv_fields = [qkv_field(0), qkv_field(qd), qkv_field(qd + kvd)];
        let gate_up_field = |offset| RowField {
            width: 2 * ff,
            offset,
        };
        // Each rotary table as the kernels take it; a layer uses one (`Layer::rope`).
        let ropes: Vec<Rope> = c
            .ropes
            .iter()
            .map(|r| Rope {
                rope_dim: r.dim,
                positions: self.capacity,
                pairing: match r.style {
                    RopeStyle::Interleaved => RopePairing::Interleaved,
                    RopeStyle::Neox => RopePairing::Neox,
                },
            })
            .collect();
        let activation = match c.block.activation {
            lean::config::Activation::Silu => Activation::Silu,
            lean::config::Activation::GeluTanh => Activation::GeluTanh,
        };
        let mut p = Plan::new();
        let embedding_scale = c.block.embedding_scale.unwrap_or(1.0);
        k.embed_scaled(
            ctx,
            &mut p,
            &self.model.token_embd,
            &a.ids,
            &a.x,
            n,
            embedding_scale,
        )?;
        let eps = c.rms_eps;
        for (l, layer) in self.layers.iter().zip(&c.layers) {
            // Decode-shaped: the norms are fused into the matvecs that read them.
            if shaped {
                self.project(&mut p, &l.qkv, &a.x, Some(&l.attn_norm), &a.qkv, n, true)?;
            } else {
                k.rms_norm(ctx, &mut p, &a.x, &l.attn_norm, &a.h, e, n, eps)?;
                self.project(&mut p, &l.qkv, &a.h, None, &a.qkv, n, false)?;
            }
            if let Some((q_norm, k_norm)) = &l.qk_norms {
                let (nh, nkv) = (c.n_heads, c.n_kv_heads);
                k.head_rms_norm(ctx, &mut p, &a.qkv, qkv_fields[0], nh, hd, q_norm, eps, n)?;
                k.head_rms_norm(ctx, &mut p, &a.qkv, qkv_fields[1], nkv, hd, k_norm, eps, n)?;
            }
            let (rope, cos_sin) = (ropes[layer.rope], &self.rope_tables[layer.rope]);
            let attention = AttentionShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                n_tokens: n,
                capacity: self.capacity,
                cache_offset: 0,
                scale: c.block.attention_scale,
                window: layer.window,
            };
            // A verification pass's tokens each attend as their decode steps would.
            let per_token = shaped && n > 1;
            // Decoding, the attention rotates and caches the token's key itself where it can
            // (a prefill chunk's attention would rotate every key of the chunk in each of its
            // workgroups: 5% slower on an H200 than rope_kv_store first); so does a
            // verification pass, a dispatch a layer less (~10 µs each on an H100), its tokens'
            // keys rotated by the same function as their decode steps'.
            let fresh =
                ((n == 1 || per_token) && fresh_rope_supported(&rope, hd)).then_some(FreshTokens {
                    k: qkv_fields[1],
                    v: qkv_fields[2],
                    cos_sin,
                    rope,
                });
            if fresh.is_none() {
                k.rope_kv_store(
                    ctx,
                    &mut p,
                    &self.step,
                    &a.qkv,
                    qkv_fields,
                    (&l.keys, &l.values),
                    (cos_sin, rope),
                    attention,
                )?;
            }
            let q = (&a.qkv, qkv_fields[0]);
            let (keys, values) = (&l.keys, &l.values);
            let tiled = !per_token;
            let buffers = (keys, values, &a.partials, &a.attn);
            k.attention_of(ctx, &mut p, &self.step, q, buffers, attention, fresh, tiled)?;
            let post_attn_norm = l.post_attn_norm.as_ref();
            self.residual(&mut p, &l.wo, &a.attn, post_attn_norm, n, shaped)?;
            if l.gate_up.pairs {
                // act(gate) · up straight out of the gate|up matvec or matmul
                let (gate_up, act) = (&l.gate_up.matrices[0].1, (&a.act, RowField::whole(ff)));
                if shaped {
                    let extras = MatvecExtras {
                        norm: Some((&l.ffn_norm, eps)),
                        swiglu: true,
                        activation,
                        tokens: n,
                        x_width: e,
                        ..Default::default()
                    };
                    k.matvec_with(ctx, &mut p, gate_up, &a.x, act, extras)?;
                } else {
                    k.rms_norm(ctx, &mut p, &a.x, &l.ffn_norm, &a.h, e, n, eps)?;
                    let extras = MatmulExtras {
                        swiglu: true,
                        activation,
                        ..Default::default()
                    };
                    k.matmul_with(ctx, &mut p, gate_up, &a.h, act, n, extras)?;
                }
                let post_ffn_norm = l.post_ffn_norm.as_ref();
                self.residual(&mut p, &l.w_down, &a.act, post_ffn_norm, n, shaped)?;
                continue;
            }
            if shaped {
                let gate_up = &a.gate_up;
                self.project(
                    &mut p,
                    &l.gate_up,
                    &a.x,
                    Some(&l.ffn_norm),
                    gate_up,
                    n,
                    true,
                )?;
            } else {
                k.rms_norm(ctx, &mut p, &a.x, &l.ffn_norm, &a.h, e, n, eps)?;
                self.project(&mut p, &l.gate_up, &a.h, None, &a.gate_up, n, false)?;
            }
            if shaped && ff.is_multiple_of(4) {
                // act(gate) · up read straight from [gate | up]; the residual added in unless
                // a post-norm comes first
                let post_norm = l.post_ffn_norm.as_ref();
                let extras = MatvecExtras {
                    silu_up: Some((&a.gate_up, ff)),
                    accumulate: post_norm.is_none(),
                    activation,
                    tokens: n,
                    // x: the gate field of [gate | up] rows
                    x_width: 2 * ff,
                    ..Default::default()
                };
                let whole = RowField::whole(e);
                let out = if post_norm.is_some() { &a.h } else { &a.x };
                k.matvec_with(ctx, &mut p, &l.w_down, &a.gate_up, (out, whole), extras)?;
                if let Some(weight) = post_norm {
                    k.rms_norm_add(ctx, &mut p, &a.h, weight, &a.x, e, n, eps)?;
                }
            } else {
                let (gate, up) = (gate_up_field(0), gate_up_field(ff));
                k.gated_mul(
                    ctx,
                    &mut p,
                    &a.gate_up,
                    (gate, up),
                    &a.act,
                    ff,
                    n,
                    activation,
                )?;
                let post_ffn_norm = l.post_ffn_norm.as_ref();
                self.residual(&mut p, &l.w_down, &a.act, post_ffn_norm, n, shaped)?;
            }
        }
        let head = self.model.output();
        match output {
            Output::Nothing => {}
            Output::Last => {
                // Only the last row goes through the final norm (fused into the head's
                // matvec) and the head (a copy when there are several rows: it would split the
                // compute pass for nothing).
                let last_row = if n == 1 {
                    &a.x
                } else {
                    let row = (e * 4) as u64;
                    p.copy(&a.x, (n - 1) as u64 * row, &a.h, 0, row);
                    &a.h
                };
                let extras = MatvecExtras {
                    norm: Some((&self.model.output_norm, eps)),
                    ..Default::default()
                };
                let logits = (&a.logits, RowField::whole(c.vocab_size));
                k.matvec_with(ctx, &mut p, head, last_row, logits, extras)?;
                k.argmax(ctx, &mut p, &a.logits, &a.argmax, c.vocab_size)?;
            }
            Output::All => {
                let logits = a
                    .logits_all
                    .as_ref()
                    .ok_or_else(|| GpuError::Shape("no logits buffer for every token".into()))?;
                k.rms_norm(ctx, &mut p, &a.x, &self.model.output_norm, &a.h, e, n, eps)?;
                self.linear(&mut p, head, &a.h, logits, n, false, false)?;
            }
            Output::Argmaxes => {
                let logits = a
                    .logits_all
                    .as_ref()
                    .ok_or_else(|| GpuError::Shape("no logits buffer for every token".into()))?;
                let extras = MatvecExtras {
                    norm: Some((&self.model.output_norm, eps)),
                    tokens: n,
                    x_width: e,
                    ..Default::default()
                };
                let rows = (logits, RowField::whole(c.vocab_size));
                k.matvec_with(ctx, &mut p, head, &a.x, rows, extras)?;
                k.argmax_rows(ctx, &mut p, logits, &a.argmax, c.vocab_size, n)?;
            }
        }
        Ok(p)
    }
}
