//! lean's GPU backend: wgpu (Vulkan, Metal, DX12 natively; WebGPU in browsers) running
//! hand-written WGSL kernels on weights kept packed as in the GGUF file.
//!
//! Nothing here blocks: readback is an async buffer map, so the same code runs in a browser.
//! Only core WGSL is used (no shader-f16, no subgroups), so every adapter can run it.
mod context;
mod error;
mod kernels;
mod plan;
mod profile;
mod session;
mod stack;
mod stream;
mod weights;

pub use context::GpuContext;
pub use error::{GpuError, Result};
pub use kernels::{
    argmax_len, argmax_masked_len, fresh_rope_supported, mask_words, matvec_supports, rope_cos_sin,
    Activation, AttentionShape, FreshTokens, Kernels, MatmulExtras, MatvecExtras, Rope,
    RopePairing, RowField, StepBuffer, MATVEC_MAX_TOKENS, MAX_HEAD_DIM, NO_TOKEN,
};
pub use plan::Plan;
pub use session::{to_lean as session_error, GpuModel, GpuSession};
pub use stream::StreamedModel;
pub use weights::{GpuMatrix, WeightPart};
pub use wgpu;
