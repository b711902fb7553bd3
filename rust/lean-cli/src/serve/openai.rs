//! OpenAI's wire format: requests are read field by field (so that an error names its
//! parameter, as OpenAI's do), and responses, stream chunks and errors are built with OpenAI's
//! field names and object types.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lean::tokenizer::FullChatMessage;
use lean::tools::{self, ToolCall, ToolError, Tools};
use lean::SamplingParams;
use serde_json::{json, Map, Value};

/// `{"error": {"message", "type", "param", "code"}}` with its HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    fn unsupported(param: &str, why: &str) -> Self {
        ApiError {
            code: Some("unsupported_parameter"),
            ..Self::invalid(
                Some(param),
                format!("'{param}' is not supported by lean: {why}"),
            )
        }
    }

    pub fn with_code(self, code: &'static str) -> Self {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    pub fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<ToolError> for ApiError {
    fn from(e: ToolError) -> Self {
        ApiError::invalid(Some(&e.param), e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[derive(Copy, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
}

pub enum Input {
    Chat(Vec<FullChatMessage>),
    Raw(String),
}

/// A request, checked: everything lean needs to run it.
pub struct Request {
    /// Echoed in the responses (any value is accepted: the server has one model).
    pub model: Option<String>,
    pub input: Input,
    /// `None`: as many as the context leaves room for (chat), as OpenAI does.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// lean's extra: generate past the end-of-turn tokens (fixed-length generations).
    pub ignore_eos: bool,
    /// `response_format`'s constraint (JSON object or schema); `None` for free text.
    pub constraint: Option<lean_constraint::ConstraintSpec>,
    /// `chat_template_kwargs` (vLLM's and llama.cpp's name): extra variables of the chat
    /// template, e.g. Qwen3's `{"enable_thinking": false}`.
    pub template_kwargs: Map<String, Value>,
    /// `tools` with `tool_choice` (chat only); `None` without tools or with `tool_choice: "none"`.
    pub tools: Option<Tools>,
    /// `prediction` (OpenAI's predicted outputs): text the reply is expected to resemble, used as
    /// speculative decoding's guesses.
    pub prediction: Option<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Most `stop` strings a request may give, as OpenAI.
const MAX_STOP_STRINGS: usize = 4;
/// Legacy completions generate 16 tokens unless told otherwise, as OpenAI's do.
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

/// Typed access to the request's fields; absent and `null` are the same.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_f64().ok_or_else(|| {
                    ApiError::invalid(Some(name), format!("'{name}' must be a number"))
                })
            })
            .transpose()
    }

    fn integer(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_i64().ok_or_else(|| {
                    ApiError::invalid(Some(name), format!("'{name}' must be an integer, got {v}"))
                })
            })
            .transpose()
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    ApiError::invalid(Some(name), format!("'{name}' must be a boolean"))
                })
            })
            .transpose()
    }
}

/// Parses and checks a request body for `endpoint`. `context_length` bounds max_tokens.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    context_length: usize,
) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| ApiError::invalid(None, "the request body must be a JSON object"))?;
    let fields = Fields(object);
    refuse_unsupported(&fields, endpoint)?;

    let input = match endpoint {
        Endpoint::Chat => Input::Chat(parse_messages(fields.get("messages"))?),
        Endpoint::Completion => Input::Raw(parse_prompt(fields.get("prompt"))?),
    };
    let model = match fields.get("model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid(Some("model"), "'model' must be a string")),
    };
    let max_tokens = parse_max_tokens(&fields, endpoint, context_length)?;

    let temperature = fields.number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            Some("temperature"),
            format!("'temperature' must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_k = match fields.integer("top_k")?.unwrap_or(0) {
        k if k < 0 => 0, // llama.cpp's convention: a negative top_k disables it.
        k => k as usize,
    };
    let seed = match fields.integer("seed")? {
        Some(seed) => seed as u64,
        // Unseeded sampling differs from call to call, as OpenAI's does.
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    let sampling = SamplingParams {
        temperature: temperature as f32,
        top_k,
        top_p: fields.number("top_p")?.unwrap_or(1.0) as f32,
        min_p: fields.number("min_p")?.unwrap_or(0.0) as f32,
        repetition_penalty: fields.number("repetition_penalty")?.unwrap_or(1.0) as f32,
        seed,
    };
    sampling
        .validate()
        .map_err(|e| ApiError::invalid(None, e.to_string()))?;

    let stream = fields.boolean("stream")?.unwrap_or(false);
    let tools = match endpoint {
        Endpoint::Chat => tools::parse_tools(fields.get("tools"), fields.get("tool_choice"))?,
        Endpoint::Completion => None,
    };
    if fields
        .get("parallel_tool_calls")
        .is_some_and(|v| !v.is_boolean())
    {
        return Err(ApiError::invalid(
            Some("parallel_tool_calls"),
            "'parallel_tool_calls' must be a boolean",
        ));
    }
    let constraint = parse_response_format(fields.get("response_format"))?;
    if constraint.is_some() && tools.as_ref().is_some_and(Tools::forced) {
        return Err(ApiError::invalid(
            Some("tool_choice"),
            "a required tool call cannot be combined with 'response_format': the call's \
             arguments follow the function's parameters schema",
        ));
    }
    let include_usage = match fields.get("stream_options") {
        None => false,
        Some(Value::Object(options)) => Fields(options)
            .boolean("include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    Some("stream_options.include_usage"),
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("stream_options"),
                "'stream_options' must be an object",
            ))
        }
    };
    if include_usage && !stream {
        return Err(ApiError::invalid(
            Some("stream_options"),
            "'stream_options' is only allowed when 'stream' is true",
        ));
    }

    Ok(Request {
        model,
        input,
        max_tokens,
        sampling,
        stop: parse_stop(fields.get("stop"))?,
        ignore_eos: fields.boolean("ignore_eos")?.unwrap_or(false),
        constraint,
        template_kwargs: parse_template_kwargs(fields.get("chat_template_kwargs"), endpoint)?,
        tools,
        prediction: parse_prediction(fields.get("prediction"))?,
        stream,
        include_usage,
    })
}

/// `prediction`: `{"type": "content", "content": text or an array of text parts}`.
fn parse_prediction(prediction: Option<&Value>) -> Result<Option<String>, ApiError> {
    let Some(prediction) = prediction else {
        return Ok(None);
    };
    let bad = |what: &str| Err(ApiError::invalid(Some("prediction"), what));
    let Some(object) = prediction.as_object() else {
        return bad("'prediction' must be an object: {\"type\": \"content\", \"content\": ...}");
    };
    if object.get("type").and_then(Value::as_str) != Some("content") {
        return bad("'prediction.type' must be \"content\"");
    }
    match object.get("content") {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => {
            let texts =
                parts
                    .iter()
                    .map(|part| {
                        match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(text))) => Ok(text.as_str()),
                    _ => Err(ApiError::invalid(
                        Some("prediction.content"),
                        "'prediction.content' parts must be {\"type\": \"text\", \"text\": ...}",
                    )),
                }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(texts.concat()))
        }
        _ => bad("'prediction.content' must be a string or an array of text parts"),
    }
}

/// `chat_template_kwargs`: an object of extra chat-template variables (chat completions only).
fn parse_template_kwargs(
    kwargs: Option<&Value>,
    endpoint: Endpoint,
) -> Result<Map<String, Value>, ApiError> {
    let param = Some("chat_template_kwargs");
    match (kwargs, endpoint) {
        (None, _) => Ok(Map::new()),
        (Some(_), Endpoint::Completion) => Err(ApiError::invalid(
            param,
            "'chat_template_kwargs' applies to /v1/chat/completions only (a completion has no template)",
        )),
        (Some(Value::Object(map)), Endpoint::Chat) => Ok(map.clone()),
        (Some(other), Endpoint::Chat) => Err(ApiError::invalid(
            param,
            format!("'chat_template_kwargs' must be an object of template variables, got {other}"),
        )),
    }
}

/// Parameters that would change the output in ways lean does not implement: refused by name
/// rather than ignored.
fn refuse_unsupported(fields: &Fields, endpoint: Endpoint) -> Result<(), ApiError> {
    if let Some(n) = fields.integer("n")? {
        if n != 1 {
            return Err(ApiError::unsupported("n", "one choice per request (n = 1)"));
        }
    }
    if let Some(best_of) = fields.integer("best_of")? {
        if best_of != 1 {
            return Err(ApiError::unsupported("best_of", "one choice per request"));
        }
    }
    let logprobs_on = match fields.get("logprobs") {
        None | Some(Value::Bool(false)) => false,
        Some(v) => v.as_i64() != Some(0),
    };
    if logprobs_on {
        return Err(ApiError::unsupported(
            "logprobs",
            "log probabilities are not returned",
        ));
    }
    if fields.get("top_logprobs").is_some() {
        return Err(ApiError::unsupported(
            "top_logprobs",
            "log probabilities are not returned",
        ));
    }
    // The legacy function calling (before `tools`); on completions, tools of any kind.
    let (lists, choices) = match endpoint {
        Endpoint::Chat => (&["functions"][..], &["function_call"][..]),
        Endpoint::Completion => (
            &["tools", "functions"][..],
            &["tool_choice", "function_call"][..],
        ),
    };
    let why = match endpoint {
        Endpoint::Chat => "use 'tools' and 'tool_choice'",
        Endpoint::Completion => "tool calls are made on /v1/chat/completions",
    };
    for &name in lists {
        if fields
            .get(name)
            .is_some_and(|v| v.as_array().is_none_or(|list| !list.is_empty()))
        {
            return Err(ApiError::unsupported(name, why));
        }
    }
    for &name in choices {
        if fields.get(name).is_some_and(|v| v != "none") {
            return Err(ApiError::unsupported(name, why));
        }
    }
    if let Some(bias) = fields.get("logit_bias") {
        if bias.as_object().is_none_or(|b| !b.is_empty()) {
            return Err(ApiError::unsupported("logit_bias", "no logit bias"));
        }
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if fields.number(name)?.is_some_and(|p| p != 0.0) {
            return Err(ApiError::unsupported(
                name,
                "only 0 (lean has repetition_penalty, transformers' multiplicative penalty)",
            ));
        }
    }
    if endpoint == Endpoint::Completion {
        if fields.boolean("echo")?.unwrap_or(false) {
            return Err(ApiError::unsupported("echo", "the prompt is not echoed"));
        }
        if fields.get("suffix").is_some() {
            return Err(ApiError::unsupported("suffix", "no fill-in-the-middle"));
        }
    }
    Ok(())
}

/// OpenAI's `response_format`: `{"type": "text"}` (free text), `{"type": "json_object"}` (any
/// JSON object) or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
/// The schema is compiled later (a schema the library rejects is a 400 too, see
/// `Server::check_constraint`); `strict` is accepted either way: the output always follows the
/// schema.
fn parse_response_format(
    format: Option<&Value>,
) -> Result<Option<lean_constraint::ConstraintSpec>, ApiError> {
    use lean_constraint::ConstraintSpec;
    let Some(format) = format else {
        return Ok(None);
    };
    let param = Some("response_format");
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            param,
            "'response_format' must be an object with a string 'type'",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
        "json_schema" => {
            let Some(spec) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::invalid(
                    param,
                    "'response_format.json_schema' must be an object with 'name' and 'schema'",
                ));
            };
            if spec.get("name").is_some_and(|n| !n.is_string()) {
                return Err(ApiError::invalid(
                    param,
                    "'response_format.json_schema.name' must be a string",
                ));
            }
            if spec.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                return Err(ApiError::invalid(
                    param,
                    "'response_format.json_schema.strict' must be a boolean",
                ));
            }
            match spec.get("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(ConstraintSpec::JsonSchema(schema.clone())))
                }
                // OpenAI's default: any JSON value... but an object is what callers mean.
                None | Some(Value::Null) => Ok(Some(ConstraintSpec::JsonObject)),
                Some(other) => Err(ApiError::invalid(
                    param,
                    format!("'response_format.json_schema.schema' must be a JSON schema object, got {other}"),
                )),
            }
        }
        other => Err(ApiError::invalid(
            param,
            format!(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{other}'"
            ),
        )),
    }
}

pub fn parse_messages(messages: Option<&Value>) -> Result<Vec<FullChatMessage>, ApiError> {
    let param = Some("messages");
    let messages = match messages {
        None => return Err(ApiError::invalid(param, "'messages' is required")),
        Some(Value::Array(list)) if list.is_empty() => {
            return Err(ApiError::invalid(param, "'messages' must not be empty"))
        }
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid(param, "'messages' must be an array")),
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let message = message.as_object().ok_or_else(|| {
                ApiError::invalid(Some(&format!("messages[{i}]")), format!("messages[{i}] must be an object"))
            })?;
            let role = match message.get("role").and_then(Value::as_str) {
                // OpenAI's newer name for the system message.
                Some("system" | "developer") => "system",
                Some(role @ ("user" | "assistant" | "tool")) => role,
                Some("function") => {
                    return Err(ApiError::unsupported(
                        &at("role"),
                        "the legacy 'function' role: use 'tool' messages (with 'tool_call_id')",
                    ))
                }
                Some(role) => {
                    return Err(ApiError::invalid(
                        Some(&at("role")),
                        format!("messages[{i}] has an unknown role '{role}' (expected system, developer, user, assistant or tool)"),
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        Some(&at("role")),
                        format!("messages[{i}].role is required and must be a string"),
                    ))
                }
            };
            let tool_calls = match message.get("tool_calls").filter(|v| !v.is_null()) {
                None => None,
                Some(_) if role != "assistant" => {
                    return Err(ApiError::invalid(
                        Some(&at("tool_calls")),
                        format!("messages[{i}] has 'tool_calls' but role '{role}': only an assistant calls tools"),
                    ))
                }
                // An empty list is no call (some clients send one).
                Some(calls) => Some(tools::template_tool_calls(calls, i)?).filter(|c| !c.is_empty()),
            };
            let content = match message.get("content") {
                Some(Value::String(text)) => Some(text.clone()),
                Some(Value::Array(parts)) => Some(text_parts(parts, i)?),
                // An assistant that only calls tools has no content (`null`), as OpenAI's.
                None | Some(Value::Null) if tool_calls.is_some() => None,
                _ => {
                    return Err(ApiError::invalid(
                        Some(&at("content")),
                        format!("messages[{i}].content must be a string or an array of text parts"),
                    ))
                }
            };
            let string_field = |name: &str| -> Result<Option<String>, ApiError> {
                match message.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(ApiError::invalid(
                        Some(&at(name)),
                        format!("messages[{i}].{name} must be a string"),
                    )),
                }
            };
            Ok(FullChatMessage {
                role: role.to_string(),
                content,
                tool_calls,
                tool_call_id: string_field("tool_call_id")?,
                name: string_field("name")?,
            })
        })
        .collect()
}

/// OpenAI's array-of-parts content, text parts only, joined by newlines.
fn text_parts(parts: &[Value], i: usize) -> Result<String, ApiError> {
    let texts = parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let param = format!("messages[{i}].content[{j}]");
            match part.get("type").and_then(Value::as_str) {
                Some("text") => part.get("text").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid(Some(&param), format!("{param}.text must be a string"))
                }),
                Some(other) => Err(ApiError::invalid(
                    Some(&format!("{param}.type")),
                    format!("{param} is a '{other}' part: lean takes text parts only"),
                )),
                None => Err(ApiError::invalid(
                    Some(&format!("{param}.type")),
                    format!("{param} needs a 'type'"),
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n"))
}

/// A string, or an array holding one string (OpenAI's batch of prompts, of one).
fn parse_prompt(prompt: Option<&Value>) -> Result<String, ApiError> {
    match prompt {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(list)) if list.len() == 1 && list[0].is_string() => {
            Ok(list[0].as_str().unwrap_or_default().to_string())
        }
        None => Err(ApiError::invalid(Some("prompt"), "'prompt' is required")),
        Some(_) => Err(ApiError::invalid(
            Some("prompt"),
            "'prompt' must be a string (or an array of one string): lean serves one prompt per request",
        )),
    }
}

fn parse_max_tokens(
    fields: &Fields,
    endpoint: Endpoint,
    context_length: usize,
) -> Result<Option<usize>, ApiError> {
    // max_completion_tokens is the newer name (chat); it wins when both are given.
    let name = match fields.get("max_completion_tokens") {
        Some(_) => "max_completion_tokens",
        None => "max_tokens",
    };
    let Some(max) = fields.integer(name)? else {
        return Ok((endpoint == Endpoint::Completion).then_some(COMPLETION_DEFAULT_MAX_TOKENS));
    };
    if max < 1 {
        return Err(ApiError::invalid(
            Some(name),
            format!("'{name}' must be at least 1, got {max}"),
        ));
    }
    if max as u64 > context_length as u64 {
        return Err(ApiError::invalid(
            Some(name),
            format!("'{name}' is {max}, more than the context of {context_length} tokens holds"),
        ));
    }
    Ok(Some(max as usize))
}

fn parse_stop(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let param = Some("stop");
    let stops: Vec<String> = match stop {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::invalid(param, "'stop' must be a string or an array of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                param,
                "'stop' must be a string or an array of strings",
            ))
        }
    };
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            param,
            format!(
                "'stop' takes at most {MAX_STOP_STRINGS} strings, got {}",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(param, "stop strings must not be empty"));
    }
    Ok(stops)
}

/// Token counts as OpenAI's `usage` reports them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the slot's cache.
    pub cached_tokens: usize,
    /// Speculative decoding's guesses kept and refused (OpenAI reports them for predictions).
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

impl Usage {
    fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens,
            },
        })
    }
}

/// What every response and chunk of one request repeats.
pub struct ResponseHeader {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHeader {
    fn object(&self, streamed: bool) -> &'static str {
        match (self.endpoint, streamed) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, streamed: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(streamed),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The whole (non-streamed) response.
    pub fn response(&self, text: &str, finish_reason: &str, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        let mut response = self.envelope(false, json!([choice]));
        response["usage"] = usage.to_json();
        response
    }

    /// The whole chat response with tool calls (`content`: the text around them, if any).
    pub fn response_with_calls(
        &self,
        content: Option<&str>,
        calls: &[ToolCall],
        usage: Usage,
    ) -> Value {
        let choice = json!({
            "index": 0,
            "message": {
                "role": "assistant",
                "content": content,
                "refusal": null,
                "tool_calls": tools::openai_tool_calls(calls, false),
            },
            "logprobs": null,
            "finish_reason": "tool_calls",
        });
        let mut response = self.envelope(false, json!([choice]));
        response["usage"] = usage.to_json();
        response
    }

    /// The stream chunk of the calls: OpenAI's `delta.tool_calls` with each call's `index`, and
    /// its whole arguments in one piece.
    pub fn tool_calls_chunk(&self, calls: &[ToolCall], with_usage: bool) -> Value {
        let choice = json!({
            "index": 0,
            "delta": {"tool_calls": tools::openai_tool_calls(calls, true)},
            "logprobs": null,
            "finish_reason": null,
        });
        let mut chunk = self.envelope(true, json!([choice]));
        if with_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// A stream chunk: the first one of a chat says the role; the last has the finish reason.
    /// `with_usage`: the request asked for a usage chunk at the end, so every chunk has
    /// `"usage": null`, as OpenAI's do.
    pub fn chunk(
        &self,
        first: bool,
        text: &str,
        finish_reason: Option<&str>,
        with_usage: bool,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match (first, finish_reason) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, Some(_)) if text.is_empty() => json!({}),
                    (false, _) => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        let mut chunk = self.envelope(true, json!([choice]));
        if with_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// `stream_options.include_usage`'s last chunk: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut chunk = self.envelope(true, json!([]));
        chunk["usage"] = usage.to_json();
        chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(endpoint: Endpoint, body: Value) -> Result<Request, ApiError> {
        parse_request(endpoint, body.to_string().as_bytes(), 1024)
    }

    #[test]
    fn chat_template_kwargs_are_an_object_of_a_chat() {
        let messages = json!([{"role": "user", "content": "hi"}]);
        let request = parse(
            Endpoint::Chat,
            json!({"messages": messages, "chat_template_kwargs": {"enable_thinking": false}}),
        )
        .unwrap();
        assert_eq!(request.template_kwargs["enable_thinking"], json!(false));
        let bad = parse(
            Endpoint::Chat,
            json!({"messages": messages, "chat_template_kwargs": [1]}),
        );
        assert_eq!(
            bad.err().unwrap().param.as_deref(),
            Some("chat_template_kwargs")
        );
        let completion = parse(
            Endpoint::Completion,
            json!({"prompt": "hi", "chat_template_kwargs": {"enable_thinking": false}}),
        );
        assert!(completion.is_err());
    }

    fn error_param(body: Value) -> Option<String> {
        parse(Endpoint::Chat, body).err().expect("an error").param
    }

    #[test]
    fn chat_request_fields() {
        let r = parse(
            Endpoint::Chat,
            json!({"model": "x", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "user", "content": "hi"}],
                   "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "stop": "\n", "stream": true,
                   "stream_options": {"include_usage": true}, "n": 1, "presence_penalty": 0, "logit_bias": {}}),
        )
        .unwrap();
        let Input::Chat(messages) = &r.input else {
            panic!()
        };
        assert_eq!(messages[0], FullChatMessage::new("system", "a\nb"));
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.stop, ["\n"]);
        assert!(r.stream && r.include_usage);
        assert!(r.sampling.is_greedy());
    }

    #[test]
    fn completion_defaults_to_16_tokens_and_chat_to_the_context() {
        let r = parse(Endpoint::Completion, json!({"prompt": ["abc"]})).unwrap();
        assert_eq!(r.max_tokens, Some(16));
        let r = parse(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .unwrap();
        assert_eq!(r.max_tokens, None);
        assert_eq!(r.sampling.temperature, 1.0);
    }

    #[test]
    fn errors_name_their_parameter() {
        let user = json!([{"role": "user", "content": "x"}]);
        assert_eq!(error_param(json!({})).as_deref(), Some("messages"));
        assert_eq!(
            error_param(json!({"messages": []})).as_deref(),
            Some("messages")
        );
        assert_eq!(
            error_param(json!({"messages": [{"role": "robot", "content": "x"}]})).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            error_param(json!({"messages": [{"role": "user", "content": 3}]})).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            error_param(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}))
                .as_deref(),
            Some("messages[0].content[0].type")
        );
        for (name, value) in [
            ("n", json!(2)),
            ("logprobs", json!(true)),
            ("tools", json!("get_weather")),
            ("tool_choice", json!("sometimes")),
            ("functions", json!([{"name": "f"}])),
            ("response_format", json!({"type": "xml"})),
            (
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
            ),
            ("logit_bias", json!({"50256": -100})),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(-1)),
            ("max_tokens", json!(0)),
            ("max_tokens", json!(-3)),
            ("max_tokens", json!(1_000_000_000)),
            ("temperature", json!(3)),
            ("stop", json!(["a", "b", "c", "d", "e"])),
        ] {
            let mut body = json!({"messages": user});
            body[name] = value;
            assert_eq!(error_param(body).as_deref(), Some(name), "{name}");
        }
        let e = parse_request(Endpoint::Chat, b"{not json", 1024)
            .err()
            .unwrap();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("JSON"), "{}", e.message);
    }

    #[test]
    fn tool_messages_reach_the_template_in_transformers_shape() {
        let r = parse(
            Endpoint::Chat,
            json!({"messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
            ], "tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": "required",
               "parallel_tool_calls": false}),
        )
        .unwrap();
        let Input::Chat(messages) = &r.input else {
            panic!()
        };
        assert_eq!(messages[1].content, None);
        assert_eq!(
            messages[1].tool_calls,
            Some(vec![
                json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}})
            ])
        );
        assert_eq!(messages[2].role, "tool");
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("call_1"));
        assert!(r.tools.unwrap().forced());

        let user = json!({"role": "user", "content": "x"});
        for (messages, param) in [
            (
                json!([{"role": "user", "content": "x", "tool_calls": []}]),
                "messages[0].tool_calls",
            ),
            (
                json!([user, {"role": "assistant", "content": null}]),
                "messages[1].content",
            ),
            (
                json!([user, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                json!([user, {"role": "assistant", "tool_calls": [{"type": "function"}]}]),
                "messages[1].tool_calls[0].function",
            ),
            (
                json!([user, {"role": "tool", "content": "r", "tool_call_id": 3}]),
                "messages[1].tool_call_id",
            ),
            (
                json!([{"role": "function", "content": "x", "name": "f"}]),
                "messages[0].role",
            ),
        ] {
            assert_eq!(
                error_param(json!({"messages": messages})).as_deref(),
                Some(param),
                "{messages}"
            );
        }
        let bad = parse(
            Endpoint::Chat,
            json!({"messages": [user], "tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": "required", "response_format": {"type": "json_object"}}),
        );
        assert_eq!(bad.err().unwrap().param.as_deref(), Some("tool_choice"));
        let completion = parse(
            Endpoint::Completion,
            json!({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}),
        );
        assert_eq!(completion.err().unwrap().param.as_deref(), Some("tools"));
    }

    #[test]
    fn chunks_look_like_openai() {
        let header = ResponseHeader {
            endpoint: Endpoint::Chat,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        };
        let first = header.chunk(true, "", None, true);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            first["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert!(first["usage"].is_null() && first.as_object().unwrap().contains_key("usage"));
        let last = header.chunk(false, "", Some("stop"), false);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert!(!last.as_object().unwrap().contains_key("usage"));
        let usage = header.usage_chunk(Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
            ..Usage::default()
        });
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 5);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }
}
