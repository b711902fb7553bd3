//! Gated activations of the FFN, act(gate) · up element-wise (silu_mul.wgsl with
//! activation.wgsl), and the `Activation` the matvec and matmul fuse in.
use super::wgsl::{self, Consts, ACTIVATION};
use super::{check_len, u32_arg, Kernels, RowField, ELEMENTWISE_GROUP};
use crate::context::GpuContext;
use crate::error::Result;
use crate::plan::Plan;

const SILU_MUL: &str = include_str!("../shaders/silu_mul.wgsl");

/// The activation of a gated FFN, act(gate) · up, as torch computes it in float32
/// (shaders/activation.wgsl).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// silu(g) = g · (1 / (1 + exp(-g))): SwiGLU (llama, qwen).
    #[default]
    Silu,
    /// gelu_pytorch_tanh: 0.5 · x · (1 + tanh(sqrt(2/π) · (x + 0.044715 · x³))), in torch's
    /// order ((0.5 · x) · (1 + tanh(0.7978846 · (x + 0.044715 · ((x · x) · x))))): GeGLU
    /// (Gemma 3).
    GeluTanh,
}

impl Activation {
    /// matmul_reduce.wgsl's `swiglu` for pairs with this activation.
    pub(super) fn code(self) -> u32 {
        match self {
            Activation::Silu => 1,
            Activation::GeluTanh => 2,
        }
    }

    pub(super) fn is_gelu(self) -> bool {
        self == Activation::GeluTanh
    }
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct SiluMulParams {
    n: u32,
    n_rows: u32,
    /// (row width, offset) of gate and up.
    gate: [u32; 2],
    up: [u32; 2],
    /// Elements between a field's consecutive elements.
    pitch: u32,
    /// 1: GELU-tanh; 0: SiLU.
    gelu: u32,
}

pub(super) fn pipeline(ctx: &GpuContext) -> wgpu::ComputePipeline {
    super::pipeline(ctx, "silu_mul", &source())
}

fn source() -> String {
    let consts = Consts::new().u32("WORKGROUP", ELEMENTWISE_GROUP);
    wgsl::assemble("", &consts, &[ACTIVATION, SILU_MUL])
}

impl Kernels {
    /// out = silu(gate) · up element-wise, for `n_rows` rows of `n` elements: gate and up are
    /// fields of the rows of `gate_up`, out is n_rows × n (`gated_mul` with SiLU).
    #[allow(clippy::too_many_arguments)]
    pub fn silu_mul(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        (gate, up): (RowField, RowField),
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<()> {
        let fields = (gate, up);
        self.gated_mul(ctx, plan, gate_up, fields, out, n, n_rows, Activation::Silu)
    }

    /// out = act(gate) · up element-wise, for `n_rows` rows of `n` elements: gate and up are
    /// fields of the rows of `gate_up`, out is n_rows × n.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_mul(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        (gate, up): (RowField, RowField),
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
        activation: Activation,
    ) -> Result<()> {
        check_len(
            "silu_mul gate",
            gate_up,
            gate.end("silu_mul gate", n_rows, n)?,
        )?;
        check_len("silu_mul up", gate_up, up.end("silu_mul up", n_rows, n)?)?;
        let fields = (gate, up, 1);
        self.gated_mul_pitched(ctx, plan, gate_up, fields, out, (n, n_rows), activation)
    }

    /// out = silu(gate) · up element-wise, for `n_rows` rows of `gate_up` of `2 n` elements
    /// [gate_0, up_0, gate_1, up_1, ...] (a matmul of a stacked gate|up matrix whose rows are
    /// interleaved, stack.rs); out is n_rows × n (`gated_mul_pairs` with SiLU).
    pub fn silu_mul_pairs(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<()> {
        self.gated_mul_pairs(ctx, plan, gate_up, out, n, n_rows, Activation::Silu)
    }

    /// `silu_mul_pairs` with activation `activation`.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_mul_pairs(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
        activation: Activation,
    ) -> Result<()> {
        let rows = RowField::whole(2 * n);
        check_len(
            "silu_mul gate|up",
            gate_up,
            rows.end("silu_mul", n_rows, 2 * n)?,
        )?;
        let up = RowField {
            width: 2 * n,
            offset: 1,
        };
        let fields = (rows, up, 2);
        self.gated_mul_pitched(ctx, plan, gate_up, fields, out, (n, n_rows), activation)
    }

    /// silu_mul.wgsl with fields whose elements are `pitch` apart (the caller checked them).
    #[allow(clippy::too_many_arguments)]
    fn gated_mul_pitched(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        gate_up: &wgpu::Buffer,
        (gate, up, pitch): (RowField, RowField, u32),
        out: &wgpu::Buffer,
        (n, n_rows): (usize, usize),
        activation: Activation,
    ) -> Result<()> {
        check_len("silu_mul out", out, n * n_rows)?;
        let params = SiluMulParams {
            n: u32_arg("n", n)?,
            n_rows: u32_arg("rows", n_rows)?,
            gate: gate.params()?,
            up: up.params()?,
            pitch,
            gelu: activation.is_gelu() as u32,
        };
        let groups = u32_arg(
            "silu_mul workgroups",
            (n * n_rows).div_ceil(ELEMENTWISE_GROUP),
        )?;
        let name = match activation {
            Activation::Silu => "silu_mul",
            Activation::GeluTanh => "gelu_mul",
        };
        Self::dispatch(
            ctx,
            plan,
            name.into(),
            &self.gated,
            &params,
            &[gate_up, out],
            groups,
        )
    }
}

/// The gated shader (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    vec![wgsl::Variant::main::<SiluMulParams>("silu_mul", source())]
}
