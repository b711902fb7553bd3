//! WebAssembly bindings of lean: a [`WasmEngine`] built from a GGUF (streamed into wasm memory
//! chunk by chunk through a [`ModelLoader`]) and its tokenizer: the tokenizer files when given,
//! else the GGUF's own metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
//!
//! Two backends: the CPU ([`ModelLoader`]: simd128 kernels, on rayon's Web Worker pool in the
//! `threads` build) and the GPU through WebGPU ([`GpuModelLoader`]: lean-gpu's kernels on wgpu).
//!
//! Generation is resumable: [`WasmEngine::begin`] runs the prompt, then each
//! [`WasmEngine::step`] produces one token; both return Promises. The Web Worker that drives it
//! returns to its event loop between tokens and so sees an abort message within one token. One
//! synchronous call for the whole generation could only be interrupted through shared memory,
//! which a page without COOP/COEP headers does not have, and a WebGPU session must yield to the
//! event loop anyway: its results come back through it. [`WasmEngine::generate`] runs the same
//! steps in one synchronous call (CPU only), for Node.
//!
//! Prompts, options and results cross the boundary as JSON strings: one small, explicit format
//! that the JS wrapper and the tests share, instead of a JS object mapping per field.
use lean::cpu::CpuSession;
use lean::engine::{ActiveGeneration, Ended, Step};
use lean::tokenizer::FullChatMessage;
use lean::tools::{self, CallSplitter, Syntax, ToolError, Tools};
use lean::{
    ChatMessage, Engine, GenerateOptions, Generation, LeanError, Model, ModelBytes, Prompt,
    SamplingParams, Session, TokenEvent, Tokenizer,
};
use lean_constraint::ConstraintSpec;
use lean_gpu::{GpuContext, Kernels, StreamedModel};
use serde::{Deserialize, Serialize};
use std::cell::{RefCell, RefMut};
use std::sync::{Arc, Mutex};
use wasm_bindgen::prelude::*;

pub mod sha256;
#[cfg(feature = "threads")]
pub mod threads;

/// Runs when the module is instantiated.
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(record_panic));
    // The engine's clock (timings, speculation's cost check): std has none here.
    lean::set_clock(seconds);
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
    /// A page's and a worker's `performance.now()`: milliseconds, monotonic.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

fn seconds() -> f64 {
    performance_now() / 1000.0
}

/// The message of the last panic, until `takePanicMessage` takes it.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// With `panic = "abort"` a Rust panic reaches JS as an opaque `RuntimeError: unreachable`. The
/// hook logs the message with its location to the console and keeps it for `takePanicMessage`,
/// so that a JS wrapper can rethrow the trap as a readable `Error`. It returns normally (rather
/// than throwing from inside std's panic machinery) so that it also runs for later panics.
fn record_panic(info: &std::panic::PanicHookInfo) {
    let message = format!("lean panicked (a bug in lean; reload the module): {info}");
    console_error(&message);
    if let Ok(mut last) = LAST_PANIC.lock() {
        *last = Some(message);
    }
}

/// Takes the message of the last Rust panic: call it after catching a `WebAssembly.RuntimeError`
/// from this module. The module's state after a panic is not trustworthy: instantiate it anew.
#[wasm_bindgen(js_name = takePanicMessage)]
pub fn take_panic_message() -> Option<String> {
    LAST_PANIC.lock().ok().and_then(|mut last| last.take())
}

fn js_error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Reserves `bytes` up front so that running out of wasm memory is a readable error: an
/// infallible allocation that fails aborts the module with an opaque trap instead.
fn reserve(bytes: usize, what: &str) -> Result<Vec<u8>, JsError> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes).map_err(|_| {
        js_error(format!(
            "cannot allocate {} of WebAssembly memory for {what} (wasm32 memory ends at 4 GiB, \
             and the browser may refuse to grow it earlier): choose a smaller model or context",
            mib(bytes)
        ))
    })?;
    Ok(v)
}

/// Receives a GGUF file chunk by chunk straight into one allocation of its final size, so that
/// neither JS nor wasm ever holds a second copy of the model: JS pushes each `fetch` chunk as it
/// arrives and drops it, then `finish` builds the engine over these bytes in place.
#[wasm_bindgen]
pub struct ModelLoader {
    bytes: Vec<u8>,
    total: usize,
}

#[wasm_bindgen]
impl ModelLoader {
    /// Allocates `total_bytes` (the GGUF's size) at once; fails with a readable error when wasm
    /// memory cannot hold it.
    #[wasm_bindgen(constructor)]
    pub fn new(total_bytes: f64) -> Result<ModelLoader, JsError> {
        let total = file_size(total_bytes)?;
        // One Rust allocation is at most isize::MAX bytes: 2 GiB on wasm32.
        if total > isize::MAX as usize {
            return Err(js_error(format!(
                "the model file is {} but WebAssembly (wasm32) can hold at most {} in one \
                 buffer: choose a smaller model (or the WebGPU backend, which streams it to \
                 the GPU)",
                mib(total),
                mib(isize::MAX as usize)
            )));
        }
        Ok(ModelLoader {
            bytes: reserve(total, "the model file")?,
            total,
        })
    }

    /// Appends the next chunk of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsError> {
        if chunk.len() > self.total - self.bytes.len() {
            return Err(js_error(format!(
                "the model data is longer than the announced {} bytes (received {} + {})",
                self.total,
                self.bytes.len(),
                chunk.len()
            )));
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Bytes received so far.
    #[wasm_bindgen(getter)]
    pub fn received(&self) -> f64 {
        self.bytes.len() as f64
    }

    /// Builds the engine once every byte arrived (see [`WasmEngine::new`] for the arguments).
    /// Consumes the loader (its JS object is no longer usable), also when it fails.
    pub fn finish(
        self,
        tokenizer_json: Option<Vec<u8>>,
        tokenizer_config: Option<Vec<u8>>,
        chat_template: Option<String>,
        context_length: u32,
    ) -> Result<WasmEngine, JsError> {
        WasmEngine::new(
            self.complete()?,
            tokenizer_json,
            tokenizer_config,
            chat_template,
            context_length,
        )
    }
}

impl ModelLoader {
    /// The file's bytes, once every one arrived.
    fn complete(self) -> Result<Vec<u8>, JsError> {
        if self.bytes.len() != self.total {
            return Err(js_error(format!(
                "the model data ended after {} of {} bytes (an interrupted download?)",
                self.bytes.len(),
                self.total
            )));
        }
        Ok(self.bytes)
    }
}

/// A file size from JS: a whole number of bytes that wasm32 can count.
fn file_size(total_bytes: f64) -> Result<usize, JsError> {
    if !(total_bytes.is_finite() && total_bytes >= 0.0 && total_bytes.fract() == 0.0) {
        return Err(js_error(format!(
            "the model size must be a whole number of bytes, got {total_bytes}"
        )));
    }
    if total_bytes > usize::MAX as f64 {
        return Err(js_error(format!(
            "the model file is {total_bytes} bytes: more than WebAssembly (wasm32) can address"
        )));
    }
    Ok(total_bytes as usize)
}

/// The GPU backend's loader: the GGUF streams chunk by chunk straight into WebGPU buffers (each
/// weight matrix is uploaded as soon as its last byte arrives), so wasm memory never holds the
/// file: only its header, the norms and biases, and the one matrix being received.
#[wasm_bindgen]
pub struct GpuModelLoader {
    stream: StreamedModel,
    kernels: Arc<Kernels>,
    /// The device, kept by the engine for its loss (`WasmEngine.deviceLost`, `loseDevice`).
    device: Arc<GpuContext>,
}

fn gpu_error(e: lean_gpu::GpuError) -> JsError {
    js_error(LeanError::Backend(format!("WebGPU: {e}")))
}

#[wasm_bindgen]
impl GpuModelLoader {
    /// Opens a WebGPU device (the browser's high-performance adapter, with its own limits) and
    /// compiles the kernels, ready for a GGUF of `total_bytes`. Rejects with a readable error
    /// when there is no adapter or a kernel does not compile.
    pub async fn open(total_bytes: f64) -> Result<GpuModelLoader, JsError> {
        let total = file_size(total_bytes)?;
        let device = Arc::new(GpuContext::new().await.map_err(gpu_error)?);
        let kernels = Arc::new(Kernels::new(&device).await.map_err(gpu_error)?);
        Ok(GpuModelLoader {
            stream: StreamedModel::new(device.clone(), total, None),
            kernels,
            device,
        })
    }

    /// Appends the next chunk of the file (uploading the matrices it completes).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsError> {
        self.stream.push(chunk).map_err(gpu_error)
    }

    /// Bytes received so far.
    #[wasm_bindgen(getter)]
    pub fn received(&self) -> f64 {
        self.stream.received() as f64
    }

    /// Builds the engine once every byte arrived (arguments as for `ModelLoader.finish`):
    /// resolves to a WasmEngine on the GPU. Consumes the loader, also when it fails.
    pub async fn finish(
        self,
        tokenizer_json: Option<Vec<u8>>,
        tokenizer_config: Option<Vec<u8>>,
        chat_template: Option<String>,
        context_length: u32,
    ) -> Result<WasmEngine, JsError> {
        // Tokenizer files are checked before the model is built (a wrong file fails fast); the
        // GGUF's own tokenizer needs the model's header, which only the finished stream holds.
        let files = match &tokenizer_json {
            Some(json) => Some(tokenizer_from_files(
                json,
                tokenizer_config.as_deref(),
                chat_template.as_deref(),
            )?),
            None => None,
        };
        let (model, session) = self
            .stream
            .into_session(self.kernels, context_length as usize)
            .await
            .map_err(gpu_error)?;
        let tokenizer = match files {
            Some(tokenizer) => tokenizer,
            None => tokenizer_from_gguf(
                &model.gguf,
                tokenizer_config.as_deref(),
                chat_template.as_deref(),
            )?,
        };
        let ctx = session.context_length();
        let engine = Engine::with_backend(model, tokenizer, ctx, move |_, _| {
            Ok(Box::new(session) as Box<dyn Session>)
        })
        .map_err(js_error)?;
        let engine = WasmEngine::from(engine);
        engine.state()?.gpu = Some(self.device);
        Ok(engine)
    }
}

/// Parses the model and the tokenizer (from its files, else from the GGUF's metadata), checks
/// that they belong together, and caps the context.
fn load(
    gguf: Vec<u8>,
    tokenizer_json: Option<Vec<u8>>,
    tokenizer_config: Option<Vec<u8>>,
    chat_template: Option<String>,
    context_length: u32,
) -> Result<(Model, Tokenizer, usize), JsError> {
    let model = Model::load(ModelBytes::Owned(gguf)).map_err(js_error)?;
    let (config, template) = (tokenizer_config.as_deref(), chat_template.as_deref());
    let tokenizer = match &tokenizer_json {
        Some(json) => tokenizer_from_files(json, config, template)?,
        None => tokenizer_from_gguf(&model.gguf, config, template)?,
    };
    let ctx = Engine::capped_context(&model, context_length as usize).map_err(js_error)?;
    Ok((model, tokenizer, ctx))
}

/// Checks that wasm memory can hold the f32 KV cache of a CPU session of `ctx` positions, so
/// that running out is a readable error (see `reserve`). `whose`: "the " or "the draft model's ".
fn reserve_kv_cache(model: &Model, ctx: usize, whose: &str) -> Result<(), JsError> {
    let c = &model.config;
    let kv_bytes = 2 * c.n_layers * c.n_kv_heads * c.head_dim * ctx * size_of::<f32>();
    // Freed at once; the allocator hands the grown memory to the KV cache right after.
    drop(reserve(
        kv_bytes,
        &format!("{whose}KV cache of {ctx} tokens"),
    )?);
    Ok(())
}

/// tokenizer.json, with tokenizer_config.json and a chat template when given.
fn tokenizer_from_files(
    tokenizer_json: &[u8],
    tokenizer_config: Option<&[u8]>,
    chat_template: Option<&str>,
) -> Result<Tokenizer, JsError> {
    Tokenizer::from_bytes(tokenizer_json, tokenizer_config, chat_template)
        .map_err(|e| js_error(LeanError::Tokenizer(e)))
}

/// The tokenizer (and chat template) the GGUF's own metadata describes, for a model given
/// without a tokenizer.json; a tokenizer_config.json or chat template given explicitly wins.
fn tokenizer_from_gguf(
    gguf: &lean::gguf::Gguf,
    tokenizer_config: Option<&[u8]>,
    chat_template: Option<&str>,
) -> Result<Tokenizer, JsError> {
    // The error names the missing or bad key, and says to give a tokenizer.json.
    Tokenizer::from_gguf(gguf, tokenizer_config, chat_template)
        .map_err(|e| js_error(LeanError::Tokenizer(e)))
}

/// `{"messages": [{"role", "content"}, ...]}`, `{"raw": "text"}` or `{"ids": [1, 2, 3]}`. Messages
/// may be OpenAI's tool-call messages too: an assistant's `tool_calls` (`content` then may be
/// null) and `{"role": "tool", "content", "tool_call_id"}` results.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum PromptJson {
    Messages(Vec<MessageJson>),
    Raw(String),
    Ids(Vec<u32>),
}

/// One chat message in OpenAI's shape (text content only: lean-js joins text parts).
#[derive(Deserialize)]
struct MessageJson {
    role: String,
    #[serde(default)]
    content: Option<String>,
    /// `[{"id", "type": "function", "function": {"name", "arguments"}}]`, `arguments` a JSON
    /// string (OpenAI's) or an object.
    #[serde(default)]
    tool_calls: Option<serde_json::Value>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// The messages as the chat template takes them (calls shaped by `tools::template_tool_calls`).
fn full_messages(messages: Vec<MessageJson>) -> Result<Vec<FullChatMessage>, JsValue> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let tool_calls = match m.tool_calls.filter(|c| !c.is_null()) {
                None => None,
                Some(_) if m.role != "assistant" => {
                    return Err(tool_error(ToolError::new(
                        &format!("messages[{i}].tool_calls"),
                        format!(
                            "messages[{i}] has 'tool_calls' but role '{}': only an assistant \
                             calls tools",
                            m.role
                        ),
                    )))
                }
                // An empty list is no call (some clients send one).
                Some(calls) => Some(tools::template_tool_calls(&calls, i).map_err(tool_error)?)
                    .filter(|c| !c.is_empty()),
            };
            if m.content.is_none() && tool_calls.is_none() {
                return Err(js_error(format!(
                    "messages[{i}].content must be a string (null only beside 'tool_calls')"
                ))
                .into());
            }
            Ok(FullChatMessage {
                role: m.role,
                content: m.content,
                tool_calls,
                tool_call_id: m.tool_call_id,
                name: m.name,
            })
        })
        .collect()
}

/// A JS `Error` named `ToolError` (lean-js's `ErrorName.Tool`): tools, `tool_choice` or tool
/// messages that cannot be used; the message names the field.
fn tool_error(e: ToolError) -> JsValue {
    named_error("ToolError", &e.message)
}

/// An engine error as JS sees it: the GPU device's loss is an `Error` named `DeviceLostError`
/// (lean-js then continues the generation on a CPU engine), anything else a plain `Error`.
fn engine_error(e: LeanError) -> JsValue {
    match e {
        LeanError::DeviceLost(why) => named_error(
            "DeviceLostError",
            &format!("the WebGPU device was lost: {why}"),
        ),
        e => js_error(e).into(),
    }
}

fn named_error(name: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    error.set_name(name);
    error.into()
}

/// Every field is optional; the defaults are greedy decoding of at most 256 tokens, stopping at
/// the tokenizer's end-of-sequence ids. Unknown fields are refused so that a typo is not ignored.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct OptionsJson {
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    seed: u64,
    stop_token_ids: Option<Vec<u32>>,
    /// Speculative decoding by prompt lookup: guesses of up to this many tokens.
    lookup: Option<usize>,
    /// Speculative decoding by the engine's draft model (`setDraftModel`): guesses of up to
    /// this many tokens. Not with `lookup` or `prediction`.
    draft: Option<usize>,
    /// Text the output is expected to resemble: speculative decoding's first source of guesses
    /// (of up to `lookup` tokens, default 8).
    prediction: Option<String>,
    /// Speculation's cost check (default on): `false` guesses at every step however the passes
    /// pay (tests of the passes themselves).
    cost_check: bool,
    /// Constrained decoding: the output follows this JSON schema, regex or Lark grammar.
    constraint: Option<ConstraintJson>,
    /// OpenAI's `tools` (function tools) for a chat prompt: rendered through the chat template
    /// (or lean's fallback system message), the model's calls parsed out of the reply.
    tools: Option<serde_json::Value>,
    /// OpenAI's `tool_choice`: "auto" (default), "none", "required" or `{"type": "function",
    /// "function": {"name"}}` (the last two: one call, constrained to the function's schema).
    tool_choice: Option<serde_json::Value>,
}

/// A constraint on the output (lean-js's `responseFormat`, with the JSON schema unwrapped):
/// `{"type": "json_object"}`, `{"type": "json_schema", "schema": {...}}`, `{"type": "regex",
/// "pattern": "..."}` or `{"type": "grammar", "lark": "..."}` (llguidance's Lark dialect).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ConstraintJson {
    JsonObject,
    JsonSchema { schema: serde_json::Value },
    Regex { pattern: String },
    Grammar { lark: String },
}

impl From<ConstraintJson> for ConstraintSpec {
    fn from(c: ConstraintJson) -> ConstraintSpec {
        match c {
            ConstraintJson::JsonObject => ConstraintSpec::JsonObject,
            ConstraintJson::JsonSchema { schema } => ConstraintSpec::JsonSchema(schema),
            ConstraintJson::Regex { pattern } => ConstraintSpec::Regex(pattern),
            ConstraintJson::Grammar { lark } => ConstraintSpec::Lark(lark),
        }
    }
}

impl Default for OptionsJson {
    fn default() -> Self {
        let options = GenerateOptions::default();
        let s = options.sampling;
        OptionsJson {
            max_tokens: options.max_tokens,
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repetition_penalty: s.repetition_penalty,
            seed: s.seed,
            stop_token_ids: options.stop_token_ids,
            lookup: None,
            draft: None,
            prediction: None,
            cost_check: true,
            constraint: None,
            tools: None,
            tool_choice: None,
        }
    }
}

impl From<OptionsJson> for GenerateOptions {
    fn from(o: OptionsJson) -> GenerateOptions {
        GenerateOptions {
            max_tokens: o.max_tokens,
            sampling: SamplingParams {
                temperature: o.temperature,
                top_k: o.top_k,
                top_p: o.top_p,
                min_p: o.min_p,
                repetition_penalty: o.repetition_penalty,
                seed: o.seed,
            },
            stop_token_ids: o.stop_token_ids,
            constraint: o.constraint.map(ConstraintSpec::from),
            // `request` refuses both at once.
            speculation: o
                .lookup
                .map(lean::Speculation::lookup)
                .or(o.draft.map(lean::Speculation::draft_model)),
        }
    }
}

/// One generated token: its id and the text that became complete with it (may be empty).
#[derive(Serialize)]
struct TokenJson {
    id: u32,
    text: String,
}

impl From<TokenEvent> for TokenJson {
    fn from(t: TokenEvent) -> TokenJson {
        TokenJson {
            id: t.id,
            text: t.text,
        }
    }
}

/// A finished generation. lean's own timings are left out: the worker times the steps itself
/// (lean's clock here is `performance.now()`, for speculation's cost check).
#[derive(Serialize)]
struct GenerationJson {
    prompt_ids: Vec<u32>,
    token_ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
    /// Prompt ids taken from the KV cache of the previous generation (not run again).
    cached_tokens: usize,
    /// Ids the KV cache holds now, for the next generation to reuse.
    cache_length: usize,
    /// Speculative decoding's verification passes and guesses (zeros without it).
    speculation: SpeculationJson,
    /// With `tools`: the calls the reply made, OpenAI's `tool_calls` (`[{id, type: "function",
    /// function: {name, arguments}}]`, `arguments` a JSON text); `finish_reason` is then
    /// "tool_calls". Absent when the reply made none.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct SpeculationJson {
    verifications: usize,
    drafted_tokens: usize,
    accepted_tokens: usize,
    /// Steps run without a guess because the cost check paused guessing.
    paused_steps: usize,
}

impl GenerationJson {
    /// A reply's calls: finish_reason "tool_calls".
    fn set_tool_calls(&mut self, calls: Option<serde_json::Value>) {
        if calls.is_some() {
            self.finish_reason = "tool_calls";
        }
        self.tool_calls = calls;
    }

    fn new(engine: &Engine, g: Generation) -> GenerationJson {
        GenerationJson {
            prompt_ids: g.prompt_ids,
            token_ids: g.token_ids,
            text: g.text,
            finish_reason: g.finish_reason.as_str(),
            cached_tokens: g.timings.cached_tokens,
            cache_length: engine.cached_ids().len(),
            speculation: SpeculationJson {
                verifications: g.timings.speculation.verifications,
                drafted_tokens: g.timings.speculation.drafted,
                accepted_tokens: g.timings.speculation.accepted,
                paused_steps: g.timings.speculation.paused_steps,
            },
            tool_calls: None,
        }
    }
}

/// What `step` and `cancel` return: the tokens of this step (none, one, or a token followed by
/// held-back text flushed at the end) and, once the generation is over, its result.
#[derive(Serialize)]
struct StepJson {
    tokens: Vec<TokenJson>,
    done: Option<GenerationJson>,
}

/// What `info` returns.
#[derive(Serialize)]
struct InfoJson {
    architecture: &'static str,
    description: String,
    backend: String,
    context_length: usize,
    train_context_length: usize,
    vocab_size: usize,
    file_bytes: usize,
    kv_cache_bytes: usize,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    has_chat_template: bool,
    /// The tokenizer (and chat template) came from the GGUF's metadata: no tokenizer.json given.
    tokenizer_from_gguf: bool,
    /// The draft model and its backend, in one line, once `setDraftModel` gave one.
    draft_model: Option<String>,
}

#[wasm_bindgen]
pub struct WasmEngine {
    /// Borrowed by every call, and across the awaits of `begin` and `step`: a call made while a
    /// step is still running gets a "busy" error instead of a torn state.
    state: RefCell<EngineState>,
}

struct EngineState {
    engine: Engine,
    /// The generation between `begin` and its end, resumed by each `step`.
    active: Option<Active>,
    /// How the chat template takes tools (`tools::template_syntax`), found on the first request
    /// with tools or tool messages.
    tool_template: Option<Option<Syntax>>,
    /// The WebGPU device, on the GPU backend.
    gpu: Option<Arc<GpuContext>>,
}

/// A generation in progress, and for a chat with tools what reads its calls.
struct Active {
    generation: ActiveGeneration,
    tools: Option<ToolReply>,
}

/// The calls of a reply: the streamed text passes through `splitter` (text that may be a call
/// is held back), and what it held is parsed at the end.
struct ToolReply {
    syntax: Syntax,
    tools: Tools,
    splitter: CallSplitter,
}

impl ToolReply {
    fn new(syntax: Syntax, tools: Tools) -> ToolReply {
        ToolReply {
            syntax,
            tools,
            splitter: CallSplitter::new(syntax),
        }
    }

    /// Ends the reply of a generation that ended with `finish_reason`: the held text's calls
    /// (OpenAI's `tool_calls`) and the text still to stream (the content around the calls, or
    /// the held text when it holds none). A cancelled generation makes no call.
    fn finish(self, finish_reason: &str) -> (String, Option<serde_json::Value>) {
        let held = self.splitter.finish();
        let parsed = match finish_reason {
            "cancelled" => None,
            _ => tools::parse_reply(&held, self.syntax, &self.tools, finish_reason),
        };
        match parsed {
            Some((content, calls)) => (
                content.unwrap_or_default(),
                Some(tools::openai_tool_calls(&calls, false)),
            ),
            None => (held, None),
        }
    }
}

impl From<Engine> for WasmEngine {
    fn from(engine: Engine) -> WasmEngine {
        WasmEngine {
            state: RefCell::new(EngineState {
                engine,
                active: None,
                tool_template: None,
                gpu: None,
            }),
        }
    }
}

#[wasm_bindgen]
impl WasmEngine {
    /// Loads the model on the CPU (the GGUF bytes are moved into wasm memory once and used in
    /// place) and checks that the tokenizer belongs to it. `tokenizer_json` is tokenizer.json;
    /// without it the tokenizer and chat template come from the GGUF's metadata.
    /// `tokenizer_config` is tokenizer_config.json, `chat_template` the text of
    /// chat_template.jinja (it wins over the config's and the GGUF's); `context_length` is capped
    /// at the model's.
    #[wasm_bindgen(constructor)]
    pub fn new(
        gguf: Vec<u8>,
        tokenizer_json: Option<Vec<u8>>,
        tokenizer_config: Option<Vec<u8>>,
        chat_template: Option<String>,
        context_length: u32,
    ) -> Result<WasmEngine, JsError> {
        let (model, tokenizer, ctx) = load(
            gguf,
            tokenizer_json,
            tokenizer_config,
            chat_template,
            context_length,
        )?;
        reserve_kv_cache(&model, ctx, "the ")?;
        let engine = Engine::with_backend(model, tokenizer, ctx, |model, ctx| {
            Ok(Box::new(CpuSession::new(model, ctx)) as Box<dyn Session>)
        })
        .map_err(js_error)?;
        Ok(WasmEngine::from(engine))
    }

    /// The model and engine as JSON: `{architecture, description, backend, context_length,
    /// train_context_length, vocab_size, file_bytes, kv_cache_bytes, bos_token, eos_token,
    /// eos_token_ids, has_chat_template, tokenizer_from_gguf, draft_model}`.
    pub fn info(&self) -> Result<String, JsError> {
        let state = self.state()?;
        let (model, tokenizer) = (&state.engine.model, &state.engine.tokenizer);
        let c = &model.config;
        let info = InfoJson {
            architecture: c.arch.name(),
            description: model.describe(),
            backend: state.engine.backend(),
            context_length: state.engine.context_length(),
            train_context_length: c.train_context_length,
            vocab_size: c.vocab_size,
            file_bytes: model.file_size(),
            kv_cache_bytes: state.engine.kv_cache_bytes(),
            bos_token: tokenizer.bos_token().map(str::to_owned),
            eos_token: tokenizer.eos_token().map(str::to_owned),
            eos_token_ids: tokenizer.eos_token_ids(),
            has_chat_template: tokenizer.has_chat_template(),
            tokenizer_from_gguf: tokenizer.is_from_gguf(),
            draft_model: state.engine.draft_model(),
        };
        serde_json::to_string(&info).map_err(js_error)
    }

    /// Starts a generation: tokenizes `prompt_json` (`{"messages": [{"role", "content"}, ...]}`
    /// rendered with the chat template, `{"raw": text}`, or `{"ids": [...]}`) and runs the prompt
    /// through the model. `options_json` fields are all optional: `max_tokens` (256),
    /// `temperature` (0 = greedy), `top_k`, `top_p`, `min_p`, `repetition_penalty`, `seed`,
    /// `stop_token_ids` (default: the tokenizer's end-of-sequence ids), `lookup`, `prediction`,
    /// `cost_check` (speculation's, default true), `draft` (guesses of up to this many tokens by
    /// the draft model of `setDraftModel`; not with `lookup` or `prediction`; without a draft
    /// model the engine refuses it),
    /// `constraint` (`{"type": "json_object" | "json_schema" (with "schema") | "regex" (with
    /// "pattern") | "grammar" (with "lark")}`: the output follows it; one the library rejects
    /// fails with an `Error` named `ConstraintError`, the engine stays usable), `tools` and
    /// `tool_choice` (OpenAI's, for a `messages` prompt: the calls come back in `done`'s
    /// `tool_calls`, with finish_reason "tool_calls", and their text is not streamed; bad tools,
    /// a `tool_choice` naming no tool, or a function's schema the constraint library rejects
    /// fail with an `Error` named `ToolError`). Resolves to `{"prompt_ids": [...]}`. A
    /// generation still in progress is abandoned.
    pub async fn begin(
        &self,
        prompt_json: String,
        options_json: String,
    ) -> Result<String, JsValue> {
        let mut state = self.state()?;
        let state = &mut *state;
        state.active = None;
        let Request {
            prompt,
            options,
            tools,
        } = request(state, &prompt_json, &options_json)?;
        check_constraint(&mut state.engine, &options, tools.is_some())?;
        let generation = state
            .engine
            .begin_async(&prompt, &options)
            .await
            .map_err(engine_error)?;
        let begun = serde_json::json!({
            "prompt_ids": generation.prompt_ids(),
            "cached_tokens": generation.cached_tokens(),
        });
        state.active = Some(Active { generation, tools });
        Ok(serde_json::to_string(&begun).map_err(js_error)?)
    }

    /// Produces the next token of the generation `begin` started; resolves to JSON
    /// `{"tokens": [{"id", "text"}, ...], "done": null | {prompt_ids, token_ids, text,
    /// finish_reason}}`; finish_reason is "stop" (a stop id was generated: it is in token_ids but
    /// not in tokens), "length", "context_full" or (with tools, `done.tool_calls` then holds
    /// the calls) "tool_calls". With tools, a token's text that may belong to a call is held
    /// back (empty text) until the end. After `done`, call `begin` again.
    pub async fn step(&self) -> Result<String, JsValue> {
        let mut state = self.state()?;
        let state = &mut *state;
        let Some(mut active) = state.active.take() else {
            return Err(js_error(LeanError::InvalidArgument(
                "no generation in progress: call begin first".into(),
            ))
            .into());
        };
        // A failed step drops the generation: it cannot continue (see `Engine::step`).
        let Step { token, finished } = state
            .engine
            .step_async(&mut active.generation)
            .await
            .map_err(engine_error)?;
        let mut tokens: Vec<TokenJson> = token.into_iter().map(TokenJson::from).collect();
        if let Some(reply) = &mut active.tools {
            for token in &mut tokens {
                token.text = reply.splitter.push(&token.text);
            }
        }
        let done = match finished {
            Some(_) => Some(end(&state.engine, active, &mut tokens)?),
            None => {
                state.active = Some(active);
                None
            }
        };
        Ok(serde_json::to_string(&StepJson { tokens, done }).map_err(js_error)?)
    }

    /// Why the WebGPU device was lost, once it was (`undefined` while it runs, or on the CPU).
    #[wasm_bindgen(js_name = deviceLost)]
    pub fn device_lost(&self) -> Result<Option<String>, JsError> {
        Ok(self.state()?.gpu.as_ref().and_then(|gpu| gpu.lost_reason()))
    }

    /// Test hook: destroys the WebGPU device (`GPUDevice.destroy()`), as a driver reset or the
    /// browser reclaiming it would lose it; the next pass fails with `DeviceLostError`. With
    /// `passes`, the device is destroyed before the pass after that many more (prefill chunks
    /// or decode passes). False on the CPU.
    #[wasm_bindgen(js_name = loseDevice)]
    pub fn lose_device(&self, passes: Option<u32>) -> Result<bool, JsError> {
        let state = self.state()?;
        let Some(gpu) = &state.gpu else {
            return Ok(false);
        };
        match passes {
            Some(n) => gpu.lose_device_after(n as usize),
            None => gpu.lose_device(),
        }
        Ok(true)
    }

    /// Ends the generation in progress as "cancelled", in the same JSON as `step`; `undefined`
    /// when none is in progress.
    pub fn cancel(&self) -> Result<Option<String>, JsError> {
        let mut state = self.state()?;
        let Some(active) = state.active.take() else {
            return Ok(None);
        };
        let mut tokens = Vec::new();
        let done = Some(end(&state.engine, active, &mut tokens)?);
        serde_json::to_string(&StepJson { tokens, done })
            .map(Some)
            .map_err(js_error)
    }

    /// Runs a whole generation in one synchronous call on the CPU (lean's `Engine::generate`:
    /// the same tokens as `begin` + `step`), calling `on_token(text, tokenId)` for each token; a
    /// callback returning `false` cancels, and one that throws cancels and the exception is
    /// rethrown. Returns the `done` JSON of `step` (finish_reason may also be "cancelled"). A
    /// generation still in progress is abandoned. A GPU engine refuses: WebGPU results only
    /// arrive through the event loop, so use `begin` and `step`.
    pub fn generate(
        &self,
        prompt_json: &str,
        options_json: &str,
        on_token: &js_sys::Function,
    ) -> Result<String, JsValue> {
        let mut state = self.state()?;
        let state = &mut *state;
        state.active = None;
        let Request {
            prompt,
            options,
            mut tools,
        } = request(state, prompt_json, options_json)?;
        check_constraint(&mut state.engine, &options, tools.is_some())?;
        let mut thrown = None;
        let emit = |text: &str, id: u32, thrown: &mut Option<JsValue>| {
            // After a throw the callback is not called again (not even for held-back text).
            if thrown.is_some() {
                return false;
            }
            let text = JsValue::from_str(text);
            match on_token.call2(&JsValue::NULL, &text, &JsValue::from(id)) {
                Ok(keep_going) => keep_going.as_bool() != Some(false),
                Err(exception) => {
                    *thrown = Some(exception);
                    false
                }
            }
        };
        let generation = state
            .engine
            .generate(&prompt, &options, |token| match &mut tools {
                Some(reply) => {
                    let text = reply.splitter.push(&token.text);
                    emit(&text, token.id, &mut thrown)
                }
                None => emit(&token.text, token.id, &mut thrown),
            })
            .map_err(js_error)?;
        let mut calls = None;
        if let Some(reply) = tools {
            let (rest, tool_calls) = reply.finish(generation.finish_reason.as_str());
            if !rest.is_empty() {
                let id = generation.token_ids.last().copied().unwrap_or(0);
                emit(&rest, id, &mut thrown);
            }
            calls = tool_calls;
        }
        if let Some(exception) = thrown {
            return Err(exception);
        }
        let mut json = GenerationJson::new(&state.engine, generation);
        json.set_tool_calls(calls);
        serde_json::to_string(&json)
            .map_err(|e| js_error(format!("serializing the generation: {e}")).into())
    }

    /// The ids of `text` as a raw prompt (`{"raw": text}`) would be tokenized, special tokens
    /// (e.g. a BOS) included.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsError> {
        self.state()?
            .engine
            .encode(&Prompt::Raw(text.to_owned()))
            .map_err(js_error)
    }

    /// The KV cache carried from one generation to the next, as JSON `{"cache_length": ids it
    /// holds}`, with `"prompt_tokens"` and `"reusable_tokens"` (how many of them the next
    /// `begin` of that prompt would take from the cache) when `prompt_json` is given;
    /// `options_json` (as `begin`'s) counts a chat's `tools` in.
    #[wasm_bindgen(js_name = cacheInfo)]
    pub fn cache_info(
        &self,
        prompt_json: Option<String>,
        options_json: Option<String>,
    ) -> Result<String, JsValue> {
        let mut state = self.state()?;
        let state = &mut *state;
        let mut info = serde_json::json!({ "cache_length": state.engine.cached_ids().len() });
        if let Some(prompt_json) = prompt_json {
            let options_json = options_json.as_deref().unwrap_or("{}");
            let Request { prompt, .. } = request(state, &prompt_json, options_json)?;
            let ids = state.engine.encode(&prompt).map_err(js_error)?;
            let reusable = state
                .engine
                .reusable_tokens(&Prompt::Ids(ids.clone()))
                .map_err(js_error)?;
            info["prompt_tokens"] = ids.len().into();
            info["reusable_tokens"] = reusable.into();
        }
        Ok(serde_json::to_string(&info).map_err(js_error)?)
    }

    /// Forgets the KV cache: the next generation prefills its whole prompt (a generation in
    /// progress is abandoned).
    #[wasm_bindgen(js_name = resetCache)]
    pub fn reset_cache(&self) -> Result<(), JsError> {
        let mut state = self.state()?;
        state.active = None;
        state.engine.reset_cache();
        Ok(())
    }

    /// The context window actually allocated (the requested one capped at the model's).
    #[wasm_bindgen(js_name = contextLength)]
    pub fn context_length(&self) -> Result<u32, JsError> {
        Ok(self.state()?.engine.context_length() as u32)
    }

    /// Gives the engine a draft model for speculative decoding (`draft` in `begin`'s options):
    /// the GGUF `loader` received (consumed, also when this fails), a smaller model with this
    /// one's vocabulary (else an error naming the first difference, and any earlier draft model
    /// stays), with a KV cache of its own of this engine's context length (capped at the draft
    /// model's). It runs on the CPU, also beside a WebGPU engine: the engine asks the draft
    /// model for its guesses synchronously, and WebGPU results only arrive through the event
    /// loop. Replaces an earlier draft model. Returns it and its backend in one line (`info`'s
    /// `draft_model`).
    #[wasm_bindgen(js_name = setDraftModel)]
    pub fn set_draft_model(&self, loader: ModelLoader) -> Result<String, JsError> {
        let mut state = self.state()?;
        let model = Model::load(ModelBytes::Owned(loader.complete()?))
            .map_err(|e| js_error(format!("the draft model: {e}")))?;
        let ctx =
            Engine::capped_context(&model, state.engine.context_length()).map_err(js_error)?;
        reserve_kv_cache(&model, ctx, "the draft model's ")?;
        state
            .engine
            .set_draft_model(model, |model, ctx| {
                Ok(Box::new(CpuSession::new(model, ctx)) as Box<dyn Session>)
            })
            .map_err(js_error)?;
        Ok(state.engine.draft_model().unwrap_or_default())
    }
}

impl WasmEngine {
    fn state(&self) -> Result<RefMut<'_, EngineState>, JsError> {
        self.state.try_borrow_mut().map_err(|_| {
            js_error(
                "the engine is busy: a begin or step is still running (await it before the \
                 next call)",
            )
        })
    }
}

/// A request, parsed: what to generate from, how, and for a chat with tools what reads the calls.
struct Request {
    prompt: Prompt,
    options: GenerateOptions,
    tools: Option<ToolReply>,
}

/// Parses a prompt and options (see `begin`) and sets the template's clock. A chat with tools
/// (or with calls and tool results) is rendered here, as lean-cli and `lean-cli serve` render it
/// (`tools::prepare_chat`: the template's `tools`, or lean's fallback system message), and goes
/// to the engine as ids; a forced call's grammar becomes the constraint.
fn request(
    state: &mut EngineState,
    prompt_json: &str,
    options_json: &str,
) -> Result<Request, JsValue> {
    let engine = &mut state.engine;
    let prompt: PromptJson = serde_json::from_str(prompt_json)
        .map_err(|e| js_error(format!("invalid prompt JSON: {e}")))?;
    let mut options: OptionsJson = serde_json::from_str(options_json)
        .map_err(|e| js_error(format!("invalid options JSON: {e}")))?;
    if options.draft.is_some() && (options.lookup.is_some() || options.prediction.is_some()) {
        return Err(js_error(LeanError::InvalidArgument(
            "'draft' does not combine with 'lookup' or 'prediction': the draft model or prompt \
             lookup guesses, not both"
                .into(),
        ))
        .into());
    }
    let prediction = match options.prediction.take() {
        Some(text) => Some(engine.tokenizer.encode(&text, false).map_err(js_error)?),
        None => None,
    };
    let tools = tools::parse_tools(
        options.tools.take().as_ref(),
        options.tool_choice.take().as_ref(),
    )
    .map_err(tool_error)?;
    let cost_check = options.cost_check;
    let mut generate: GenerateOptions = options.into();
    if let Some(ids) = prediction {
        let spec = generate
            .speculation
            .take()
            .unwrap_or(lean::Speculation::lookup(8));
        generate.speculation = Some(spec.with_prediction(ids));
    }
    if !cost_check {
        generate.speculation = generate
            .speculation
            .map(lean::Speculation::without_cost_check);
    }
    // Templates that print the date read it from here: wasm32 has no clock in std.
    engine
        .tokenizer
        .set_template_time(Some((js_sys::Date::now() / 1000.0) as i64));
    let messages = match prompt {
        PromptJson::Messages(messages) => full_messages(messages)?,
        PromptJson::Raw(_) | PromptJson::Ids(_) if tools.is_some() => {
            return Err(tool_error(ToolError::new(
                "tools",
                "'tools' apply to a chat prompt ({\"messages\": [...]}), not to raw text or ids",
            )))
        }
        PromptJson::Raw(text) => return Ok(plain_request(Prompt::Raw(text), generate)),
        PromptJson::Ids(ids) => return Ok(plain_request(Prompt::Ids(ids), generate)),
    };
    // Plain messages go in as before (lean-cli's rule).
    let plain = tools.is_none()
        && messages
            .iter()
            .all(|m| m.tool_calls.is_none() && m.role != "tool" && m.content.is_some());
    if plain {
        let messages = messages
            .into_iter()
            .map(|m| ChatMessage::new(m.role, m.content.unwrap_or_default()))
            .collect();
        return Ok(plain_request(Prompt::Chat(messages), generate));
    }
    let template = *state
        .tool_template
        .get_or_insert_with(|| tools::template_syntax(&engine.tokenizer));
    let chat = tools::prepare_chat(template, &messages, tools.as_ref(), &Default::default());
    if let Some(grammar) = chat.grammar {
        if generate.constraint.is_some() {
            return Err(tool_error(ToolError::new(
                "tool_choice",
                "a required tool call ('tool_choice' \"required\" or a function) cannot be \
                 combined with a response format: the call's arguments follow the function's \
                 schema",
            )));
        }
        generate.constraint = Some(ConstraintSpec::Lark(grammar));
    }
    let ids = engine
        .tokenizer
        .encode_chat_full(&chat.messages, true, &chat.kwargs)
        .map_err(|e| js_error(LeanError::Tokenizer(e)))?;
    Ok(Request {
        prompt: Prompt::Ids(ids),
        options: generate,
        tools: chat.syntax.zip(tools).map(|(s, t)| ToolReply::new(s, t)),
    })
}

fn plain_request(prompt: Prompt, options: GenerateOptions) -> Request {
    Request {
        prompt,
        options,
        tools: None,
    }
}

/// Compiles the request's constraint, if any, before its generation begins, so that a schema,
/// regex or grammar the constraint library rejects is an `Error` named `ConstraintError` (lean-js
/// passes the name on) rather than a generic one. The first constrained request of an engine
/// builds the vocabulary's byte map and token trie (lean's `Engine` keeps them for the next);
/// the engine compiles the constraint again for the generation (a few ms for a small schema).
/// A forced tool call's grammar (`for_tools`) that fails is a `ToolError`: a function's
/// parameters schema the library rejects.
fn check_constraint(
    engine: &mut Engine,
    options: &GenerateOptions,
    for_tools: bool,
) -> Result<(), JsValue> {
    let Some(spec) = &options.constraint else {
        return Ok(());
    };
    let stop_ids = options
        .stop_token_ids
        .clone()
        .unwrap_or_else(|| engine.tokenizer.eos_token_ids());
    match engine.compile_constraint(spec, &stop_ids) {
        Ok(_) => Ok(()),
        Err(e) => {
            let message = match e {
                LeanError::InvalidArgument(m) => m,
                other => other.to_string(),
            };
            Err(match for_tools {
                true => named_error(
                    "ToolError",
                    &format!("a function's parameters schema is not usable: {message}"),
                ),
                false => named_error("ConstraintError", &message),
            })
        }
    }
}

/// Ends `active`: appends the text held back to the end to `tokens` (as a last token, with the
/// last id) and returns the result. With tools, the held text's calls go into the result and
/// the rest of the text (the content around them, or text that held no call) into `tokens`.
fn end(
    engine: &Engine,
    active: Active,
    tokens: &mut Vec<TokenJson>,
) -> Result<GenerationJson, JsError> {
    let Ended {
        held_back,
        generation,
    } = engine.finish(active.generation).map_err(js_error)?;
    let Some(mut reply) = active.tools else {
        tokens.extend(held_back.map(TokenJson::from));
        return Ok(GenerationJson::new(engine, generation));
    };
    if let Some(token) = held_back {
        let text = reply.splitter.push(&token.text);
        if !text.is_empty() {
            tokens.push(TokenJson { id: token.id, text });
        }
    }
    let (rest, calls) = reply.finish(generation.finish_reason.as_str());
    if !rest.is_empty() {
        let id = generation.token_ids.last().copied().unwrap_or(0);
        tokens.push(TokenJson { id, text: rest });
    }
    let mut json = GenerationJson::new(engine, generation);
    json.set_tool_calls(calls);
    Ok(json)
}

/// Which CPU backend this build runs (any build also has the GPU one, `GpuModelLoader`):
/// "simd" (the single-thread simd128 CPU kernels) or
/// "threads" (feature `threads`: the same kernels on rayon's Web Worker pool, see threads.rs). A
/// free function so that a loader can ask before fetching a model.
#[wasm_bindgen]
pub fn backend() -> String {
    if cfg!(feature = "threads") {
        "threads"
    } else {
        "simd"
    }
    .to_owned()
}
