//! Embedding lookup: rows of the token embedding matrix, dequantized (embed.wgsl with a block
//! decoder per tensor type), optionally scaled.
use super::wgsl::{self, Consts, BLOCK_TYPES, BYTES, UNITS};
use super::{check_len, for_type, pipeline, u32_arg, Kernels, ELEMENTWISE_GROUP};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;
use crate::weights::{GpuMatrix, Layout};
use lean_gguf::TensorType;

const EMBED: &str = include_str!("../shaders/embed.wgsl");

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedParams {
    layout: Layout,
    n_tokens: u32,
    cols: u32,
    first_row: u32,
    rows: u32,
    scale: f32,
    pad: [u32; 3],
}

/// The embed pipeline of every type.
pub(super) fn pipelines(ctx: &GpuContext) -> Vec<(TensorType, wgpu::ComputePipeline)> {
    BLOCK_TYPES
        .iter()
        .map(|&(ty, block)| {
            let (label, source) = source(ty, block);
            (ty, pipeline(ctx, &label, &source))
        })
        .collect()
}

/// The label and source of the embed shader of `ty` (block decoder `block`).
fn source(ty: TensorType, block: &str) -> (String, String) {
    let consts = Consts::new().u32("WORKGROUP", ELEMENTWISE_GROUP);
    let source = wgsl::assemble("", &consts, &[BYTES, UNITS, block, EMBED]);
    (format!("embed_{ty}"), source)
}

impl Kernels {
    /// out = rows `ids[t]` of the embedding matrix `m`, dequantized (`ids`: n_tokens u32 on the
    /// device; `out`: n_tokens × cols). Ids must be below m.rows() (the caller checks them).
    pub fn embed(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: usize,
    ) -> Result<()> {
        self.embed_scaled(ctx, plan, m, ids, out, n_tokens, 1.0)
    }

    /// `embed` with each value multiplied by `scale` in f32 (Gemma 3 scales its embeddings by
    /// sqrt(hidden size) rounded to f32); a scale of 1 leaves the values as stored.
    #[allow(clippy::too_many_arguments)]
    pub fn embed_scaled(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: usize,
        scale: f32,
    ) -> Result<()> {
        let pipeline = for_type(&self.embed, m.ty())?;
        if (ids.size() / 4) < n_tokens as u64 {
            return Err(GpuError::Shape(format!(
                "embed ids hold {} ids, needs {n_tokens}",
                ids.size() / 4
            )));
        }
        check_len("embed out", out, n_tokens * m.cols())?;
        for part in m.parts() {
            let params = EmbedParams {
                layout: m.layout(part),
                n_tokens: u32_arg("tokens", n_tokens)?,
                cols: u32_arg("cols", m.cols())?,
                first_row: u32_arg("first row", part.first_row)?,
                rows: u32_arg("rows", part.rows)?,
                scale,
                pad: [0; 3],
            };
            let groups = u32_arg(
                "embed workgroups",
                (n_tokens * m.cols()).div_ceil(ELEMENTWISE_GROUP),
            )?;
            Self::dispatch(
                ctx,
                plan,
                format!("embed {}", m.ty()),
                pipeline,
                &params,
                &[&part.buffer, ids, out],
                groups,
            )?;
        }
        Ok(())
    }
}

/// Every embed shader (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    BLOCK_TYPES
        .iter()
        .map(|&(ty, block)| {
            let (label, source) = source(ty, block);
            wgsl::Variant::main::<EmbedParams>(label, source)
        })
        .collect()
}
