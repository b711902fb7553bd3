//! RMS norms: of rows (rms_norm.wgsl; with ADD, added into a residual) and of each head of a
//! field of rows, in place (head_rms_norm.wgsl).
use super::wgsl::{self, Consts};
use super::{check_len, module, pipeline, pipeline_of, u32_arg, Kernels, RowField};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;

const RMS_NORM: &str = include_str!("../shaders/rms_norm.wgsl");
const HEAD_RMS_NORM: &str = include_str!("../shaders/head_rms_norm.wgsl");
const RMS_REDUCE: &str = include_str!("../shaders/rms_reduce.wgsl");

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct RmsNormParams {
    n: u32,
    n_rows: u32,
    eps: f32,
    pad: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct HeadRmsNormParams {
    head_dim: u32,
    heads: u32,
    n_tokens: u32,
    eps: f32,
    /// (row width, offset) of the heads' field.
    field: [u32; 2],
    pad: [u32; 2],
}

pub(super) struct NormPipelines {
    rms_norm: wgpu::ComputePipeline,
    /// rms_norm.wgsl with ADD: out += the norm.
    add: wgpu::ComputePipeline,
    head: wgpu::ComputePipeline,
}

impl NormPipelines {
    pub(super) fn new(ctx: &GpuContext) -> Self {
        let rms_norm = module(ctx, "rms_norm", &rms_norm_source());
        NormPipelines {
            rms_norm: pipeline_of(ctx, "rms_norm", &rms_norm, "main", &[]),
            add: pipeline_of(ctx, "rms_norm_add", &rms_norm, "main", &[("ADD", 1.0)]),
            head: pipeline(ctx, "head_rms_norm", &head_rms_norm_source()),
        }
    }
}

fn rms_norm_source() -> String {
    wgsl::assemble("", &Consts::new(), &[RMS_REDUCE, RMS_NORM])
}

fn head_rms_norm_source() -> String {
    wgsl::assemble("", &Consts::new(), &[RMS_REDUCE, HEAD_RMS_NORM])
}

impl Kernels {
    /// out = rms_norm(x) · weight for `n_rows` rows of `weight.len()` (= n) elements.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
        eps: f32,
    ) -> Result<()> {
        check_len("rms_norm x", x, n * n_rows)?;
        check_len("rms_norm weight", weight, n)?;
        check_len("rms_norm out", out, n * n_rows)?;
        let params = RmsNormParams {
            n: u32_arg("n", n)?,
            n_rows: u32_arg("rows", n_rows)?,
            eps,
            pad: 0,
        };
        Self::dispatch(
            ctx,
            plan,
            "rms_norm".into(),
            &self.norm.rms_norm,
            &params,
            &[x, weight, out],
            params.n_rows,
        )
    }

    /// residual += rms_norm(input) · weight for `n_tokens` rows of `width` elements (Gemma 3's
    /// post-attention and post-FFN norms: the norm's output added into the residual stream, as
    /// `residual + norm(input)` rounds). `input` and `residual` are different buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_add(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        input: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        residual: &wgpu::Buffer,
        width: usize,
        n_tokens: usize,
        eps: f32,
    ) -> Result<()> {
        check_len("rms_norm_add input", input, width * n_tokens)?;
        check_len("rms_norm_add weight", weight, width)?;
        check_len("rms_norm_add residual", residual, width * n_tokens)?;
        let params = RmsNormParams {
            n: u32_arg("n", width)?,
            n_rows: u32_arg("rows", n_tokens)?,
            eps,
            pad: 0,
        };
        Self::dispatch(
            ctx,
            plan,
            "rms_norm_add".into(),
            &self.norm.add,
            &params,
            &[input, weight, residual],
            params.n_rows,
        )
    }

    /// Per-head RMS norm in place (Qwen3's and Gemma 3's q_norm and k_norm): for each of
    /// `n_tokens` rows of `rows`, each of the `heads` consecutive heads of `head_dim` elements
    /// of the field `field` becomes rms_norm(head) · weight (`weight`: head_dim f32, shared by
    /// the heads), computed as `rms_norm` computes a row.
    #[allow(clippy::too_many_arguments)]
    pub fn head_rms_norm(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        rows: &wgpu::Buffer,
        field: RowField,
        heads: usize,
        head_dim: usize,
        weight: &wgpu::Buffer,
        eps: f32,
        n_tokens: usize,
    ) -> Result<()> {
        if heads == 0 || head_dim == 0 {
            return Err(GpuError::Shape(format!(
                "head_rms_norm of {heads} heads of {head_dim}"
            )));
        }
        let len = heads
            .checked_mul(head_dim)
            .ok_or_else(|| GpuError::TooLarge(format!("{heads} heads of {head_dim}")))?;
        check_len(
            "head_rms_norm rows",
            rows,
            field.end("head_rms_norm heads", n_tokens, len)?,
        )?;
        check_len("head_rms_norm weight", weight, head_dim)?;
        let params = HeadRmsNormParams {
            head_dim: u32_arg("head_dim", head_dim)?,
            heads: u32_arg("heads", heads)?,
            n_tokens: u32_arg("tokens", n_tokens)?,
            eps,
            field: field.params()?,
            pad: [0; 2],
        };
        let groups = u32_arg("head_rms_norm workgroups", heads * n_tokens)?;
        Self::dispatch(
            ctx,
            plan,
            "head_rms_norm".into(),
            &self.norm.head,
            &params,
            &[rows, weight],
            groups,
        )
    }
}

/// The norm shaders and the pipelines made of them (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    let mut rms_norm = wgsl::Variant::main::<RmsNormParams>("rms_norm", rms_norm_source());
    rms_norm.pipelines = vec![vec![], vec![("ADD", 1.0)]];
    vec![
        rms_norm,
        wgsl::Variant::main::<HeadRmsNormParams>("head_rms_norm", head_rms_norm_source()),
    ]
}
