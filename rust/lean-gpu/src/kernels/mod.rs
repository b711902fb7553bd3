//! Compute pipelines of the WGSL kernels (src/shaders/) and functions that record one dispatch
//! each into a plan. Sizes are checked here (wgpu would clamp out-of-bounds accesses silently).
//!
//! One module per kernel family, each holding its params structs, checks, pipeline creation and
//! dispatch: matvec (decode's products), matmul (prefill's), embed, norm (rms_norm,
//! rms_norm_add, head_rms_norm), rope_kv_store, attention (split-K, combine, prefill), gated
//! (act(gate) · up), argmax and argmax_masked (greedy under a constraint). This module holds
//! `Kernels` (every pipeline, made in `Kernels::new`), the helpers they share, and `wgsl`, which
//! assembles every shader's source.
//!
//! The matvec, matmul and embed kernels are one shader per tensor type, assembled at pipeline
//! creation as `bytes.wgsl + units.wgsl + activation.wgsl + quant_<type>.wgsl + <skeleton>`:
//! WGSL has no includes, and override constants cannot swap the block decoder, so each skeleton
//! (rows, tiles, reductions) is written once and each type contributes only its block layout
//! (`slice_x`/`slice_dot` for matvec, `slice_weights` for matmul's tiles, `weight_at` for
//! embed).
//!
//! Decode is one matvec per weight matrix (a layer's q|k|v and gate|up are one matrix each
//! where they stack, see stack.rs; a matrix may write its rows as a field of wider rows,
//! `RowField`, so separate ones fill the same rows), bound by memory bandwidth: weights of the
//! common types are repacked at upload into planes of a word per 8-element slice (weights.rs);
//! neighbouring threads take neighbouring slices, so their loads of weights and activations
//! are contiguous, and each thread dots its slice of x with the workgroup's 4 rows. The threads
//! sum their partial dots in workgroup memory (matvec_workgroup.wgsl), or, when asked for, with
//! subgroupAdd (matvec_subgroup.wgsl).
//!
//! Prefill is one matmul per weight matrix, bound by f32 FMAs: register-tiled (matmul.wgsl),
//! with K split over more workgroups when a matrix has too few tiles to fill the device, the
//! partial sums added up by a second pass (matmul_reduce.wgsl).
//!
//! # How Rust values reach WGSL
//!
//! - A value both sides need (a workgroup size the dispatch counts on, a tile, a chunk, an
//!   array bound such as MAX_HEAD_DIM) is a Rust constant, given to the shader as a `const` of a
//!   header that `wgsl::Consts` generates and `wgsl::assemble` puts first. The shader declares
//!   no copy of it (it names it, and says where it comes from); a shader built in several
//!   variants (attention per largest head) gets one header per variant.
//! - A switch between pipelines of one module (matvec's WORKGROUP, NORM, SILU, SWIGLU, GELU;
//!   matmul's BIAS, SWIGLU, GELU; rms_norm's ADD) is a WGSL `override`, set per pipeline at
//!   creation: these only select code paths or the workgroup size, never size an array
//!   (function-scope arrays need `const` sizes).
//! - Per-dispatch values are the params uniform at binding 0 (a `#[repr(C)]` struct per shader,
//!   the same size as its WGSL struct) and the step buffer.
//!
//! Constants private to one shader (e.g. rms_norm's HELD) stay in it. The crate's tests
//! assemble every variant as pipeline creation does and validate it with naga, and check each
//! params struct's size against its WGSL struct (shaders_test.rs).
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::plan::Plan;
use lean_gguf::TensorType;

mod argmax;
mod argmax_masked;
mod attention;
mod embed;
mod gated;
mod matmul;
mod matvec;
mod norm;
mod rope_kv_store;
#[cfg(test)]
mod shaders_test;
mod wgsl;

pub use argmax::argmax_len;
pub use argmax_masked::{argmax_masked_len, mask_words, NO_TOKEN};
pub use attention::{fresh_rope_supported, AttentionShape, FreshTokens, MAX_HEAD_DIM};
pub use gated::Activation;
pub use matmul::MatmulExtras;
pub use matvec::{matvec_supports, MatvecExtras, MATVEC_MAX_TOKENS};
pub use rope_kv_store::{rope_cos_sin, Rope, RopePairing};

/// Threads per workgroup of the element-wise kernels (embed, rope_kv_store, gated).
const ELEMENTWISE_GROUP: usize = 64;

/// All compiled pipelines.
pub struct Kernels {
    /// Matvecs reducing in workgroup memory, and with subgroupAdd (`with_subgroup_matvec`).
    matvec: matvec::MatvecShaders,
    matvec_subgroup: Option<matvec::MatvecShaders>,
    matmul: matmul::MatmulPipelines,
    embed: Vec<(TensorType, wgpu::ComputePipeline)>,
    norm: norm::NormPipelines,
    rope_kv_store: wgpu::ComputePipeline,
    attention: attention::AttentionPipelines,
    gated: wgpu::ComputePipeline,
    argmax: argmax::ArgmaxPipelines,
    argmax_masked: argmax_masked::ArgmaxMaskedPipelines,
}

impl Kernels {
    /// Compiles every kernel, in core WGSL (what every adapter and browser runs). A shader the
    /// device rejects is reported as `GpuError::Shader` (a bug of this crate or of the driver),
    /// not a panic.
    pub async fn new(ctx: &GpuContext) -> Result<Self> {
        Self::build(ctx, false).await
    }

    /// As `new`, with matvecs that sum their threads' partial dots with subgroupAdd instead of
    /// a tree in workgroup memory; `GpuError::MissingFeatures` unless the device has
    /// wgpu::Features::SUBGROUP. lean-cli uses it natively where the adapter has subgroups (on
    /// an H200, decode 1-3% faster in whole models); the browser build keeps `new` until this
    /// path is tested on browsers' WebGPU.
    pub async fn with_subgroup_matvec(ctx: &GpuContext) -> Result<Self> {
        if !ctx.features().contains(wgpu::Features::SUBGROUP) {
            return Err(GpuError::MissingFeatures("SUBGROUP".into()));
        }
        Self::build(ctx, true).await
    }

    /// Whether matvecs reduce with subgroup operations.
    pub fn uses_subgroups(&self) -> bool {
        self.matvec_subgroup.is_some()
    }

    async fn build(ctx: &GpuContext, subgroups: bool) -> Result<Self> {
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let kernels = Kernels {
            matvec: matvec::MatvecShaders::new(ctx, false),
            matvec_subgroup: subgroups.then(|| matvec::MatvecShaders::new(ctx, true)),
            matmul: matmul::MatmulPipelines::new(ctx),
            embed: embed::pipelines(ctx),
            norm: norm::NormPipelines::new(ctx),
            rope_kv_store: rope_kv_store::pipeline(ctx),
            attention: attention::AttentionPipelines::new(ctx),
            gated: gated::pipeline(ctx),
            argmax: argmax::ArgmaxPipelines::new(ctx),
            argmax_masked: argmax_masked::ArgmaxMaskedPipelines::new(ctx),
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
        plan: &mut Plan,
        name: String,
        pipeline: &wgpu::ComputePipeline,
        params: &P,
        buffers: &[&wgpu::Buffer],
        groups: u32,
    ) -> Result<()> {
        let max_dim = ctx.limits().max_compute_workgroups_per_dimension.max(1);
        // Rows (y) of equal length, as few as fit: only groups past `groups` in the last row
        // are extra, and the kernels return from those at once.
        let y = groups.div_ceil(max_dim);
        let x = groups.div_ceil(y.max(1));
        if y > max_dim {
            return Err(GpuError::TooLarge(format!(
                "{groups} workgroups exceed the dispatch limit"
            )));
        }
        let uniform = ctx.uniform("params", params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        entries.extend(
            buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32 + 1,
                    resource: b.as_entire_binding(),
                }),
        );
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        plan.push_dispatch(name, pipeline, bind_group, uniform, (x, y));
        Ok(())
    }
}

/// Where a field lies in an activation buffer of a row per token: rows of `width` f32, the
/// field's elements from `offset`. The layer's projections write one buffer of [token][q | k |
/// v] (and [token][gate | up]) so that a stacked matrix fills it in one dispatch; the kernels
/// that read such fields take their place this way.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RowField {
    pub width: usize,
    pub offset: usize,
}

impl RowField {
    /// Rows that are all field: `width` elements from offset 0.
    pub fn whole(width: usize) -> Self {
        RowField { width, offset: 0 }
    }

    /// The f32 a buffer needs for `n_rows` rows holding this field of `len` elements; an error
    /// naming `what` when the field does not fit in a row.
    fn end(&self, what: &str, n_rows: usize, len: usize) -> Result<usize> {
        if self
            .offset
            .checked_add(len)
            .is_none_or(|end| end > self.width)
            || n_rows == 0
        {
            return Err(GpuError::Shape(format!(
                "{what}: {n_rows} rows of a field of {len} at {} in rows of {}",
                self.offset, self.width
            )));
        }
        Ok((n_rows - 1) * self.width + self.offset + len)
    }

    /// (width, offset) as shader parameters.
    fn params(&self) -> Result<[u32; 2]> {
        Ok([
            u32_arg("row width", self.width)?,
            u32_arg("field offset", self.offset)?,
        ])
    }
}

/// The per-step values of a replayed plan: the position of the first token of the step (the
/// WGSL struct `Step` of rope_kv_store and the attention kernels).
#[repr(C)]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
struct StepValues {
    pos0: u32,
    pad: [u32; 3],
}

/// A uniform buffer with the step values (position of the step's first token), read by
/// rope_kv_store and attention; rewritten with `set` before each submit of a plan.
pub struct StepBuffer {
    buffer: wgpu::Buffer,
}

impl StepBuffer {
    pub fn new(ctx: &GpuContext) -> Self {
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step"),
            size: std::mem::size_of::<StepValues>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        StepBuffer { buffer }
    }

    /// Queues the write; it lands before any later submit.
    pub fn set(&self, ctx: &GpuContext, pos0: usize) -> Result<()> {
        let values = StepValues {
            pos0: u32_arg("position", pos0)?,
            pad: [0; 3],
        };
        ctx.queue
            .write_buffer(&self.buffer, 0, bytemuck::bytes_of(&values));
        Ok(())
    }

    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

/// A shader module per tensor type and its pipelines per `K` (a choice of override constants),
/// each made on first use: a model uses a few of them.
struct TypedShaders<K> {
    label: &'static str,
    modules: Vec<(TensorType, wgpu::ShaderModule)>,
    pipelines: std::sync::Mutex<std::collections::HashMap<(TensorType, K), wgpu::ComputePipeline>>,
}

impl<K: Copy + Eq + std::hash::Hash> TypedShaders<K> {
    fn new(label: &'static str, modules: Vec<(TensorType, wgpu::ShaderModule)>) -> Self {
        TypedShaders {
            label,
            modules,
            pipelines: Default::default(),
        }
    }

    /// The pipeline of `ty` for `key`, built with `constants` the first time.
    fn pipeline(
        &self,
        ctx: &GpuContext,
        ty: TensorType,
        key: K,
        constants: &[(&str, f64)],
    ) -> Result<wgpu::ComputePipeline> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&(ty, key)) {
            return Ok(p.clone());
        }
        let (_, module) = self
            .modules
            .iter()
            .find(|(t, _)| *t == ty)
            .ok_or(GpuError::UnsupportedType(ty))?;
        let label = format!("{}_{ty}", self.label);
        let pipeline = pipeline_of(ctx, &label, module, "main", constants);
        pipelines.insert((ty, key), pipeline.clone());
        Ok(pipeline)
    }
}

/// A shader module of the WGSL `source`, with wgpu's runtime checks.
fn module(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ShaderModule {
    ctx.device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        })
}

/// The pipeline of the WGSL `source`'s `main`.
fn pipeline(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ComputePipeline {
    pipeline_of(ctx, label, &module(ctx, label, source), "main", &[])
}

/// A shader module compiled without wgpu's runtime bounds checks (browsers keep theirs).
///
/// # Safety
/// Every index of `source` must be in range and every loop must end, for every dispatch the
/// caller records (the callers document why).
unsafe fn trusted_module(ctx: &GpuContext, label: &str, source: &str) -> wgpu::ShaderModule {
    if runtime_checks_forced() {
        return module(ctx, label, source);
    }
    let descriptor = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    // SAFETY: the caller's contract.
    unsafe {
        ctx.device
            .create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
    }
}

/// `LEAN_GPU_RUNTIME_CHECKS=1`: every shader keeps wgpu's runtime checks, as in a browser (a
/// benchmark's proxy for what the browser's robustness checks cost).
fn runtime_checks_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        !cfg!(target_arch = "wasm32")
            && std::env::var("LEAN_GPU_RUNTIME_CHECKS").is_ok_and(|v| v == "1")
    })
}

/// The compute pipeline of `module`'s `entry` point, with override `constants`.
fn pipeline_of(
    ctx: &GpuContext,
    label: &str,
    module: &wgpu::ShaderModule,
    entry: &str,
    constants: &[(&str, f64)],
) -> wgpu::ComputePipeline {
    ctx.device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants,
                ..Default::default()
            },
            cache: None,
        })
}

fn for_type(
    pipelines: &[(TensorType, wgpu::ComputePipeline)],
    ty: TensorType,
) -> Result<&wgpu::ComputePipeline> {
    pipelines
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, p)| p)
        .ok_or(GpuError::UnsupportedType(ty))
}

fn u32_arg(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::TooLarge(format!("{what} = {v} exceeds u32")))
}

/// Checks that `buffer` holds at least `len` f32.
fn check_len(what: &str, buffer: &wgpu::Buffer, len: usize) -> Result<()> {
    if (buffer.size() / 4) < len as u64 {
        return Err(GpuError::Shape(format!(
            "{what} holds {} f32, needs {len}",
            buffer.size() / 4
        )));
    }
    Ok(())
}
