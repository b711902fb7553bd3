//! `lean-cli serve`: a local OpenAI-compatible HTTP server. Requests are parsed and tokenized
//! here, generated on a slot's engine (slots.rs) and answered in OpenAI's format (openai.rs),
//! whole or streamed as server-sent events.
mod openai;
mod slots;
mod stop;

use crate::{
    init_threads, load_draft_model, load_model, model_and_tokenizer, new_session, CliResult, Common,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use futures_util::stream::{self, StreamExt};
use lean::tokenizer::FullChatMessage;
use lean::tools::{self, CallSplitter, Syntax, Tools};
use lean::{Engine, GenerateOptions, Tokenizer};
use openai::{ApiError, Endpoint, Input, Request, ResponseHeader};
use serde_json::json;
use slots::{Job, QueueFull, SlotEvent, Slots};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// Request bodies above this get 413 (a long conversation is well under it).
const MAX_BODY_BYTES: usize = 4 << 20;
/// Response header that says how many messages `--truncation auto` dropped.
const DROPPED_MESSAGES_HEADER: &str = "x-lean-dropped-messages";

/// OpenAI-shaped chat messages (lean-cli's `--messages`: calls and tool results too), read as
/// the server reads them; the error names the field.
pub fn parse_messages(messages: &serde_json::Value) -> Result<Vec<FullChatMessage>, String> {
    openai::parse_messages(Some(messages))
        .map_err(|e| format!("{}: {}", e.param.unwrap_or_default(), e.message))
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    common: Common,
    /// tokenizer.json or its directory, or `gguf` (default: as for generation: next to the model, else the GGUF's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Address to listen on (loopback by default: the server has no authentication).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (the bound address goes to stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Generations that run at once, each with its own KV cache of --ctx positions and its own
    /// thread (the model's weights are mapped once and shared).
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Requests that may wait for a slot; more are refused with 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// A conversation too long for the context: refused with 400 (off), or its oldest turns
    /// after the system message dropped until it fits (auto; the response's
    /// x-lean-dropped-messages header says how many messages).
    #[arg(long, default_value = "off", value_parser = ["auto", "off"])]
    truncation: String,
    /// Speculative decoding by prompt lookup: guesses of up to N tokens verified in one batched
    /// pass (under a response_format or a forced tool call, guesses are cut where it refuses
    /// them). Greedy replies are the same as without it; sampled ones have the same distribution.
    #[arg(long, value_name = "N")]
    lookup: Option<usize>,
    /// Speculative decoding by a draft model: a smaller GGUF
    /// with the same vocabulary guesses greedily (each slot has its own copy of its KV cache; the
    /// weights are mapped once). A request's `prediction` still guesses by prompt lookup.
    #[arg(long, value_name = "FILE", conflicts_with = "lookup")]
    draft: Option<PathBuf>,
    /// The draft model's longest guess, in tokens (default 8).
    #[arg(long, value_name = "N", requires = "draft")]
    draft_max: Option<usize>,
}

/// Guess length of speculative decoding from a request's `prediction` when `--lookup` is not set.
const DEFAULT_PREDICTION_DRAFT: usize = 8;

struct Server {
    slots: Arc<Slots>,
    /// For tokenizing requests before they have a slot (the slots' engines have their own).
    tokenizer: Tokenizer,
    context_length: usize,
    model_name: String,
    truncate: bool,
    /// Prompt lookup's draft length for greedy requests (`--lookup`).
    lookup: Option<usize>,
    /// The draft model's longest guess when there is one (`--draft`).
    draft_max: Option<usize>,
    started: u64,
    /// The model's logits (the vocabulary constraints are compiled over).
    vocab_size: usize,
    /// The vocabulary as the constraint library sees it, made on the first `response_format`
    /// request: a schema is compiled here first, so that one the library rejects is a 400
    /// before the request takes a slot.
    constraint_vocab: OnceLock<Result<Arc<lean_constraint::Vocabulary>, String>>,
    /// How the chat template takes tools, found on the first request that needs it: the syntax
    /// it teaches, or `None` when it does not render `tools` (then lean's fallback: the tools
    /// in the system message, Hermes syntax).
    tool_template: OnceLock<Option<Syntax>>,
}

pub fn run(args: ServeArgs) -> CliResult {
    if args.lookup == Some(0) {
        return Err("--lookup needs drafts of at least one token".into());
    }
    if args.slots == 0 {
        return Err("--slots must be at least 1".into());
    }
    if args.draft_max == Some(0) {
        return Err("--draft-max needs guesses of at least one token".into());
    }
    init_threads(args.common.threads)?;
    let (model_path, tok_source) = model_and_tokenizer(&args.common, args.tokenizer.as_ref())?;
    let mut engines = Vec::new();
    for _ in 0..args.slots {
        // Natively the model file is memory-mapped: every slot's engine shares its pages.
        let (model, _) = load_model(&args.common)?;
        let tokenizer = tok_source.load(&model.gguf)?;
        let backend = args.common.backend.clone();
        let mut engine = Engine::with_backend(model, tokenizer, args.common.ctx, |model, ctx| {
            new_session(&backend, model, ctx)
        })?;
        if let Some(draft) = &args.draft {
            load_draft_model(&mut engine, draft, &backend)?;
        }
        engines.push(engine);
    }
    eprintln!(
        "lean: {} ({}) · backend {} · {} slot(s) of {} tokens",
        model_path.display(),
        engines[0].model.describe(),
        engines[0].backend(),
        engines.len(),
        engines[0].context_length(),
    );
    let vocab_size = engines[0].model.config.vocab_size;
    let server = Arc::new(Server {
        context_length: engines[0].context_length(),
        tokenizer: tok_source.load(&engines[0].model.gguf)?,
        slots: Slots::start(engines, args.queue),
        model_name: model_path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned()),
        truncate: args.truncation == "auto",
        lookup: args.lookup,
        draft_max: args.draft.as_ref().map(|_| args.draft_max.unwrap_or(8)),
        started: unix_seconds(),
        vocab_size,
        constraint_vocab: OnceLock::new(),
        tool_template: OnceLock::new(),
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(server);

    // One thread for the HTTP side is plenty: it only parses and relays; the slots compute.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
        eprintln!("lean: listening on http://{}", listener.local_addr()?);
        axum::serve(listener, app).await?;
        Ok(())
    })
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn health(State(server): State<Arc<Server>>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "slots": server.slots.len(),
        "free_slots": server.slots.free_slots(),
        "queued": server.slots.queued(),
        "backends": server.slots.backends(),
    }))
}

async fn models(State(server): State<Arc<Server>>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": server.model_name,
            "object": "model",
            "created": server.started,
            "owned_by": "lean",
        }],
    }))
}

async fn not_found() -> ApiError {
    ApiError {
        code: Some("unknown_url"),
        ..ApiError::status(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown route: lean serves GET /v1/models, POST /v1/chat/completions, POST /v1/completions and GET /health",
        )
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method not allowed on this route",
    )
}

async fn chat_completions(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(server, Endpoint::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(server, Endpoint::Completion, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// A request's prompt, tokenized and fitted to the context.
struct Prepared {
    ids: Vec<u32>,
    max_tokens: usize,
    dropped_messages: usize,
    /// `response_format`'s, or a required tool call's, compiled.
    constraint: Option<lean_constraint::Constraint>,
    /// The syntax of the calls to parse out of the reply (a request with tools).
    tool_syntax: Option<Syntax>,
}

async fn serve(
    server: Arc<Server>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body =
        body.map_err(|e| ApiError::status(e.status(), "invalid_request_error", e.body_text()))?;
    let request = openai::parse_request(endpoint, &body, server.context_length)?;
    // Rendering the chat template and tokenizing take milliseconds: off the async thread.
    let (request, prepared) = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || {
            let prepared = server.prepare(&request);
            (request, prepared)
        })
        .await
        .map_err(|e| internal_error(format!("tokenizing the request failed: {e}")))?
    };
    let prepared = prepared?;
    let lease = server
        .slots
        .acquire(&prepared.ids)
        .await
        .map_err(|QueueFull| {
            ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!(
                    "all {} slot(s) are busy and the queue is full: retry later",
                    server.slots.len()
                ),
            )
            .with_code("server_busy")
        })?;
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut options = GenerateOptions {
        max_tokens: prepared.max_tokens,
        sampling: request.sampling.clone(),
        stop_token_ids: None,
        constraint: None,
        speculation: None,
    };
    // Speculative decoding: a request's prediction by prompt lookup (guesses of up to
    // DEFAULT_PREDICTION_DRAFT tokens unless `--lookup` says otherwise), else `--draft`'s model,
    // else `--lookup`; under a constraint too (the engine cuts guesses where it refuses them).
    let prediction = match &request.prediction {
        Some(text) => Some(server.tokenizer.encode(text, false).map_err(|e| {
            ApiError::invalid(
                Some("prediction"),
                format!("'prediction' cannot be tokenized: {e}"),
            )
        })?),
        None => None,
    };
    options.speculation = match (prediction, server.draft_max) {
        (Some(prediction), _) => Some(
            lean::Speculation::lookup(server.lookup.unwrap_or(DEFAULT_PREDICTION_DRAFT))
                .with_prediction(prediction),
        ),
        (None, Some(n)) => Some(lean::Speculation::draft_model(n)),
        (None, None) => server.lookup.map(lean::Speculation::lookup),
    };
    if request.ignore_eos {
        options.stop_token_ids = Some(Vec::new());
    }
    lease.run(Job {
        ids: prepared.ids,
        options,
        constraint: prepared.constraint,
        stop: request.stop.clone(),
        events,
    });
    let header = ResponseHeader {
        endpoint,
        id: new_id(endpoint),
        created: unix_seconds(),
        model: request
            .model
            .clone()
            .unwrap_or_else(|| server.model_name.clone()),
    };
    let tools = prepared.tool_syntax.zip(request.tools.clone());
    let mut response = match request.stream {
        true => stream_response(header, request.include_usage, tools, receiver).into_response(),
        false => whole_response(header, tools, receiver)
            .await?
            .into_response(),
    };
    if prepared.dropped_messages > 0 {
        response.headers_mut().insert(
            DROPPED_MESSAGES_HEADER,
            HeaderValue::from(prepared.dropped_messages),
        );
    }
    Ok(response)
}

impl Server {
    /// Tokenizes the prompt and checks that it and max_tokens fit in the context, dropping the
    /// oldest turns with `--truncation auto`. Without max_tokens, a chat may fill the context.
    fn prepare(&self, request: &Request) -> Result<Prepared, ApiError> {
        let mut constraint = match &request.constraint {
            Some(spec) => {
                Some(self.compile_constraint(spec, request.ignore_eos, "response_format")?)
            }
            None => None,
        };
        let tokenizer_error = |e: lean::tokenizer::TokenizerError| {
            ApiError::invalid(None, format!("cannot tokenize the prompt: {e}"))
        };
        let room = |prompt_tokens: usize| match request.max_tokens {
            Some(max) => (prompt_tokens + max <= self.context_length).then_some(max),
            None => {
                (prompt_tokens < self.context_length).then(|| self.context_length - prompt_tokens)
            }
        };
        let messages = match &request.input {
            Input::Raw(text) => {
                let ids = self.tokenizer.encode(text, true).map_err(tokenizer_error)?;
                return match room(ids.len()) {
                    Some(max_tokens) if !ids.is_empty() => Ok(Prepared {
                        ids,
                        max_tokens,
                        dropped_messages: 0,
                        constraint,
                        tool_syntax: None,
                    }),
                    Some(_) => Err(ApiError::invalid(Some("prompt"), "the prompt is empty")),
                    None => Err(self.too_long(ids.len(), request.max_tokens, "prompt")),
                };
            }
            Input::Chat(messages) => messages,
        };
        // Tools: as the template's `tools` variable, or lean's fallback for a template without.
        let chat = tools::prepare_chat(
            self.tool_template(),
            messages,
            request.tools.as_ref(),
            &request.template_kwargs,
        );
        if let Some(grammar) = chat.grammar {
            let spec = lean_constraint::ConstraintSpec::Lark(grammar);
            constraint = Some(self.compile_constraint(&spec, request.ignore_eos, "tools")?);
        }
        let (messages, kwargs, tool_syntax) = (chat.messages, chat.kwargs, chat.syntax);
        let mut kept: Vec<FullChatMessage> = messages.clone();
        loop {
            let ids = self
                .tokenizer
                .encode_chat_full(&kept, true, &kwargs)
                .map_err(tokenizer_error)?;
            if let Some(max_tokens) = room(ids.len()) {
                return Ok(Prepared {
                    ids,
                    max_tokens,
                    dropped_messages: messages.len() - kept.len(),
                    constraint,
                    tool_syntax,
                });
            }
            if !self.truncate || !drop_oldest_turn(&mut kept) {
                return Err(self.too_long(ids.len(), request.max_tokens, "messages"));
            }
        }
    }

    /// How the chat template takes tools (`tools::template_syntax`), found once.
    fn tool_template(&self) -> Option<Syntax> {
        *self
            .tool_template
            .get_or_init(|| tools::template_syntax(&self.tokenizer))
    }

    /// Compiles a constraint (`response_format`'s, or a required tool call's: `param`) before
    /// the request queues: one the library refuses is a 400 naming the problem, and the slot's
    /// engine follows this compiled one (`Engine::begin_constrained`).
    fn compile_constraint(
        &self,
        spec: &lean_constraint::ConstraintSpec,
        ignore_eos: bool,
        param: &str,
    ) -> Result<lean_constraint::Constraint, ApiError> {
        if ignore_eos {
            return Err(ApiError::invalid(
                Some("ignore_eos"),
                format!(
                    "'ignore_eos' cannot be combined with '{param}': a structured reply ends \
                     where its format does"
                ),
            ));
        }
        let vocab = self
            .constraint_vocab
            .get_or_init(|| {
                lean_constraint::Vocabulary::new(
                    &self.tokenizer,
                    self.vocab_size,
                    &self.tokenizer.eos_token_ids(),
                )
                .map(Arc::new)
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| {
                ApiError::invalid(
                    Some(param),
                    format!("structured output is not available for this model: {e}"),
                )
            })?;
        let code = match param {
            "tools" => "invalid_tools",
            _ => "invalid_response_format",
        };
        lean_constraint::Constraint::new(vocab, spec).map_err(|e| {
            let message = match param {
                "tools" => format!("a function's parameters schema is not usable: {e}"),
                _ => e.to_string(),
            };
            ApiError::invalid(Some(param), message).with_code(code)
        })
    }

    fn too_long(&self, prompt_tokens: usize, max_tokens: Option<usize>, param: &str) -> ApiError {
        let asked = match max_tokens {
            Some(max) => format!(
                "{prompt_tokens} prompt tokens + {max} max_tokens = {} tokens",
                prompt_tokens + max
            ),
            None => format!("{prompt_tokens} prompt tokens and at least 1 to generate"),
        };
        let remedy = match self.truncate {
            true => "even with only the system message and the last message left; shorten them or lower max_tokens",
            false => "shorten the prompt, lower max_tokens, or start the server with --truncation auto to drop the oldest turns",
        };
        ApiError::invalid(
            Some(param),
            format!(
                "this request needs {asked}, but the context holds {} tokens ({remedy})",
                self.context_length
            ),
        )
        .with_code("context_length_exceeded")
    }
}

/// Drops the oldest turn after the leading system messages: its first message and the replies
/// up to the next user message (so that the conversation still starts with a user). The last
/// message always stays. Returns false when there is nothing left to drop.
fn drop_oldest_turn(messages: &mut Vec<FullChatMessage>) -> bool {
    let first = messages.iter().take_while(|m| m.role == "system").count();
    if first + 1 >= messages.len() {
        return false;
    }
    let mut end = first + 1;
    while end + 1 < messages.len() && messages[end].role != "user" {
        end += 1;
    }
    messages.drain(first..end);
    true
}

fn internal_error(message: String) -> ApiError {
    ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
}

fn generation_error(e: lean::LeanError) -> ApiError {
    internal_error(format!("generation failed: {e}"))
}

/// `chatcmpl-…` / `cmpl-…`, unique within the process and across restarts.
fn new_id(endpoint: Endpoint) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{prefix}-{nanos:x}{:04x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn whole_response(
    header: ResponseHeader,
    tools: Option<(Syntax, Tools)>,
    mut receiver: UnboundedReceiver<SlotEvent>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut text = String::new();
    while let Some(event) = receiver.recv().await {
        match event {
            SlotEvent::Text(piece) => text.push_str(&piece),
            SlotEvent::Done(outcome) => {
                let usage = outcome.usage();
                let calls = tools.as_ref().and_then(|(syntax, tools)| {
                    tools::parse_reply(&text, *syntax, tools, outcome.finish_reason)
                });
                if let Some((content, calls)) = calls {
                    return Ok(Json(header.response_with_calls(
                        content.as_deref(),
                        &calls,
                        usage,
                    )));
                }
                return Ok(Json(header.response(&text, outcome.finish_reason, usage)));
            }
            SlotEvent::Failed(e) => return Err(generation_error(e)),
        }
    }
    Err(internal_error(
        "the generation ended without a result".into(),
    ))
}

/// Server-sent events: `data: {chunk}` per piece of text, a last chunk with the finish reason,
/// the usage chunk if asked, then `data: [DONE]`. Dropping the stream (the client went away)
/// closes the channel, which stops the generation. With tools, text that may be a call is held
/// back to the end (`CallSplitter`); a call goes out as one `delta.tool_calls` chunk.
fn stream_response(
    header: ResponseHeader,
    include_usage: bool,
    tools: Option<(Syntax, Tools)>,
    receiver: UnboundedReceiver<SlotEvent>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let data = |value: serde_json::Value| Event::default().data(value.to_string());
    let header = Arc::new(header);
    let opening = (header.endpoint == Endpoint::Chat)
        .then(|| data(header.chunk(true, "", None, include_usage)));
    let splitter = tools.as_ref().map(|(syntax, _)| CallSplitter::new(*syntax));
    let tools = Arc::new(tools);
    let events = stream::unfold(Some((receiver, splitter)), move |state| {
        let header = header.clone();
        let tools = tools.clone();
        async move {
            let (mut receiver, mut splitter) = state?;
            let text_chunk = |text: &str| data(header.chunk(false, text, None, include_usage));
            let events = match receiver.recv().await {
                Some(SlotEvent::Text(text)) => {
                    let text = match &mut splitter {
                        Some(splitter) => splitter.push(&text),
                        None => text,
                    };
                    let events = match text.is_empty() {
                        true => Vec::new(),
                        false => vec![text_chunk(&text)],
                    };
                    return Some((events, Some((receiver, splitter))));
                }
                Some(SlotEvent::Done(outcome)) => {
                    let mut events = Vec::new();
                    let mut finish_reason = outcome.finish_reason;
                    if let (Some(splitter), Some((syntax, tools))) = (splitter, tools.as_ref()) {
                        let held = splitter.finish();
                        match tools::parse_reply(&held, *syntax, tools, finish_reason) {
                            Some((content, calls)) => {
                                if let Some(content) = content {
                                    events.push(text_chunk(&content));
                                }
                                events.push(data(header.tool_calls_chunk(&calls, include_usage)));
                                finish_reason = "tool_calls";
                            }
                            None if !held.is_empty() => events.push(text_chunk(&held)),
                            None => {}
                        }
                    }
                    events.push(data(header.chunk(
                        false,
                        "",
                        Some(finish_reason),
                        include_usage,
                    )));
                    if include_usage {
                        events.push(data(header.usage_chunk(outcome.usage())));
                    }
                    events
                }
                Some(SlotEvent::Failed(e)) => vec![data(generation_error(e).body())],
                None => vec![data(
                    internal_error("the generation ended without a result".into()).body(),
                )],
            };
            let mut events = events;
            events.push(Event::default().data("[DONE]"));
            Some((events, None))
        }
    });
    let all = stream::iter(opening)
        .chain(events.flat_map(stream::iter))
        .map(Ok);
    Sse::new(all)
}
