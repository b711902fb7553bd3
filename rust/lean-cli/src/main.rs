//! lean-cli: generate text from a GGUF model on the command line, benchmark it, or serve it
//! over OpenAI's HTTP API.
mod bench;
mod bench_chat;
mod bench_spec;
mod inflate;
mod serve;
mod tokenize;

use clap::{Args, Parser, Subcommand};
use lean::cpu::CpuSession;
use lean::tokenizer::FullChatMessage;
use lean::tools::{self, CallSplitter, Tools};
use lean::{
    ChatMessage, Engine, GenerateOptions, LeanError, Model, Prompt, SamplingParams, Session,
    Tokenizer,
};
use lean_gpu::{GpuContext, GpuSession, Kernels};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "lean-cli",
    version,
    about = "Generate text with a GGUF model (chat by default)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Prefill and decode speed over repetitions, with peak memory.
    Bench(bench::BenchArgs),
    /// A multi-turn chat's time to first token per turn, with and without the KV cache carried over.
    BenchChat(bench_chat::BenchChatArgs),
    /// Speculative decoding by prompt lookup against plain decoding on three tasks (same tokens).
    BenchSpec(bench_spec::BenchSpecArgs),
    /// A model grown to a bigger model's shapes, computing the same function (for benchmarks).
    Inflate(inflate::InflateArgs),
    /// A local OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions).
    Serve(serve::ServeArgs),
    /// The ids of a text (or of JSON Lines strings from stdin) as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
}

#[derive(Args, Clone)]
pub struct Common {
    /// The GGUF model file.
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// CPU threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context length: KV cache positions (capped at the model's).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Compute backend: the CPU (SIMD kernels, threads) or the GPU (wgpu: Vulkan, Metal, DX12).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "gpu"])]
    pub backend: String,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// tokenizer.json, or a directory with tokenizer.json [+ tokenizer_config.json, chat_template.jinja],
    /// or `gguf` for the model file's own tokenizer metadata. Default: next to the model (a
    /// tokenizer.json there, or a directory whose name starts the model's file name), else the GGUF's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The user message (or the text to complete with --raw).
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// A system message for chat.
    #[arg(long)]
    system: Option<String>,
    /// Plain completion of --prompt, without the chat template.
    #[arg(long)]
    raw: bool,
    /// A JSON file with an OpenAI-style array of messages (multi-turn chat): {"role", "content"},
    /// an assistant's "tool_calls" and "tool" results ("tool_call_id") too.
    #[arg(long)]
    messages: Option<PathBuf>,
    /// Tool calling: a JSON file with OpenAI's `tools` array ([{"type": "function", "function":
    /// {"name", "description", "parameters"}}]), rendered through the chat template (or lean's
    /// fallback system message for a template without tools); a call the model writes is
    /// printed as OpenAI's `tool_calls` (finish reason `tool_calls`).
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
    /// With --tools: `auto` (the model decides), `none` (no tools), `required` (exactly one call,
    /// constrained to a function's parameters schema) or a function's name (a call to it).
    #[arg(long, value_name = "CHOICE", requires = "tools")]
    tool_choice: Option<String>,
    /// Extra chat-template variables, a JSON object: e.g. '{"enable_thinking": false}' (Qwen3),
    /// '{"date_string": "26 Jul 2024"}' (Llama 3.x).
    #[arg(long, value_name = "JSON")]
    template_kwargs: Option<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object at the end (prompt ids, generated ids, text, timings) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Speculative decoding by prompt lookup: guess up to N tokens by matching the last tokens
    /// earlier in the prompt and output, and verify the guess in one batched pass. Greedy output
    /// is the same as without it; sampled output has the same distribution.
    #[arg(long, value_name = "N")]
    lookup: Option<usize>,
    /// Speculative decoding by a draft model: a smaller GGUF with the same vocabulary (e.g.
    /// SmolLM2-135M for SmolLM2-1.7B) guesses greedily on the same backend, and the guesses are
    /// verified as with --lookup.
    #[arg(long, value_name = "FILE", conflicts_with = "lookup")]
    draft: Option<PathBuf>,
    /// The draft model's longest guess, in tokens (default 8).
    #[arg(long, value_name = "N", requires = "draft")]
    draft_max: Option<usize>,
    /// Structured output: the reply is any JSON object.
    #[arg(long, group = "constraint")]
    json_object: bool,
    /// Structured output: the reply is JSON valid under the JSON schema in this file.
    #[arg(long, value_name = "FILE", group = "constraint")]
    json_schema: Option<PathBuf>,
    /// Structured output: the reply matches this regex in full.
    #[arg(long, value_name = "RE", group = "constraint")]
    regex: Option<String>,
    /// Structured output: the reply follows the Lark grammar in this file (llguidance's dialect).
    #[arg(long, value_name = "FILE", group = "constraint")]
    grammar: Option<PathBuf>,
}

impl RunArgs {
    /// `--tools` and `--tool-choice`, checked as the server checks `tools` and `tool_choice`.
    fn tools(&self) -> CliResult<Option<Tools>> {
        let Some(path) = &self.tools else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let list: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("--tools {}: not JSON: {e}", path.display()))?;
        let choice = self.tool_choice.as_deref().map(|c| match c {
            "auto" | "none" | "required" => serde_json::Value::String(c.into()),
            name => serde_json::json!({"type": "function", "function": {"name": name}}),
        });
        tools::parse_tools(Some(&list), choice.as_ref())
            .map_err(|e| format!("--tools/--tool-choice: {}: {}", e.param, e.message).into())
    }

    /// The constraint the flags ask for, read from its file where it is one.
    fn constraint(&self) -> CliResult<Option<lean_constraint::ConstraintSpec>> {
        use lean_constraint::ConstraintSpec;
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
        };
        Ok(if self.json_object {
            Some(ConstraintSpec::JsonObject)
        } else if let Some(path) = &self.json_schema {
            let schema = serde_json::from_str(&read(path)?)
                .map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
            Some(ConstraintSpec::JsonSchema(schema))
        } else if let Some(rx) = &self.regex {
            Some(ConstraintSpec::Regex(rx.clone()))
        } else if let Some(path) = &self.grammar {
            Some(ConstraintSpec::Lark(read(path)?))
        } else {
            None
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::BenchChat(args)) => bench_chat::run(args),
        Some(Command::BenchSpec(args)) => bench_spec::run(args),
        Some(Command::Inflate(args)) => inflate::run(args),
        Some(Command::Serve(args)) => serve::run(args),
        Some(Command::Tokenize(args)) => tokenize::run(args),
        None => run(cli.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lean-cli: error: {e}");
            ExitCode::FAILURE
        }
    }
}

pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

pub fn init_threads(threads: Option<usize>) -> CliResult<usize> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if n == 0 {
        return Err("--threads must be at least 1".into());
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()?;
    Ok(n)
}

/// A session of the chosen backend for `model` with `context` positions: the CPU, or the GPU
/// adapter wgpu prefers (its name goes to stderr).
pub fn new_session(backend: &str, model: &Model, context: usize) -> lean::Result<Box<dyn Session>> {
    if backend != "gpu" {
        return Ok(Box::new(CpuSession::new(model, context)));
    }
    let gpu_error = |e: lean_gpu::GpuError| LeanError::Backend(format!("GPU: {e}"));
    let gpu = pollster::block_on(GpuContext::new()).map_err(gpu_error)?;
    eprintln!("lean: GPU adapter {}", gpu.describe());
    // Matvecs reduce with subgroupAdd where the adapter has subgroups (LEAN_GPU_SUBGROUPS=0:
    // never, to compare).
    let subgroups = gpu.features().contains(lean_gpu::wgpu::Features::SUBGROUP)
        && std::env::var("LEAN_GPU_SUBGROUPS").map_or(true, |v| v != "0");
    let kernels = match subgroups {
        true => pollster::block_on(Kernels::with_subgroup_matvec(&gpu)),
        false => pollster::block_on(Kernels::new(&gpu)),
    }
    .map_err(gpu_error)?;
    let session =
        GpuSession::new(Arc::new(gpu), Arc::new(kernels), model, context).map_err(gpu_error)?;
    Ok(Box::new(session))
}

/// An engine for `model` and `tokenizer` on `common`'s backend with its context length, and the
/// GGUF at `draft` as its draft model when given (on the same backend).
pub fn new_engine(
    common: &Common,
    model: Model,
    tokenizer: Tokenizer,
    draft: Option<&Path>,
) -> CliResult<Engine> {
    let backend = &common.backend;
    let mut engine = Engine::with_backend(model, tokenizer, common.ctx, |model, context| {
        new_session(backend, model, context)
    })?;
    // A lost GPU device: the generation continues on the CPU with the same tokens.
    engine.on_backend_change(Box::new(|change| {
        eprintln!(
            "\nlean: the GPU device was lost ({}) after {} generated tokens; continuing on {} \
             (same tokens)",
            change.reason, change.generated_tokens, change.to
        )
    }));
    if let Some(draft) = draft {
        load_draft_model(&mut engine, draft, backend)?;
    }
    Ok(engine)
}

/// Loads the GGUF at `path` as `engine`'s draft model, on `backend` (its description goes to
/// stderr).
pub(crate) fn load_draft_model(engine: &mut Engine, path: &Path, backend: &str) -> CliResult<()> {
    let model = Model::load_file(path).map_err(|e| format!("--draft {}: {e}", path.display()))?;
    engine
        .set_draft_model(model, |model, context| new_session(backend, model, context))
        .map_err(|e| format!("--draft {}: {e}", path.display()))?;
    eprintln!(
        "lean: draft model {} ({})",
        path.display(),
        engine.draft_model().unwrap_or_default()
    );
    Ok(())
}

pub fn load_model(common: &Common) -> CliResult<(Model, f64)> {
    let path = common.model.as_ref().ok_or("--model is required")?;
    let t = Instant::now();
    let model = Model::load_file(path)?;
    Ok((model, t.elapsed().as_secs_f64()))
}

/// A tokenizer.json next to the model, or a directory whose name the model's file name starts with.
fn find_tokenizer(model: &Path) -> Option<PathBuf> {
    let dir = model
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if dir.join("tokenizer.json").is_file() {
        return Some(dir.to_path_buf());
    }
    let stem = model.file_stem()?.to_string_lossy().to_lowercase();
    let mut best: Option<(usize, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().to_lowercase();
        if entry.path().join("tokenizer.json").is_file()
            && stem.starts_with(&name)
            && best.as_ref().is_none_or(|(l, _)| name.len() > *l)
        {
            best = Some((name.len(), entry.path()));
        }
    }
    best.map(|(_, p)| p)
}

/// Where the tokenizer comes from: tokenizer files, or the GGUF's own metadata.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// A tokenizer.json or its directory (with tokenizer_config.json, chat_template.jinja).
    Files(PathBuf),
    /// The model file's `tokenizer.ggml.*` metadata and `tokenizer.chat_template`.
    Gguf,
}

impl TokenizerSource {
    /// `--tokenizer gguf`, `--tokenizer PATH`, or (no flag) tokenizer files found next to the model,
    /// else the GGUF's metadata.
    pub fn choose(model: &Path, explicit: Option<&PathBuf>) -> TokenizerSource {
        match explicit {
            Some(p) if p.as_os_str() == "gguf" => TokenizerSource::Gguf,
            Some(p) => TokenizerSource::Files(p.clone()),
            None => find_tokenizer(model).map_or(TokenizerSource::Gguf, TokenizerSource::Files),
        }
    }

    pub fn load(&self, gguf: &lean::gguf::Gguf) -> CliResult<Tokenizer> {
        match self {
            TokenizerSource::Files(path) => Ok(Tokenizer::from_path(path)?),
            TokenizerSource::Gguf => Tokenizer::from_gguf(gguf, None, None).map_err(|e| {
                format!(
                    "{e} (no tokenizer.json was given or found next to the model: pass --tokenizer)"
                )
                .into()
            }),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            TokenizerSource::Files(path) => path.display().to_string(),
            TokenizerSource::Gguf => "the GGUF's metadata".into(),
        }
    }
}

/// The model file `--model` names, checked to exist, and where its tokenizer comes from.
pub fn model_and_tokenizer(
    common: &Common,
    explicit: Option<&PathBuf>,
) -> CliResult<(PathBuf, TokenizerSource)> {
    let model_path = common.model.clone().ok_or("--model is required")?;
    if !model_path.is_file() {
        return Err(format!("{}: no such model file", model_path.display()).into());
    }
    let source = TokenizerSource::choose(&model_path, explicit);
    Ok((model_path, source))
}

/// The prompt before the tokenizer is loaded.
enum Input {
    Raw(String),
    Chat(Vec<FullChatMessage>),
}

fn run(args: RunArgs) -> CliResult {
    init_threads(args.common.threads)?;
    let (model_path, tok_source) = model_and_tokenizer(&args.common, args.tokenizer.as_ref())?;
    // A chat: the messages as OpenAI's API takes them (calls and tool results included).
    let prompt = if let Some(file) = &args.messages {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: expected a JSON array of {{\"role\", \"content\"}} objects: {e}",
                file.display()
            )
        })?;
        let messages =
            serve::parse_messages(&value).map_err(|e| format!("{}: {e}", file.display()))?;
        Input::Chat(messages)
    } else {
        let text = args
            .prompt
            .clone()
            .ok_or("give --prompt TEXT (or --messages FILE)")?;
        if args.raw {
            Input::Raw(text)
        } else {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(FullChatMessage::new("system", system.clone()));
            }
            messages.push(FullChatMessage::new("user", text));
            Input::Chat(messages)
        }
    };
    let tools = args.tools()?;
    if tools.is_some() && matches!(prompt, Input::Raw(_)) {
        return Err("--tools applies to chat prompts, not --raw".into());
    }

    let template_kwargs = match &args.template_kwargs {
        None => None,
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => Some(map),
            Ok(other) => {
                return Err(format!("--template-kwargs must be a JSON object, got {other}").into())
            }
            Err(e) => return Err(format!("--template-kwargs is not valid JSON: {e}").into()),
        },
    };
    if template_kwargs.is_some() && matches!(prompt, Input::Raw(_)) {
        return Err("--template-kwargs applies to chat prompts, not --raw".into());
    }

    let (model, load_seconds) = load_model(&args.common)?;
    let t = Instant::now();
    let tokenizer = tok_source.load(&model.gguf)?;
    let load_seconds = load_seconds + t.elapsed().as_secs_f64();
    eprintln!("lean: {} ({})", model_path.display(), model.describe());
    eprintln!("lean: tokenizer from {}", tok_source.describe());
    let t = Instant::now();
    let mut engine = new_engine(&args.common, model, tokenizer, args.draft.as_deref())?;
    let load_seconds = load_seconds + t.elapsed().as_secs_f64();
    eprintln!(
        "lean: loaded in {:.2}s · backend {} · context {}",
        load_seconds,
        engine.backend(),
        engine.context_length()
    );

    let mut constraint = args.constraint()?;
    // The chat: plain messages go in as before; extra template variables, tools, calls or tool
    // results are rendered here (tools through the template, or lean's fallback) and go in as ids.
    let mut tool_syntax = None;
    let prompt = match prompt {
        Input::Raw(text) => Prompt::Raw(text),
        Input::Chat(messages) => {
            let plain = template_kwargs.is_none()
                && tools.is_none()
                && messages
                    .iter()
                    .all(|m| m.tool_calls.is_none() && m.role != "tool" && m.content.is_some());
            if plain {
                Prompt::Chat(
                    messages
                        .into_iter()
                        .map(|m| ChatMessage::new(m.role, m.content.unwrap_or_default()))
                        .collect(),
                )
            } else {
                let template = tools::template_syntax(&engine.tokenizer);
                let chat = tools::prepare_chat(
                    template,
                    &messages,
                    tools.as_ref(),
                    &template_kwargs.unwrap_or_default(),
                );
                if let Some(grammar) = chat.grammar {
                    if constraint.is_some() {
                        return Err("--tool-choice required (or a function's name) cannot be \
                                    combined with --json-schema/--json-object/--regex/--grammar: \
                                    the call's arguments follow the function's schema"
                            .into());
                    }
                    constraint = Some(lean_constraint::ConstraintSpec::Lark(grammar));
                }
                tool_syntax = chat.syntax;
                Prompt::Ids(engine.tokenizer.encode_chat_full(
                    &chat.messages,
                    true,
                    &chat.kwargs,
                )?)
            }
        }
    };
    let options = GenerateOptions {
        max_tokens: args.tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repetition_penalty,
            seed: args.seed,
        },
        stop_token_ids: None,
        constraint,
        speculation: match (args.lookup, &args.draft) {
            (Some(n), _) => Some(lean::Speculation::lookup(n)),
            (None, Some(_)) => Some(lean::Speculation::draft_model(args.draft_max.unwrap_or(8))),
            (None, None) => None,
        },
    };
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    // With tools, text that may be a call is held back and parsed at the end.
    let mut splitter = tool_syntax.filter(|_| stream).map(CallSplitter::new);
    let generation = engine.generate(&prompt, &options, |event| {
        if stream {
            let text = match &mut splitter {
                Some(splitter) => splitter.push(&event.text),
                None => event.text.clone(),
            };
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
        true
    })?;
    let finish_reason = generation.finish_reason.as_str();
    // Streamed, the calls are in the held text (what went out holds none); else in the whole.
    let held = splitter.map(CallSplitter::finish);
    let calls = match (tool_syntax, &tools) {
        (Some(syntax), Some(tools)) => {
            let text = held.as_deref().unwrap_or(&generation.text);
            tools::parse_reply(text, syntax, tools, finish_reason)
        }
        _ => None,
    };
    let finish_reason = match calls {
        Some(_) => "tool_calls",
        None => finish_reason,
    };
    let tool_calls = calls
        .as_ref()
        .map(|(_, calls)| tools::openai_tool_calls(calls, false));
    if stream {
        let rest = match (&calls, held) {
            (Some((content, _)), _) => content.clone().unwrap_or_default(),
            (None, held) => held.unwrap_or_default(),
        };
        let _ = stdout.write_all(rest.as_bytes());
        let _ = writeln!(stdout);
        if let Some(tool_calls) = &tool_calls {
            writeln!(
                stdout,
                "{}",
                serde_json::json!({ "tool_calls": tool_calls })
            )?;
        }
    }
    let t = &generation.timings;
    eprintln!(
        "lean: prompt {} tokens, prefill {:.1} tok/s · generated {} tokens, decode {:.1} tok/s · finish: {}",
        t.prompt_tokens,
        t.prefill_tokens_per_second(),
        t.generated_tokens,
        t.decode_tokens_per_second(),
        finish_reason
    );
    let spec = &t.speculation;
    if let Some(speculation) = &options.speculation {
        eprintln!(
            "lean: {}: {} verification passes, {} of {} guessed tokens accepted ({:.0}%), {} \
             steps without a guess while passes did not pay",
            match speculation {
                lean::Speculation::Lookup { .. } => "prompt lookup",
                lean::Speculation::DraftModel { .. } => "draft model",
            },
            spec.verifications,
            spec.accepted,
            spec.drafted,
            100.0 * spec.acceptance_rate(),
            spec.paused_steps
        );
    }
    if args.json {
        let mut out = serde_json::json!({
            "prompt_ids": generation.prompt_ids,
            "token_ids": generation.token_ids,
            "text": generation.text,
            "finish_reason": finish_reason,
            "timings": {
                "load_seconds": load_seconds,
                "prompt_tokens": t.prompt_tokens,
                "generated_tokens": t.generated_tokens,
                "prefill_seconds": t.prefill_seconds,
                "decode_seconds": t.decode_seconds,
                "prefill_tokens_per_second": t.prefill_tokens_per_second(),
                "decode_tokens_per_second": t.decode_tokens_per_second(),
                "speculation": {
                    "verifications": spec.verifications,
                    "drafted_tokens": spec.drafted,
                    "accepted_tokens": spec.accepted,
                    "acceptance_rate": spec.acceptance_rate(),
                    "paused_steps": spec.paused_steps,
                },
            },
        });
        if let Some(change) = &generation.backend_change {
            out["backend_change"] = serde_json::json!({
                "from": change.from,
                "to": change.to,
                "reason": change.reason,
                "generated_tokens": change.generated_tokens,
                "replayed_tokens": change.replayed_tokens,
            });
        }
        // With --tools: the reply as OpenAI's message (content around the calls, or null).
        if tools.is_some() {
            out["content"] = match &calls {
                Some((content, _)) => serde_json::json!(content),
                None => serde_json::json!(generation.text),
            };
            out["tool_calls"] = tool_calls.unwrap_or_default();
        }
        writeln!(stdout, "{out}")?;
    }
    Ok(())
}
