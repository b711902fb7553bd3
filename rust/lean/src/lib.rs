//! lean: a small LLM inference engine. GGUF bytes → model → tokens.
//!
//! * [`model`]: loading, one file per architecture ([`config`] holds the hyper-parameters)
//! * [`cpu`]: the CPU backend (SIMD kernels from `lean-quant`, rayon threads)
//! * [`sampling`]: logits processors and samplers with transformers' semantics
//! * [`engine`]: tokenizer + model + backend, the generation loop
//! * [`speculative`]: drafts for speculative decoding (greedy-exact)
//! * [`tools`]: tool calls (OpenAI's `tools`/`tool_choice`): templates, call syntaxes, forced calls
pub mod clock;
pub mod config;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod inflate;
pub mod model;
pub mod sampling;
pub mod session;
pub mod speculative;
pub mod synthetic;
pub mod tools;

pub use clock::set_clock;
pub use config::{Architecture, ModelConfig};
pub use engine::{
    ActiveGeneration, BackendChange, BackendChangeHook, Ended, Engine, FinishReason,
    GenerateOptions, Generation, Prompt, Step, Timings, TokenEvent,
};
pub use error::{LeanError, Result};
pub use lean_gguf as gguf;
pub use lean_quant as quant;
pub use lean_tokenizer as tokenizer;
pub use lean_tokenizer::{ChatMessage, Tokenizer};
pub use model::{Model, ModelBytes, PartialBytes};
pub use sampling::SamplingParams;
pub use session::{Logits, Session, TokenMask};
pub use speculative::{Speculation, SpeculationStats};
