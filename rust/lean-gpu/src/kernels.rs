//! Compute pipelines of the WGSL kernels and functions that record one dispatch each into a
//! command encoder. Sizes are checked here (wgpu would clamp out-of-bounds accesses silently).
//!
//! The matvec and matmul kernels are one shader per tensor type, assembled at pipeline creation
//! as `bytes.wgsl + quant_<type>.wgsl + matvec.wgsl` (or `matmul.wgsl`): WGSL has no includes,
//! and override constants cannot swap the block decoder, so each skeleton (rows, tiles,
//! reductions) is written once and each type contributes only its block layout (`part_dot` for
//! matvec, `weight_at` for matmul's tiles).
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::weights::GpuMatrix;
use lean_gguf::TensorType;

const BYTES: &str = include_str!("shaders/bytes.wgsl");
const MATVEC: &str = include_str!("shaders/matvec.wgsl");
const MATMUL: &str = include_str!("shaders/matmul.wgsl");
/// Rows and tokens per matmul workgroup tile (matmul.wgsl: TILE).
const MATMUL_TILE: usize = 32;
/// Rows per matvec workgroup (matvec.wgsl: WORKGROUP / THREADS_PER_ROW).
const MATVEC_ROWS_PER_GROUP: u32 = 8;
/// Threads per workgroup of the element-wise kernels (rope, silu_mul, add).
const ELEMENTWISE_GROUP: u32 = 64;

/// The tensor types with matvec and matmul kernels, and their block decoders.
const MATVEC_TYPES: [(TensorType, &str); 7] = [
    (TensorType::F32, include_str!("shaders/quant_f32.wgsl")),
    (TensorType::Q4_0, include_str!("shaders/quant_q4_0.wgsl")),
    (TensorType::Q4_1, include_str!("shaders/quant_q4_1.wgsl")),
    (TensorType::Q5_0, include_str!("shaders/quant_q5_0.wgsl")),
    (TensorType::Q8_0, include_str!("shaders/quant_q8_0.wgsl")),
    (TensorType::Q4_K, include_str!("shaders/quant_q4_k.wgsl")),
    (TensorType::Q6_K, include_str!("shaders/quant_q6_k.wgsl")),
];

/// Whether `matvec` and `matmul` support weights of type `ty`.
pub fn matvec_supports(ty: TensorType) -> bool {
    MATVEC_TYPES.iter().any(|(t, _)| *t == ty)
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    weight_offset: u32,
    first_row: u32,
    pad: [u32; 3],
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    weight_offset: u32,
    first_row: u32,
    n_tokens: u32,
    out_stride: u32,
    row_tiles: u32,
}

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
struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    pos0: u32,
    neox: u32,
    pad: [u32; 2],
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    len: u32,
    capacity: u32,
    cache_offset: u32,
    scale: f32,
    pad: u32,
}

#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct CountParams {
    n: u32,
    extra: u32,
    pad: [u32; 2],
}

/// Which elements of a head rotate together (see lean's `RopeStyle`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// (2i, 2i + 1): llama GGUFs.
    Interleaved,
    /// (i, i + rope_dim / 2): qwen2 GGUFs.
    Neox,
}

/// Shape of one rope dispatch: `n_tokens` rows of `n_heads` heads of `head_dim`, the first
/// token at position `pos0`.
#[derive(Copy, Clone, Debug)]
pub struct RopeShape {
    pub n_tokens: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub pos0: usize,
    pub pairing: RopePairing,
}

/// Shape of one decode attention: the cache holds `capacity` positions per kv head, of which
/// the first `len` are attended to; this layer's keys/values start at element `cache_offset`.
#[derive(Copy, Clone, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub len: usize,
    pub capacity: usize,
    pub cache_offset: usize,
}

/// cos/sin for positions 0..positions and frequencies 0..rope_dim/2, as (cos, sin) pairs,
/// computed exactly as lean's CPU `RopeTable` (HF's float32 inv_freq and angles).
pub fn rope_cos_sin(rope_dim: usize, base: f32, linear_factor: f32, positions: usize) -> Vec<[f32; 2]> {
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

/// All compiled pipelines.
pub struct Kernels {
    matvec: Vec<(TensorType, wgpu::ComputePipeline)>,
    matmul: Vec<(TensorType, wgpu::ComputePipeline)>,
    rms_norm: wgpu::ComputePipeline,
    rope: wgpu::ComputePipeline,
    attention: wgpu::ComputePipeline,
    silu_mul: wgpu::ComputePipeline,
    add: wgpu::ComputePipeline,
    argmax: wgpu::ComputePipeline,
}

fn pipeline(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ComputePipeline {
    let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

fn for_type(pipelines: &[(TensorType, wgpu::ComputePipeline)], ty: TensorType) -> Result<&wgpu::ComputePipeline> {
    pipelines.iter().find(|(t, _)| *t == ty).map(|(_, p)| p).ok_or(GpuError::UnsupportedType(ty))
}

fn u32_arg(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::TooLarge(format!("{what} = {v} exceeds u32")))
}

/// Checks that `buffer` holds at least `len` f32.
fn check_len(what: &str, buffer: &wgpu::Buffer, len: usize) -> Result<()> {
    if (buffer.size() / 4) < len as u64 {
        return Err(GpuError::Shape(format!("{what} holds {} f32, needs {len}", buffer.size() / 4)));
    }
    Ok(())
}

impl Kernels {
    /// Compiles every kernel. A shader the device rejects is reported as `GpuError::Shader`
    /// (a bug of this crate or of the driver), not a panic.
    pub async fn new(ctx: &GpuContext) -> Result<Self> {
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let matvec = MATVEC_TYPES
            .iter()
            .map(|&(ty, block)| {
                let source = format!("{BYTES}\n{block}\n{MATVEC}");
                (ty, pipeline(ctx, &format!("matvec_{ty}"), &source))
            })
            .collect();
        let matmul = MATVEC_TYPES
            .iter()
            .map(|&(ty, block)| {
                let source = format!("{BYTES}\n{block}\n{MATMUL}");
                (ty, pipeline(ctx, &format!("matmul_{ty}"), &source))
            })
            .collect();
        let kernels = Kernels {
            matvec,
            matmul,
            rms_norm: pipeline(ctx, "rms_norm", include_str!("shaders/rms_norm.wgsl")),
            rope: pipeline(ctx, "rope", include_str!("shaders/rope.wgsl")),
            attention: pipeline(ctx, "attention", include_str!("shaders/attention.wgsl")),
            silu_mul: pipeline(ctx, "silu_mul", include_str!("shaders/silu_mul.wgsl")),
            add: pipeline(ctx, "add", include_str!("shaders/add.wgsl")),
            argmax: pipeline(ctx, "argmax", include_str!("shaders/argmax.wgsl")),
        };
        match scope.pop().await {
            Some(e) => Err(GpuError::Shader(e.to_string())),
            None => Ok(kernels),
        }
    }

    /// Records one dispatch of `groups` workgroups, spread over two dimensions when it exceeds
    /// the per-dimension limit; binding i of group 0 is `buffers[i]`, binding 0 the params.
    fn dispatch<P: bytemuck::Pod>(
        ctx: &GpuContext,
        encoder: &mut wgpu::CommandEncoder,
        pipeline: &wgpu::ComputePipeline,
        params: &P,
        buffers: &[&wgpu::Buffer],
        groups: u32,
    ) -> Result<()> {
        let max_dim = ctx.limits().max_compute_workgroups_per_dimension.max(1);
        let (x, y) = if groups <= max_dim { (groups, 1) } else { (max_dim, groups.div_ceil(max_dim)) };
        if y > max_dim {
            return Err(GpuError::TooLarge(format!("{groups} workgroups exceed the dispatch limit")));
        }
        let uniform = ctx.uniform("params", params);
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        entries.extend(
            buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.as_entire_binding() }),
        );
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }

    /// y = W·x for a weight matrix on the device (`x`: cols f32, `y`: rows f32); one dispatch
    /// per part of a split matrix.
    pub fn matvec(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, m: &GpuMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer) -> Result<()> {
        let pipeline = for_type(&self.matvec, m.ty())?;
        check_len("matvec x", x, m.cols())?;
        check_len("matvec y", y, m.rows())?;
        for part in m.parts() {
            let params = MatvecParams {
                rows: u32_arg("rows", part.rows)?,
                cols: u32_arg("cols", m.cols())?,
                row_bytes: u32_arg("row bytes", m.row_bytes())?,
                weight_offset: 0,
                first_row: u32_arg("first row", part.first_row)?,
                pad: [0; 3],
            };
            let groups = u32_arg("matvec workgroups", part.rows.div_ceil(MATVEC_ROWS_PER_GROUP as usize))?;
            Self::dispatch(ctx, encoder, pipeline, &params, &[&part.buffer, x, y], groups)?;
        }
        Ok(())
    }

    /// Prefill: y = x·Wᵀ for `n_tokens` rows of x (`x`: n_tokens × cols, `y`: n_tokens × rows,
    /// the layout of lean_quant::matmul); one dispatch per part of a split matrix.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, m: &GpuMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, n_tokens: usize) -> Result<()> {
        let pipeline = for_type(&self.matmul, m.ty())?;
        if n_tokens == 0 {
            return Err(GpuError::Shape("matmul of no tokens".into()));
        }
        check_len("matmul x", x, n_tokens * m.cols())?;
        check_len("matmul y", y, n_tokens * m.rows())?;
        for part in m.parts() {
            let row_tiles = part.rows.div_ceil(MATMUL_TILE);
            let params = MatmulParams {
                rows: u32_arg("rows", part.rows)?,
                cols: u32_arg("cols", m.cols())?,
                row_bytes: u32_arg("row bytes", m.row_bytes())?,
                weight_offset: 0,
                first_row: u32_arg("first row", part.first_row)?,
                n_tokens: u32_arg("tokens", n_tokens)?,
                out_stride: u32_arg("rows", m.rows())?,
                row_tiles: u32_arg("row tiles", row_tiles)?,
            };
            let groups = u32_arg("matmul workgroups", row_tiles * n_tokens.div_ceil(MATMUL_TILE))?;
            Self::dispatch(ctx, encoder, pipeline, &params, &[&part.buffer, x, y], groups)?;
        }
        Ok(())
    }

    /// out = rms_norm(x) · weight for `n_rows` rows of `weight.len()` (= n) elements.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, x: &wgpu::Buffer, weight: &wgpu::Buffer, out: &wgpu::Buffer, n: usize, n_rows: usize, eps: f32) -> Result<()> {
        check_len("rms_norm x", x, n * n_rows)?;
        check_len("rms_norm weight", weight, n)?;
        check_len("rms_norm out", out, n * n_rows)?;
        let params = RmsNormParams { n: u32_arg("n", n)?, n_rows: u32_arg("rows", n_rows)?, eps, pad: 0 };
        Self::dispatch(ctx, encoder, &self.rms_norm, &params, &[x, weight, out], params.n_rows)
    }

    /// Rotates `x` in place (`n_tokens × n_heads × head_dim`) with a table from `rope_cos_sin`
    /// uploaded as `cos_sin` (it must cover positions up to pos0 + n_tokens).
    pub fn rope(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, x: &wgpu::Buffer, cos_sin: &wgpu::Buffer, s: RopeShape) -> Result<()> {
        if !s.rope_dim.is_multiple_of(2) || s.rope_dim > s.head_dim {
            return Err(GpuError::Shape(format!("rope_dim {} must be even and at most head_dim {}", s.rope_dim, s.head_dim)));
        }
        let half = s.rope_dim / 2;
        check_len("rope x", x, s.n_tokens * s.n_heads * s.head_dim)?;
        check_len("rope table", cos_sin, (s.pos0 + s.n_tokens) * half * 2)?;
        let params = RopeParams {
            n_tokens: u32_arg("tokens", s.n_tokens)?,
            n_heads: u32_arg("heads", s.n_heads)?,
            head_dim: u32_arg("head_dim", s.head_dim)?,
            rope_dim: u32_arg("rope_dim", s.rope_dim)?,
            pos0: u32_arg("pos0", s.pos0)?,
            neox: (s.pairing == RopePairing::Neox) as u32,
            pad: [0; 2],
        };
        let groups = u32_arg("rope workgroups", (s.n_tokens * s.n_heads * half).div_ceil(ELEMENTWISE_GROUP as usize))?;
        Self::dispatch(ctx, encoder, &self.rope, &params, &[x, cos_sin], groups)
    }

    /// Decode attention of one token: `q` (n_heads × head_dim) against the first `len` cached
    /// positions; `scores` is scratch of n_heads × capacity f32; `out` gets n_heads × head_dim.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, q: &wgpu::Buffer, keys: &wgpu::Buffer, values: &wgpu::Buffer, scores: &wgpu::Buffer, out: &wgpu::Buffer, s: AttentionShape) -> Result<()> {
        if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) || s.len == 0 || s.len > s.capacity {
            return Err(GpuError::Shape(format!("attention of {} heads over {} kv heads, {} of {} positions", s.n_heads, s.n_kv_heads, s.len, s.capacity)));
        }
        let cache_end = s.cache_offset + s.n_kv_heads * s.capacity * s.head_dim;
        check_len("attention q", q, s.n_heads * s.head_dim)?;
        check_len("attention keys", keys, cache_end)?;
        check_len("attention values", values, cache_end)?;
        check_len("attention scores", scores, s.n_heads * s.capacity)?;
        check_len("attention out", out, s.n_heads * s.head_dim)?;
        let params = AttentionParams {
            n_heads: u32_arg("heads", s.n_heads)?,
            n_kv_heads: u32_arg("kv heads", s.n_kv_heads)?,
            head_dim: u32_arg("head_dim", s.head_dim)?,
            len: u32_arg("len", s.len)?,
            capacity: u32_arg("capacity", s.capacity)?,
            cache_offset: u32_arg("cache offset", s.cache_offset)?,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            pad: 0,
        };
        if params.n_heads > ctx.limits().max_compute_workgroups_per_dimension {
            return Err(GpuError::TooLarge(format!("{} heads exceed the dispatch limit", s.n_heads)));
        }
        Self::dispatch(ctx, encoder, &self.attention, &params, &[q, keys, values, scores, out], params.n_heads)
    }

    /// out = silu(gate) · up, element-wise over n.
    pub fn silu_mul(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, gate: &wgpu::Buffer, up: &wgpu::Buffer, out: &wgpu::Buffer, n: usize) -> Result<()> {
        for (what, b) in [("silu_mul gate", gate), ("silu_mul up", up), ("silu_mul out", out)] {
            check_len(what, b, n)?;
        }
        let params = CountParams { n: u32_arg("n", n)?, extra: 0, pad: [0; 2] };
        Self::dispatch(ctx, encoder, &self.silu_mul, &params, &[gate, up, out], params.n.div_ceil(ELEMENTWISE_GROUP))
    }

    /// x[i] += y[i % y_len] for i < n: the residual add (y_len = n) or a bias per row.
    pub fn add(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, x: &wgpu::Buffer, y: &wgpu::Buffer, n: usize, y_len: usize) -> Result<()> {
        if y_len == 0 || !n.is_multiple_of(y_len) {
            return Err(GpuError::Shape(format!("add: {n} elements are not whole rows of {y_len}")));
        }
        check_len("add x", x, n)?;
        check_len("add y", y, y_len)?;
        let params = CountParams { n: u32_arg("n", n)?, extra: u32_arg("y_len", y_len)?, pad: [0; 2] };
        Self::dispatch(ctx, encoder, &self.add, &params, &[x, y], params.n.div_ceil(ELEMENTWISE_GROUP))
    }

    /// result[0] = index of the largest of the first n values (the first on ties).
    pub fn argmax(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, values: &wgpu::Buffer, result: &wgpu::Buffer, n: usize) -> Result<()> {
        if n == 0 {
            return Err(GpuError::Shape("argmax of no values".into()));
        }
        check_len("argmax values", values, n)?;
        check_len("argmax result", result, 1)?;
        let params = CountParams { n: u32_arg("n", n)?, extra: 0, pad: [0; 2] };
        Self::dispatch(ctx, encoder, &self.argmax, &params, &[values, result], 1)
    }
}
