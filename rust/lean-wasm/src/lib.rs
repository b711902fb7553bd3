//! WebAssembly bindings of lean (single thread, simd128): a [`WasmEngine`] built from the bytes
//! of a GGUF and of the tokenizer files, generating with a JS callback per token.
//!
//! Prompts and options cross the boundary as JSON strings: one small, explicit format that the
//! JS wrapper and the tests share, instead of a JS object mapping per field.
use lean::{
    ChatMessage, Engine, GenerateOptions, Generation, Model, ModelBytes, Prompt, SamplingParams,
    Tokenizer,
};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use wasm_bindgen::prelude::*;

/// Runs when the module is instantiated.
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(record_panic));
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
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

#[wasm_bindgen]
pub struct WasmEngine {
    engine: Engine,
}

/// `{"messages": [{"role", "content"}, ...]}`, `{"raw": "text"}` or `{"ids": [1, 2, 3]}`.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum PromptJson {
    Messages(Vec<ChatMessage>),
    Raw(String),
    Ids(Vec<u32>),
}

impl From<PromptJson> for Prompt {
    fn from(p: PromptJson) -> Prompt {
        match p {
            PromptJson::Messages(m) => Prompt::Chat(m),
            PromptJson::Raw(t) => Prompt::Raw(t),
            PromptJson::Ids(ids) => Prompt::Ids(ids),
        }
    }
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
        }
    }
}

/// What `generate` returns (as JSON). lean's own timings are zero here: wasm32-unknown-unknown
/// has no clock in std, so callers time the token callbacks themselves.
#[derive(Serialize)]
struct GenerationJson {
    prompt_ids: Vec<u32>,
    token_ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
}

impl From<Generation> for GenerationJson {
    fn from(g: Generation) -> Self {
        GenerationJson {
            prompt_ids: g.prompt_ids,
            token_ids: g.token_ids,
            text: g.text,
            finish_reason: g.finish_reason.as_str(),
        }
    }
}

#[wasm_bindgen]
impl WasmEngine {
    /// Loads the model (the GGUF bytes are moved into wasm memory once and used in place) and
    /// checks that the tokenizer belongs to it. `context_length` is capped at the model's.
    #[wasm_bindgen(constructor)]
    pub fn new(
        gguf: Vec<u8>,
        tokenizer_json: &[u8],
        tokenizer_config: Option<Vec<u8>>,
        chat_template: Option<String>,
        context_length: u32,
    ) -> Result<WasmEngine, JsError> {
        let model = Model::load(ModelBytes::Owned(gguf)).map_err(js_error)?;
        let tokenizer = Tokenizer::from_bytes(
            tokenizer_json,
            tokenizer_config.as_deref(),
            chat_template.as_deref(),
        )
        .map_err(|e| js_error(lean::LeanError::Tokenizer(e)))?;
        let engine = Engine::new(model, tokenizer, context_length as usize).map_err(js_error)?;
        Ok(WasmEngine { engine })
    }

    /// Generates from `prompt_json` (`{"messages": [{"role", "content"}, ...]}`, `{"raw": text}`
    /// or `{"ids": [...]}`) with `options_json` (all optional: `max_tokens` (256), `temperature`
    /// (0 = greedy), `top_k`, `top_p`, `min_p`, `repetition_penalty`, `seed`, `stop_token_ids`
    /// (default: the tokenizer's end-of-sequence ids)), calling `on_token(text, tokenId)` for each
    /// token; a callback returning `false` stops generation, and one that throws stops it and the
    /// exception is rethrown. Returns the generation as JSON
    /// `{prompt_ids, token_ids, text, finish_reason}`; finish_reason is "stop", "length",
    /// "context_full" or "cancelled".
    pub fn generate(
        &mut self,
        prompt_json: &str,
        options_json: &str,
        on_token: &js_sys::Function,
    ) -> Result<String, JsValue> {
        let prompt: PromptJson = serde_json::from_str(prompt_json)
            .map_err(|e| js_error(format!("invalid prompt JSON: {e}")))?;
        let options: OptionsJson = serde_json::from_str(options_json)
            .map_err(|e| js_error(format!("invalid options JSON: {e}")))?;
        let mut callback_error = None;
        let generation = self
            .engine
            .generate(&prompt.into(), &options.into(), |event| {
                match on_token.call2(
                    &JsValue::NULL,
                    &JsValue::from_str(&event.text),
                    &JsValue::from(event.id),
                ) {
                    Ok(keep_going) => keep_going.as_bool() != Some(false),
                    Err(thrown) => {
                        callback_error = Some(thrown);
                        false
                    }
                }
            })
            .map_err(js_error)?;
        if let Some(thrown) = callback_error {
            return Err(thrown);
        }
        serde_json::to_string(&GenerationJson::from(generation))
            .map_err(|e| js_error(format!("serializing the generation: {e}")).into())
    }

    /// The ids of `text` as a raw prompt (`{"raw": text}`) would be tokenized, special tokens
    /// (e.g. a BOS) included.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsError> {
        self.engine
            .encode(&Prompt::Raw(text.to_owned()))
            .map_err(js_error)
    }

    /// The context window actually allocated (the requested one capped at the model's).
    #[wasm_bindgen(js_name = contextLength)]
    pub fn context_length(&self) -> u32 {
        self.engine.context_length() as u32
    }
}

/// Which compute backend this build runs: the single-thread simd128 CPU kernels. A free function
/// so that a loader can ask before fetching a model.
#[wasm_bindgen]
pub fn backend() -> String {
    "simd".to_owned()
}
