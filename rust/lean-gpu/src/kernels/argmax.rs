//! Greedy decoding on the device: the index of the largest logit (argmax.wgsl, two passes).
use super::wgsl::{self, Consts};
use super::{check_len, module, pipeline_of, u32_arg, Kernels};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;

const ARGMAX: &str = include_str!("../shaders/argmax.wgsl");

/// Threads per workgroup of argmax.wgsl (both passes).
const ARGMAX_WORKGROUP: usize = 256;
/// Values per workgroup of argmax's first pass (argmax.wgsl: SPAN).
const ARGMAX_SPAN: usize = 4 * ARGMAX_WORKGROUP;

/// u32 of the buffer `Kernels::argmax` writes for n values: the index, then a (value, index)
/// pair per span of ARGMAX_SPAN values.
pub fn argmax_len(n: usize) -> usize {
    1 + 2 * n.div_ceil(ARGMAX_SPAN)
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct CountParams {
    n: u32,
    extra: u32,
    rows: u32,
    pad: u32,
}

/// argmax.wgsl's two passes: the first maximum per span, then of the spans.
pub(super) struct ArgmaxPipelines {
    spans: wgpu::ComputePipeline,
    last: wgpu::ComputePipeline,
}

impl ArgmaxPipelines {
    pub(super) fn new(ctx: &GpuContext) -> Self {
        let module = module(ctx, "argmax", &source());
        ArgmaxPipelines {
            spans: pipeline_of(ctx, "argmax_spans", &module, "spans", &[]),
            last: pipeline_of(ctx, "argmax", &module, "main", &[]),
        }
    }
}

fn source() -> String {
    let consts = Consts::new()
        .u32("WORKGROUP", ARGMAX_WORKGROUP)
        .u32("SPAN", ARGMAX_SPAN);
    wgsl::assemble("", &consts, &[ARGMAX])
}

impl Kernels {
    /// result[0] = index of the largest of the first n values (the first on ties); `result`
    /// holds `argmax_len(n)` u32 (the rest is the first pass's scratch).
    pub fn argmax(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        values: &wgpu::Buffer,
        result: &wgpu::Buffer,
        n: usize,
    ) -> Result<()> {
        self.argmax_rows(ctx, plan, values, result, n, 1)
    }

    /// The argmax of each of `rows` rows of n values (row r from value r × n): row r's index
    /// at result[r × argmax_len(n)]; `result` holds rows × `argmax_len(n)` u32.
    pub fn argmax_rows(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        values: &wgpu::Buffer,
        result: &wgpu::Buffer,
        n: usize,
        rows: usize,
    ) -> Result<()> {
        if n == 0 || rows == 0 {
            return Err(GpuError::Shape(format!(
                "argmax of {rows} rows of {n} values"
            )));
        }
        check_len("argmax values", values, rows * n)?;
        check_len("argmax result", result, rows * argmax_len(n))?;
        let spans = n.div_ceil(ARGMAX_SPAN);
        let params = CountParams {
            n: u32_arg("n", n)?,
            extra: u32_arg("spans", spans)?,
            rows: u32_arg("rows", rows)?,
            pad: 0,
        };
        let name = "argmax spans".into();
        let groups = u32_arg("argmax spans", rows * spans)?;
        Self::dispatch(
            ctx,
            plan,
            name,
            &self.argmax.spans,
            &params,
            &[values, result],
            groups,
        )?;
        Self::dispatch(
            ctx,
            plan,
            "argmax".into(),
            &self.argmax.last,
            &params,
            &[result],
            u32_arg("argmax rows", rows)?,
        )
    }
}

/// The argmax shader (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    let mut v = wgsl::Variant::main::<CountParams>("argmax", source());
    v.entry_points = vec!["spans", "main"];
    vec![v]
}
