//! Greedy decoding under a constraint on the device: the index of the largest logit among the
//! tokens a bitset allows (argmax_masked.wgsl, two passes), so that a constrained token reads
//! back 4 bytes, not the logits; for several rows, each with its own mask, a verification pass
//! under a constraint.
use super::wgsl::{self, Consts};
use super::{check_len, module, pipeline_of, u32_arg, Kernels};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;

const ARGMAX_MASKED: &str = include_str!("../shaders/argmax_masked.wgsl");

/// Threads per workgroup of argmax_masked.wgsl (both passes).
const WORKGROUP: usize = 256;
/// Values per workgroup of the first pass (argmax_masked.wgsl: SPAN).
const SPAN: usize = 4 * WORKGROUP;

/// What result[0] of `Kernels::argmax_masked` holds when the mask allows none of the values.
pub const NO_TOKEN: u32 = u32::MAX;

/// u32 of the buffer `Kernels::argmax_masked` writes for n values: the index, then a (key,
/// index) pair per span of SPAN values.
pub fn argmax_masked_len(n: usize) -> usize {
    1 + 2 * n.div_ceil(SPAN)
}

/// u32 words of a mask over n tokens (bit i % 32 of word i / 32 for token i).
pub fn mask_words(n: usize) -> usize {
    n.div_ceil(32)
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct CountParams {
    n: u32,
    spans: u32,
    rows: u32,
    pad: u32,
}

/// argmax_masked.wgsl's two passes: the best allowed value per span, then of the spans.
pub(super) struct ArgmaxMaskedPipelines {
    spans: wgpu::ComputePipeline,
    last: wgpu::ComputePipeline,
}

impl ArgmaxMaskedPipelines {
    pub(super) fn new(ctx: &GpuContext) -> Self {
        let module = module(ctx, "argmax_masked", &source());
        ArgmaxMaskedPipelines {
            spans: pipeline_of(ctx, "argmax_masked_spans", &module, "spans", &[]),
            last: pipeline_of(ctx, "argmax_masked", &module, "main", &[]),
        }
    }
}

fn source() -> String {
    let consts = Consts::new().u32("WORKGROUP", WORKGROUP).u32("SPAN", SPAN);
    wgsl::assemble("", &consts, &[ARGMAX_MASKED])
}

impl Kernels {
    /// result[0] = index of the largest of the first n values among those `mask` allows (bit
    /// i % 32 of word i / 32; `mask_words(n)` u32), the first on ties, a NaN counting as -inf
    /// (`lean::sampling::argmax_masked`), or `NO_TOKEN` when none is allowed. `result` holds
    /// `argmax_masked_len(n)` u32 (the rest is the first pass's scratch).
    pub fn argmax_masked(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        values: &wgpu::Buffer,
        mask: &wgpu::Buffer,
        result: &wgpu::Buffer,
        n: usize,
    ) -> Result<()> {
        self.argmax_masked_rows(ctx, plan, values, mask, result, n, 1)
    }

    /// `argmax_masked` of each of `rows` rows of n values, each under its own mask: row r's
    /// values from value r × n, its mask from word r × `mask_words(n)`, its index at
    /// result[r × argmax_masked_len(n)]; `result` holds rows × `argmax_masked_len(n)` u32.
    #[allow(clippy::too_many_arguments)]
    pub fn argmax_masked_rows(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        values: &wgpu::Buffer,
        masks: &wgpu::Buffer,
        result: &wgpu::Buffer,
        n: usize,
        rows: usize,
    ) -> Result<()> {
        if n == 0 || rows == 0 {
            return Err(GpuError::Shape(format!(
                "masked argmax of {rows} rows of {n} values"
            )));
        }
        check_len("masked argmax values", values, rows * n)?;
        check_len("masked argmax mask", masks, rows * mask_words(n))?;
        check_len("masked argmax result", result, rows * argmax_masked_len(n))?;
        let spans = n.div_ceil(SPAN);
        let params = CountParams {
            n: u32_arg("n", n)?,
            spans: u32_arg("spans", spans)?,
            rows: u32_arg("rows", rows)?,
            pad: 0,
        };
        let groups = u32_arg("masked argmax spans", rows * spans)?;
        Self::dispatch(
            ctx,
            plan,
            "argmax_masked spans".into(),
            &self.argmax_masked.spans,
            &params,
            &[values, masks, result],
            groups,
        )?;
        Self::dispatch(
            ctx,
            plan,
            "argmax_masked".into(),
            &self.argmax_masked.last,
            &params,
            &[result],
            u32_arg("masked argmax rows", rows)?,
        )
    }
}

/// The masked argmax shader (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    let mut v = wgsl::Variant::main::<CountParams>("argmax_masked", source());
    v.entry_points = vec!["spans", "main"];
    vec![v]
}
