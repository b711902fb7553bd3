//! Decode's products: y = W·x per weight matrix (matvec.wgsl with a reduction,
//! matvec_workgroup.wgsl or matvec_subgroup.wgsl, and a block decoder per tensor type), with an
//! RMS norm of x, act(gate) · up, SwiGLU pairs, a bias and a residual add fused in on request.
use super::gated::Activation;
use super::wgsl::{self, Consts, ACTIVATION, BLOCK_TYPES, BYTES, SUBGROUPS_DIRECTIVE, UNITS};
use super::{check_len, trusted_module, u32_arg, Kernels, RowField, TypedShaders};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;
use crate::weights::{packs_row_quads, GpuMatrix, Layout, ROW_QUAD};
use lean_gguf::TensorType;

const MATVEC: &str = include_str!("../shaders/matvec.wgsl");
const MATVEC_WORKGROUP: &str = include_str!("../shaders/matvec_workgroup.wgsl");
const MATVEC_SUBGROUP: &str = include_str!("../shaders/matvec_subgroup.wgsl");
const MATVEC_ROW_BY_ROW: &str = include_str!("../shaders/matvec_row_by_row.wgsl");

/// Rows each matvec thread dots its slices with, and so rows per workgroup (matvec.wgsl:
/// ROWS_PER_THREAD). On an H200, 4 against 2 made decode 7% faster (x and a fused norm's
/// weights are read once per 4 rows), given 512-thread workgroups for long rows (with at most
/// 256 the 2048 × 11008 down projection took 16.2 instead of 12.6 µs); 8 was 8% slower than 2.
const MATVEC_ROWS_PER_THREAD: usize = 4;
// matvec.wgsl keeps the rows in quads (vec4 sums, quad_dot), which start where the row-quad
// types' quads do.
const _: () = assert!(MATVEC_ROWS_PER_THREAD.is_multiple_of(ROW_QUAD) && ROW_QUAD == 4);

/// Most tokens one matvec dispatch takes (`MatvecExtras::tokens`): the verification passes of
/// speculative decoding (a last token and up to 15 guesses).
pub const MATVEC_MAX_TOKENS: usize = 16;

/// Whether `matvec` and `matmul` support weights of type `ty`.
pub fn matvec_supports(ty: TensorType) -> bool {
    BLOCK_TYPES.iter().any(|(t, _)| *t == ty)
}

/// Threads of a matvec dispatch that keep the device busy (about a thousand per multiprocessor
/// of a large GPU): below this, a workgroup's rows get more threads.
const MATVEC_TARGET_THREADS: usize = 1 << 17;
/// The matvec workgroup sizes (matvec.wgsl: WORKGROUP), one pipeline each. 512 only with the
/// subgroup reduction (matvec_workgroup.wgsl's tree arrays hold 256) on devices that allow it.
const MATVEC_WORKGROUP_SIZES: [usize; 4] = [64, 128, 256, 512];
/// The largest workgroup of the tree reduction (matvec_workgroup.wgsl's arrays).
const MATVEC_TREE_MAX_WORKGROUP: usize = 256;
/// Entries of matvec_subgroup.wgsl's array, one per subgroup: enough for the largest workgroup
/// in subgroups of wgpu's smallest size.
const MATVEC_SUBGROUP_SLOTS: usize = 128;
const _: () = assert!(
    MATVEC_WORKGROUP_SIZES[MATVEC_WORKGROUP_SIZES.len() - 1]
        <= MATVEC_SUBGROUP_SLOTS * wgpu::MINIMUM_SUBGROUP_MIN_SIZE as usize
);

/// Index in MATVEC_WORKGROUP_SIZES (below `sizes`) of the threads that split a row's `slices`
/// among them in a matvec of `workgroups` workgroups: enough for about 4 slices each (each
/// thread pays for the reduction once), more while the device is short of threads, at most
/// one per slice.
fn matvec_size_index(slices: usize, workgroups: usize, sizes: usize) -> usize {
    let most = slices.next_power_of_two();
    let mut i = MATVEC_WORKGROUP_SIZES[..sizes]
        .iter()
        .position(|&n| n >= slices / 4)
        .unwrap_or(sizes - 1);
    while i + 1 < sizes
        && MATVEC_WORKGROUP_SIZES[i] < most
        && workgroups * MATVEC_WORKGROUP_SIZES[i] < MATVEC_TARGET_THREADS
    {
        i += 1;
    }
    i
}

/// The fusions of a matvec pipeline (matvec.wgsl's overrides), as bits of its key.
const NORM: u8 = 1;
const SILU: u8 = 2;
const SWIGLU: u8 = 4;
const GELU: u8 = 8;
/// Several tokens a dispatch (a verification pass): the one-token pipelines keep their
/// offsets constant.
const TOKENS: u8 = 16;

/// The fusions pipelines are made with: any with or without NORM, of none, SILU or SWIGLU, the
/// last two with or without GELU; each for one token or several.
#[cfg(test)]
fn fusion_sets() -> Vec<u8> {
    let gates = [0, SILU, SILU | GELU, SWIGLU, SWIGLU | GELU];
    [0, NORM, TOKENS, NORM | TOKENS]
        .iter()
        .flat_map(|norm| gates.iter().map(move |gate| norm | gate))
        .collect()
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    layout: Layout,
    rows: u32,
    cols: u32,
    first_row: u32,
    accumulate: u32,
    bias: u32,
    eps: f32,
    up_offset: u32,
    x_stride: u32,
    y_stride: u32,
    tokens: u32,
    pad: [u32; 2],
}

/// What a matvec fuses in besides y = W·x (`Kernels::matvec_with`).
#[derive(Copy, Clone, Default)]
pub struct MatvecExtras<'a> {
    /// x is RMS-normalized (LlamaRMSNorm; the dot is scaled, not each x): the norm's weights,
    /// zero-padded to a multiple of 8 elements, and its eps.
    pub norm: Option<(&'a wgpu::Buffer, f32)>,
    /// x is a gate and the activations act(x) · up, up starting at the given element (a
    /// multiple of 4) of its buffer, which holds 8 × `GpuMatrix::slices()` f32 from there.
    pub silu_up: Option<(&'a wgpu::Buffer, usize)>,
    /// The rows are (gate, up) pairs, [gate_0, up_0, gate_1, ...] (a stacked gate|up matrix
    /// with its rows interleaved, stack.rs): y[pair] = act(gate) · up, so y's field is half
    /// as wide as the matrix has rows. No bias or accumulate with it.
    pub swiglu: bool,
    /// Plus bias[row].
    pub bias: Option<&'a wgpu::Buffer>,
    /// y += (a residual add), after the bias.
    pub accumulate: bool,
    /// The activation of `silu_up` and `swiglu` (default SiLU).
    pub activation: Activation,
    /// Tokens (0 counts as 1, at most MATVEC_MAX_TOKENS): x, up and y hold a row per token,
    /// `x_width` f32 apart for x and up, the field's width for y, and each token's rows get
    /// the bits a matvec of that token alone would give them (a workgroup per row group and
    /// token, a row group's tokens side by side: its weights come from memory once).
    pub tokens: usize,
    /// f32 from one token's row of x (and of up) to the next's, a multiple of 4 (tokens > 1).
    pub x_width: usize,
}

/// The matvec shader of each type; its pipelines, one per workgroup size and fusion (override
/// constants), are created on first use: of the dozens per type a model uses a few.
pub(super) struct MatvecShaders {
    /// Keyed by (index in MATVEC_WORKGROUP_SIZES, fusions: NORM, SILU, SWIGLU, GELU, TOKENS bits).
    shaders: TypedShaders<(usize, u8)>,
    /// How many of MATVEC_WORKGROUP_SIZES the pipelines may use.
    sizes: usize,
}

impl MatvecShaders {
    /// The shaders of every type, reducing with subgroup operations or in workgroup memory,
    /// with workgroups of at most what the reduction and the device allow.
    pub(super) fn new(ctx: &GpuContext, subgroups: bool) -> Self {
        let largest = Self::largest(subgroups)
            .min(ctx.limits().max_compute_invocations_per_workgroup as usize);
        // WebGPU guarantees 256 invocations, so at least the smallest size fits.
        let sizes = MATVEC_WORKGROUP_SIZES
            .iter()
            .filter(|&&n| n <= largest)
            .count()
            .max(1);
        let modules = BLOCK_TYPES
            .iter()
            .map(|&(ty, block)| {
                let (label, source) = Self::source(ty, block, subgroups);
                // SAFETY: every index is in range and every loop ends (see matvec_module).
                (ty, unsafe { matvec_module(ctx, &label, &source) })
            })
            .collect();
        MatvecShaders {
            shaders: TypedShaders::new("matvec", modules),
            sizes,
        }
    }

    /// The largest workgroup of a reduction.
    fn largest(subgroups: bool) -> usize {
        match subgroups {
            true => usize::MAX,
            false => MATVEC_TREE_MAX_WORKGROUP,
        }
    }

    /// The label and source of the matvec shader of `ty` (block decoder `block`).
    pub(super) fn source(ty: TensorType, block: &str, subgroups: bool) -> (String, String) {
        let consts = Consts::new()
            .u32("ROWS_PER_THREAD", MATVEC_ROWS_PER_THREAD)
            .u32("TREE_SLOTS", MATVEC_TREE_MAX_WORKGROUP)
            .u32("SUBGROUP_SLOTS", MATVEC_SUBGROUP_SLOTS);
        // quad_dot: the row-quad types' snippets define it, the others get it per row.
        let quad_dot = if packs_row_quads(ty) {
            ""
        } else {
            MATVEC_ROW_BY_ROW
        };
        let (name, directives, reduction) = match subgroups {
            true => ("matvec_subgroup", SUBGROUPS_DIRECTIVE, MATVEC_SUBGROUP),
            false => ("matvec", "", MATVEC_WORKGROUP),
        };
        let parts = [BYTES, UNITS, ACTIVATION, block, quad_dot, MATVEC, reduction];
        let source = wgsl::assemble(directives, &consts, &parts);
        (format!("{name}_{ty}"), source)
    }

    /// The override constants of the pipeline with workgroup size
    /// MATVEC_WORKGROUP_SIZES[size] and `fusions`.
    fn constants(size: usize, fusions: u8) -> [(&'static str, f64); 6] {
        let bit = |b: u8| (fusions & b != 0) as u8 as f64;
        [
            ("WORKGROUP", MATVEC_WORKGROUP_SIZES[size] as f64),
            ("NORM", bit(NORM)),
            ("SILU", bit(SILU)),
            ("SWIGLU", bit(SWIGLU)),
            ("GELU", bit(GELU)),
            ("TOKENS", bit(TOKENS)),
        ]
    }

    /// The pipeline of `ty` with workgroup size MATVEC_WORKGROUP_SIZES[size] and `fusions`.
    fn pipeline(
        &self,
        ctx: &GpuContext,
        ty: TensorType,
        size: usize,
        fusions: u8,
    ) -> Result<wgpu::ComputePipeline> {
        let constants = Self::constants(size, fusions);
        self.shaders.pipeline(ctx, ty, (size, fusions), &constants)
    }
}

/// A matvec shader, compiled without wgpu's runtime checks (clamped indices, loop counters,
/// guarded divisions): decode reads every weight through it, and the checks cost it 5-15% on
/// an H200. In the browser the checks stay (create_shader_module_trusted is the plain one).
///
/// Every access of matvec.wgsl, its reductions and the block snippets' slice_x/slice_dot is in
/// range, from what `Kernels::matvec_with` checks and `GpuMatrix` builds:
/// - weights: slices run below `row_slices()`; rows are clamped to `rows - 1`
///   (matvec_row_by_row.wgsl) or, for the row-quad types, read by quads below
///   ceil(rows / 4), which weights.rs pads the part to (a workgroup's first row is a
///   multiple of ROWS_PER_THREAD, itself of ROW_QUAD = 4); so a slice's index is below the part's slices,
///   and weights.rs sizes each plane of a repacked part for all of them (its tests check the
///   sizes and where each element lands), and GGUF-layout parts hold whole rows of whole
///   blocks, padded to 16 bytes, which covers load_u32's second word at a block's end;
/// - x: slices cover `cols` elements (block types: whole units, read as vec4 below cols / 4;
///   F32 reads clamp to cols - 1) from token c's row at c × x_stride (c = the workgroup's
///   index mod tokens < tokens, x_stride a multiple of 4), and `x` holds at least
///   (tokens - 1) × x_stride + `cols` f32 (checked);
/// - y: stores go to c × y_stride + `first_row + r` for part rows r (first_row: the field's
///   offset plus the part's first row; y_stride the field's row width), below the field's
///   offset + `rows()` in token c's row, which `y` holds for every token (checked), and a
///   bias is read at the same index only when bound (checked to hold as many; x stands in
///   otherwise and is never read as one);
/// - a norm's weights are read as vec4 2s and 2s + 1 for slices s below `row_slices()`, so
///   below 8 × slices f32, which the bound buffer holds (checked; the weight part stands in
///   when there is no norm, and is never read as one); up likewise from up_offset plus
///   c × x_stride / 4 vec4s (checked);
/// - the tree reduction's arrays (TREE_SLOTS = MATVEC_TREE_MAX_WORKGROUP entries) are indexed
///   below WORKGROUP, at most that for this reduction; the subgroup reduction's
///   (SUBGROUP_SLOTS = MATVEC_SUBGROUP_SLOTS) by subgroup, below num_subgroups: a subgroup has
///   at least wgpu's MINIMUM_SUBGROUP_MIN_SIZE invocations, and the const assert above makes
///   the slots enough for the largest WORKGROUP;
/// - a workgroup's row group is its index / tokens, below the part's groups for every
///   workgroup that does not return at once (the dispatch has groups × tokens);
/// - a Partial's quads are indexed below QUADS = ROWS_PER_THREAD / 4 (loops over k < QUADS,
///   rows i < ROWS_PER_THREAD at i / 4, pairs k < ROWS_PER_THREAD / 2 at k / 2);
/// - every loop steps by at least 1 toward a fixed bound, and the only divisions are by
///   constants.
///
/// `tests/kernels.rs` runs its pipelines on awkward sizes (one-block rows, rows not a
/// multiple of the workgroup's, split parts, F32 rows ending inside a slice).
///
/// # Safety
/// `source` is matvec.wgsl with one of its reductions and a block snippet of BLOCK_TYPES
/// (`MatvecShaders::source`).
unsafe fn matvec_module(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ShaderModule {
    // SAFETY: every index is in range and every loop ends (see above).
    unsafe { trusted_module(ctx, label, source) }
}

impl Kernels {
    /// y = W·x for a weight matrix on the device (`x`: cols f32, `y`: rows f32); one dispatch
    /// per part of a split matrix.
    pub fn matvec(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let whole = RowField::whole(m.rows());
        self.matvec_with(ctx, plan, m, x, (y, whole), MatvecExtras::default())
    }

    /// y[at.offset + r] = (W·x)[r] (+ bias[at.offset + r]): a matvec writing its rows as a field
    /// of a wider row (`bias` as wide as that row), with a bias add fused in (the same f32
    /// rounding as a separate add). Stacked matrices and matrices writing side by side at their
    /// offsets compute the same values.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_at(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        at: RowField,
        bias: Option<&wgpu::Buffer>,
    ) -> Result<()> {
        let extras = MatvecExtras {
            bias,
            ..Default::default()
        };
        self.matvec_with(ctx, plan, m, x, (y, at), extras)
    }

    /// y += W·x: matvec with the residual add fused in (the same f32 rounding as a separate add).
    pub fn matvec_add(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let extras = MatvecExtras {
            accumulate: true,
            ..Default::default()
        };
        let whole = RowField::whole(m.rows());
        self.matvec_with(ctx, plan, m, x, (y, whole), extras)
    }

    /// y = W·x with what `extras` fuses in (an RMS norm of x, act · up, a bias, a residual
    /// add), written as the field `at` of y's row (`RowField::whole(m.rows())`: all of y).
    pub fn matvec_with(
        &self,
        ctx: &GpuContext,
        plan: &mut Plan,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        (y, at): (&wgpu::Buffer, RowField),
        extras: MatvecExtras,
    ) -> Result<()> {
        let tokens = extras.tokens.max(1);
        if tokens > MATVEC_MAX_TOKENS
            || (tokens > 1 && (!extras.x_width.is_multiple_of(4) || extras.x_width < m.cols()))
        {
            return Err(GpuError::Shape(format!(
                "matvec of {tokens} tokens (at most {MATVEC_MAX_TOKENS}) with x rows {} f32 apart (a multiple of 4, at least the {} columns)",
                extras.x_width,
                m.cols()
            )));
        }
        // f32 from one token's x (and up) to the next's
        let x_stride = if tokens > 1 { extras.x_width } else { 0 };
        check_len("matvec x", x, (tokens - 1) * x_stride + m.cols())?;
        if extras.swiglu {
            let odd = m.rows() % 2 == 1 || m.parts().iter().any(|p| p.first_row % 2 == 1);
            if odd || extras.bias.is_some() || extras.accumulate || extras.silu_up.is_some() {
                return Err(GpuError::Shape(format!(
                    "matvec: SwiGLU needs whole (gate, up) row pairs in every part and no bias, accumulate or silu · up ({} rows)",
                    m.rows()
                )));
            }
        }
        let y_rows = if extras.swiglu {
            m.rows() / 2
        } else {
            m.rows()
        };
        check_len("matvec y", y, at.end("matvec y", tokens, y_rows)?)?;
        if let Some(b) = extras.bias {
            check_len("matvec bias", b, at.end("matvec bias", 1, y_rows)?)?;
        }
        if let Some((weight, _)) = extras.norm {
            // read a slice (8 elements) at a time
            check_len("matvec norm weight", weight, m.slices() * 8)?;
        }
        if let Some((up, offset)) = extras.silu_up {
            if !offset.is_multiple_of(4) {
                return Err(GpuError::Shape(format!(
                    "matvec: up starts at element {offset}, not a multiple of 4"
                )));
            }
            check_len(
                "matvec up",
                up,
                offset + (tokens - 1) * x_stride + m.slices() * 8,
            )?;
        }
        // Workgroups of the first part, the largest: parts are dispatched one after another.
        let workgroups = m.parts()[0].rows.div_ceil(MATVEC_ROWS_PER_THREAD);
        let shaders = self.matvec_subgroup.as_ref().unwrap_or(&self.matvec);
        let size = matvec_size_index(m.slices(), workgroups, shaders.sizes);
        let gated = extras.silu_up.is_some() || extras.swiglu;
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        let fusions = bit(extras.norm.is_some(), NORM)
            | bit(extras.silu_up.is_some(), SILU)
            | bit(extras.swiglu, SWIGLU)
            | bit(gated && extras.activation.is_gelu(), GELU)
            | bit(tokens > 1, TOKENS);
        let pipeline = &shaders.pipeline(ctx, m.ty(), size, fusions)?;
        for part in m.parts() {
            let params = MatvecParams {
                layout: m.layout(part),
                rows: u32_arg("rows", part.rows)?,
                cols: u32_arg("cols", m.cols())?,
                first_row: u32_arg("first row", at.offset + part.first_row)?,
                accumulate: extras.accumulate as u32,
                bias: extras.bias.is_some() as u32,
                eps: extras.norm.map_or(0.0, |(_, eps)| eps),
                up_offset: u32_arg("up offset", extras.silu_up.map_or(0, |(_, o)| o / 4))?,
                x_stride: u32_arg("x stride", x_stride)?,
                y_stride: u32_arg("y stride", if tokens > 1 { at.width } else { 0 })?,
                tokens: u32_arg("tokens", tokens)?,
                pad: [0; 2],
            };
            // a workgroup per (row group, token), the tokens of a row group side by side
            let groups = u32_arg(
                "matvec workgroups",
                part.rows.div_ceil(MATVEC_ROWS_PER_THREAD) * tokens,
            )?;
            let name = format!(
                "matvec{}{}{}{} {} {}x{}",
                if tokens > 1 {
                    format!("[{tokens}]")
                } else {
                    String::new()
                },
                if extras.norm.is_some() { "+norm" } else { "" },
                if extras.silu_up.is_some() {
                    "+silu"
                } else if extras.swiglu {
                    "+swiglu"
                } else {
                    ""
                },
                if fusions & GELU != 0 { "(gelu)" } else { "" },
                m.ty(),
                part.rows,
                m.cols()
            );
            // Without a bias, x is bound in its place, and without a norm the weights (at
            // least a vec4): read-only, never read as them.
            let bias = extras.bias.unwrap_or(x);
            let norm = extras.norm.map_or(&part.buffer, |(weight, _)| weight);
            let up = extras.silu_up.map_or(&part.buffer, |(up, _)| up);
            let buffers = [&part.buffer, x, y, bias, norm, up];
            Self::dispatch(ctx, plan, name, pipeline, &params, &buffers, groups)?;
        }
        Ok(())
    }
}

/// Every matvec shader and the pipelines made of it (shaders_test.rs).
#[cfg(test)]
pub(super) fn variants() -> Vec<wgsl::Variant> {
    let mut variants = Vec::new();
    for subgroups in [false, true] {
        let sizes = MATVEC_WORKGROUP_SIZES
            .iter()
            .filter(|&&n| n <= MatvecShaders::largest(subgroups))
            .count();
        for &(ty, block) in &BLOCK_TYPES {
            let (label, source) = MatvecShaders::source(ty, block, subgroups);
            let mut v = wgsl::Variant::main::<MatvecParams>(label, source);
            v.pipelines = (0..sizes)
                .flat_map(|size| {
                    fusion_sets()
                        .into_iter()
                        .map(move |f| MatvecShaders::constants(size, f).to_vec())
                })
                .collect();
            variants.push(v);
        }
    }
    variants
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_workgroups_grow_with_rows_and_stop_at_the_allowed_size() {
        let size = |slices, rows: usize, sizes| {
            let i = matvec_size_index(slices, rows.div_ceil(MATVEC_ROWS_PER_THREAD), sizes);
            MATVEC_WORKGROUP_SIZES[i]
        };
        // 2048 columns (256 slices), 11008 rows: many workgroups, 4 slices a thread
        assert_eq!(size(256, 11008, 4), 64);
        // the down projection, 2048 rows of 11008 columns: few workgroups, long rows
        assert_eq!(size(1376, 2048, 4), 512);
        assert_eq!(size(1376, 2048, 3), 256);
        // never more threads than slices (a 32-column matrix has 4)
        assert_eq!(size(4, 1, 4), 64);
    }
}
