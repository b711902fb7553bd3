//! The step's new tokens enter attention (rope_kv_store.wgsl): the rotary embedding of the
//! queries in place, the keys (rotated) and values into the KV cache. The rotation's types and
//! cos/sin table live here (attention.wgsl rotates fresh tokens with the same table).
use super::attention::AttentionShape;
use super::wgsl::{self, Consts};
use super::{check_len, u32_arg, Kernels, RowField, StepBuffer, ELEMENTWISE_GROUP};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;

const ROPE_KV_STORE: &str = include_str!("../shaders/rope_kv_store.wgsl");

/// Which elements of a head rotate together (see lean's `RopeStyle`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// (2i, 2i + 1): llama GGUFs.
    Interleaved,
    /// (i, i + rope_dim / 2): qwen2 GGUFs.
    Neox,
}

/// The rotary embedding: the leading `rope_dim` elements of each head rotate, by a table of
/// (cos, sin) from `rope_cos_sin` for `positions` positions.
#[derive(Copy, Clone, Debug)]
pub struct Rope {
    pub rope_dim: usize,
    pub positions: usize,
    pub pairing: RopePairing,
}

/// cos/sin for positions 0..positions and frequencies 0..rope_dim/2, as (cos, sin) pairs,
/// computed exactly as lean's CPU `RopeTable` (HF's float32 inv_freq and angles).
pub fn rope_cos_sin(
    rope_dim: usize,
    base: f32,
    linear_factor: f32,
    positions: usize,
) -> Vec<[f32; 2]> {
    let half = rope_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / rope_dim as f32) / linear_factor)
        .collect();
    let mut table = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in &inv_freq {
            let angle = p as f32 * f;
            table.push([angle.cos(), angle.sin()]);
        }
    }
    table
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeKvStoreParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    neox: u32,
    capacity: u32,
    cache_offset: u32,
    /// (row width, offset) of q, k and v in the qkv buffer.
    q: [u32; 2],
    k: [u32; 2],
    v: [u32; 2],
    pad: [u32; 2],
}

pub(super) fn pipeline(ctx: &GpuContext) -> wgpu::ComputePipeline {
    super::pipeline(ctx, "rope_kv_store", &source())
}

fn source() -> String {
    let consts = Consts::new().u32("WORKGROUP", ELEMENTWISE_GROUP);
    wgsl::assemble("", &consts, &[ROPE_KV_STORE])
}

impl Kernels {
    /// The step's tokens enter attention: rotates the queries in place (per token n_heads ×
    /// head_dim at field `q` of `qkv`, the first token at the step's position) and writes the
    /// keys (rotated) and values (n_kv_heads × head_dim at fields `k`, `v`) into the cache
    /// buffers at the step's position; the layer starts at `s.cache_offset`. `cos_sin` is the
    /// table of `rope`. The caller keeps the positions within both the table and the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_store(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        step: &StepBuffer,
        qkv: &wgpu::Buffer,
        [q, k, v]: [RowField; 3],
        (keys, values): (&wgpu::Buffer, &wgpu::Buffer),
        (cos_sin, rope): (&wgpu::Buffer, Rope),
        s: AttentionShape,
    ) -> Result<()> {
        if !rope.rope_dim.is_multiple_of(2) || rope.rope_dim > s.head_dim {
            return Err(GpuError::Shape(format!(
                "rope_dim {} must be even and at most head_dim {}",
                rope.rope_dim, s.head_dim
            )));
        }
        let kv_dim = s.n_kv_heads * s.head_dim;
        let cache_end = s.cache_offset + kv_dim * s.capacity;
        let q_dim = s.n_heads * s.head_dim;
        check_len("rope q", qkv, q.end("rope q", s.n_tokens, q_dim)?)?;
        check_len("kv_store k", qkv, k.end("kv_store k", s.n_tokens, kv_dim)?)?;
        check_len("kv_store v", qkv, v.end("kv_store v", s.n_tokens, kv_dim)?)?;
        check_len("kv_store keys", keys, cache_end)?;
        check_len("kv_store values", values, cache_end)?;
        check_len("rope table", cos_sin, rope.positions * rope.rope_dim)?;
        let params = RopeKvStoreParams {
            n_tokens: u32_arg("tokens", s.n_tokens)?,
            n_heads: u32_arg("heads", s.n_heads)?,
            n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
            head_dim: u32_arg("head_dim", s.head_dim)?,
            rope_dim: u32_arg("rope_dim", rope.rope_dim)?,
            neox: (rope.pairing == RopePairing::Neox) as u32,
            capacity: u32_arg("capacity", s.capacity)?,
            cache_offset: u32_arg("cache offset", s.cache_offset)?,
            q: q.params()?,
            k: k.params()?,
            v: v.params()?,
            pad: [0; 2],
        };
        let per_token = s.n_heads * rope.rope_dim / 2 + 2 * kv_dim;
        let groups = u32_arg(
            "rope_kv_store workgroups",
            (s.n_tokens * per_token).div_ceil(ELEMENTWISE_GROUP),
        )?;
        Self::dispatch(
            ctx,
            plan,
            "rope_kv_store".into(),
            &self.rope_kv_store,
            &params,
            &[step.buffer(), qkv, keys, values, cos_sin],
            groups,
        )
    }
}

/// The rope_kv_store shader (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    vec![wgsl::Variant::main::<RopeKvStoreParams>("rope_kv_store", source()).with_step(1)]
}
