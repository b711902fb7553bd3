//! Tool calls (OpenAI's `tools` and `tool_choice`): the request's tools, checked; the messages
//! of a conversation with calls and results, shaped for templates without tool support; the
//! model's output parsed into calls; and, for a call that must happen (`tool_choice` "required"
//! or a named function), the Lark grammar that makes the output exactly one call in the model's
//! syntax with arguments valid under the function's `parameters` schema.
//!
//! Two syntaxes, as the chat templates teach them:
//! - Hermes (Qwen2.5, Qwen3, and lean's fallback for templates without tools):
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one or more;
//! - Llama 3.x: the whole reply is `{"name": ..., "parameters": {...}}` (after an optional
//!   `<|python_tag|>`).
//!
//! Output that does not parse as calls (malformed JSON, an unknown function, text that only
//! looks like a call) is the reply's content, as it was written.
use crate::tokenizer::FullChatMessage;
use crate::Tokenizer;
use serde_json::value::RawValue;
use serde_json::{json, Value};

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// A request's tools or messages that cannot be used: `param` names the field (OpenAI's
/// `param`: `tools[1].function.name`, `tool_choice`, `messages[2].tool_calls`…).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError {
    pub param: String,
    pub message: String,
}

impl ToolError {
    pub fn new(param: &str, message: impl Into<String>) -> Self {
        ToolError {
            param: param.to_string(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for ToolError {}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The arguments' JSON schema (`{"type": "object", "properties": {}}` when not given).
    pub parameters: Value,
    /// `{"type": "function", "function": {name, description, parameters}}`: what the template
    /// gets as an element of `tools`.
    pub definition: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides; a call it writes is returned as a call.
    Auto,
    /// Exactly one call, to any of the tools (constrained).
    Required,
    /// Exactly one call to this function (constrained).
    Named(String),
}

/// A request's tools, when there are some and `tool_choice` is not "none".
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
}

impl Tools {
    /// Whether the output must be a call (a constrained generation).
    pub fn forced(&self) -> bool {
        self.choice != ToolChoice::Auto
    }

    /// The `tools` variable of the chat template.
    pub fn definitions(&self) -> Value {
        Value::Array(self.tools.iter().map(|t| t.definition.clone()).collect())
    }

    fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name.as_str()).collect()
    }

    /// The tools a forced call may use.
    fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            _ => self.tools.iter().collect(),
        }
    }
}

/// How the model writes a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    Hermes,
    Llama3,
}

/// `tools` and `tool_choice`, checked. `Ok(None)`: no tools (absent or empty), or
/// `tool_choice: "none"` (then the tools are not rendered and no call is parsed).
pub fn parse_tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
) -> Result<Option<Tools>, ToolError> {
    let list = match tools {
        None => &Vec::new(),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ToolError::new(
                "tools",
                format!("'tools' must be an array of {{\"type\": \"function\", \"function\": {{...}}}}, got {other}"),
            ))
        }
    };
    let mut parsed: Vec<Tool> = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let tool = parse_tool(tool, i)?;
        if parsed.iter().any(|t| t.name == tool.name) {
            return Err(ToolError::new(
                &format!("tools[{i}].function.name"),
                format!(
                    "tools[{i}]: the function name '{}' is given twice",
                    tool.name
                ),
            ));
        }
        parsed.push(tool);
    }
    let param = "tool_choice";
    let choice = match choice {
        None => None,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => Some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            other => {
                return Err(ToolError::new(
                    param,
                    format!("'tool_choice' must be 'none', 'auto', 'required' or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got '{other}'"),
                ))
            }
        },
        Some(Value::Object(object)) => {
            let name = match (object.get("type"), object.get("function")) {
                (Some(Value::String(kind)), Some(function)) if kind == "function" => {
                    function.get("name").and_then(Value::as_str)
                }
                _ => None,
            };
            let Some(name) = name else {
                return Err(ToolError::new(
                    param,
                    "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            };
            if !parsed.iter().any(|t| t.name == name) {
                return Err(ToolError::new(
                    param,
                    format!("'tool_choice' names the function '{name}', which is not among 'tools'"),
                ));
            }
            Some(ToolChoice::Named(name.to_string()))
        }
        Some(other) => {
            return Err(ToolError::new(
                param,
                format!("'tool_choice' must be a string or an object, got {other}"),
            ))
        }
    };
    if parsed.is_empty() {
        return match choice {
            None | Some(ToolChoice::Auto) => Ok(None),
            Some(_) => Err(ToolError::new(
                param,
                "'tool_choice' requires 'tools' (a call is required, but no function is given)",
            )),
        };
    }
    Ok(Some(Tools {
        tools: parsed,
        choice: choice.unwrap_or(ToolChoice::Auto),
    }))
}

fn parse_tool(tool: &Value, i: usize) -> Result<Tool, ToolError> {
    let at = |field: &str| format!("tools[{i}]{field}");
    let invalid = |field: &str, message: String| Err(ToolError::new(&at(field), message));
    let Some(object) = tool.as_object() else {
        return invalid("", format!("tools[{i}] must be an object"));
    };
    match object.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return invalid(
                ".type",
                format!("tools[{i}] has type '{other}': lean takes 'function' tools only"),
            )
        }
        None => return invalid(".type", format!("tools[{i}].type must be 'function'")),
    }
    let Some(function) = object.get("function").and_then(Value::as_object) else {
        return invalid(
            ".function",
            format!("tools[{i}].function must be an object with a 'name'"),
        );
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if valid_name(name) => name.clone(),
        Some(Value::String(name)) => {
            return invalid(
                ".function.name",
                format!(
                    "tools[{i}].function.name '{name}' must be 1 to 64 letters, digits, '_' or '-'"
                ),
            )
        }
        _ => {
            return invalid(
                ".function.name",
                format!("tools[{i}].function.name is required and must be a string"),
            )
        }
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(other) => {
            return invalid(
                ".function.parameters",
                format!("tools[{i}].function.parameters must be a JSON schema object, got {other}"),
            )
        }
    };
    let mut definition = json!({"name": name});
    if let Some(description) = function.get("description").filter(|d| !d.is_null()) {
        if !description.is_string() {
            return invalid(
                ".function.description",
                format!("tools[{i}].function.description must be a string"),
            );
        }
        definition["description"] = description.clone();
    }
    definition["parameters"] = parameters.clone();
    Ok(Tool {
        name,
        parameters,
        definition: json!({"type": "function", "function": definition}),
    })
}

/// OpenAI's rule for function names: `^[a-zA-Z0-9_-]{1,64}$`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An assistant message's `tool_calls` as the templates read them (transformers' convention):
/// `[{"id", "type": "function", "function": {"name", "arguments": <object>}}]`; OpenAI sends
/// `arguments` as a JSON string, which is parsed here. `i` is the message's index.
pub fn template_tool_calls(calls: &Value, i: usize) -> Result<Vec<Value>, ToolError> {
    let param = format!("messages[{i}].tool_calls");
    let Some(list) = calls.as_array() else {
        return Err(ToolError::new(&param, format!("{param} must be an array")));
    };
    list.iter()
        .enumerate()
        .map(|(j, call)| {
            let at = format!("{param}[{j}]");
            let function = call.get("function").and_then(Value::as_object);
            let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
            let (Some(function), Some(name)) = (function, name) else {
                return Err(ToolError::new(&format!("{at}.function"),
                    format!("{at} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"),
                ));
            };
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                    ToolError::new(&format!("{at}.function.arguments"),
                        format!("{at}.function.arguments is not valid JSON: {e}"),
                    )
                })?,
                Some(value) => value.clone(),
            };
            let mut shaped = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            if let Some(id) = call.get("id").filter(|id| !id.is_null()) {
                shaped["id"] = id.clone();
            }
            Ok(shaped)
        })
        .collect()
}

/// The fallback for a chat template that does not render `tools` (SmolLM2's): the tools are
/// described in the system message (merged into the first one, or a new one first) with the
/// Hermes instructions Qwen2.5's template writes; past calls become `<tool_call>` text in the
/// assistant's content and tool results user messages in `<tool_response>` tags, as Qwen's
/// template renders them.
pub fn fallback_messages(
    messages: &[FullChatMessage],
    tools: Option<&Tools>,
) -> Vec<FullChatMessage> {
    let mut out: Vec<FullChatMessage> = messages
        .iter()
        .map(
            |message| match (message.role.as_str(), &message.tool_calls) {
                ("assistant", Some(calls)) => {
                    let mut text = message.content.clone().unwrap_or_default();
                    for call in calls {
                        let function = &call["function"];
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&format!(
                            "{HERMES_OPEN}\n{{\"name\": {}, \"arguments\": {}}}\n{HERMES_CLOSE}",
                            function["name"], function["arguments"]
                        ));
                    }
                    FullChatMessage::new("assistant", text)
                }
                ("tool", _) => FullChatMessage::new(
                    "user",
                    format!(
                        "<tool_response>\n{}\n</tool_response>",
                        message.content.as_deref().unwrap_or_default()
                    ),
                ),
                _ => message.clone(),
            },
        )
        .collect();
    if let Some(tools) = tools {
        let description = fallback_system_text(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                let content = first.content.get_or_insert_with(String::new);
                if !content.is_empty() {
                    content.push_str("\n\n");
                }
                content.push_str(&description);
            }
            _ => out.insert(0, FullChatMessage::new("system", description)),
        }
    }
    out
}

fn fallback_system_text(tools: &Tools) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in &tools.tools {
        text.push('\n');
        text.push_str(&tool.definition.to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// The Lark grammar (llguidance's dialect) of exactly one call, in `syntax`, to one of the
/// callable tools, its arguments valid under that tool's schema; JSON spaced as Python's
/// `json.dumps` (what the templates write), so the model sees its own format.
pub fn forced_call_grammar(tools: &Tools, syntax: Syntax) -> String {
    let callable = tools.callable();
    let mut grammar = String::from("start: ");
    let alternatives: Vec<String> = (0..callable.len()).map(|i| format!("call_{i}")).collect();
    grammar.push_str(&alternatives.join(" | "));
    grammar.push('\n');
    for (i, tool) in callable.iter().enumerate() {
        let name = Value::String(tool.name.clone()).to_string();
        let (before, after) = match syntax {
            Syntax::Hermes => (
                format!("{HERMES_OPEN}\n{{\"name\": {name}, \"arguments\": "),
                format!("}}\n{HERMES_CLOSE}"),
            ),
            Syntax::Llama3 => (
                format!("{{\"name\": {name}, \"parameters\": "),
                "}".to_string(),
            ),
        };
        let mut schema = tool.parameters.clone();
        if let Some(object) = schema.as_object_mut() {
            object.entry("x-guidance").or_insert_with(|| {
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
            });
        }
        // Lark's string literals are JSON strings.
        grammar.push_str(&format!(
            "call_{i}: {} args_{i} {}\nargs_{i}: %json {schema}\n",
            Value::String(before),
            Value::String(after)
        ));
    }
    grammar
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (an object), as the model wrote it.
    pub arguments: String,
}

/// The model's reply split into calls and the text around them; `None` when it holds no
/// well-formed call to a known function (then it is plain content).
pub fn parse_output(
    text: &str,
    syntax: Syntax,
    tools: &Tools,
) -> Option<(Option<String>, Vec<ToolCall>)> {
    let (content, calls) = match syntax {
        // A small model may leave out the tags: a reply that is only a call's JSON is one.
        Syntax::Hermes => match parse_hermes(text)? {
            (_, calls) if calls.is_empty() => (String::new(), parse_llama(text)?),
            parsed => parsed,
        },
        Syntax::Llama3 => (String::new(), parse_llama(text)?),
    };
    let names = tools.names();
    if calls.is_empty() || !calls.iter().all(|c| names.contains(&c.name.as_str())) {
        return None;
    }
    let content = content.trim();
    Some(((!content.is_empty()).then(|| content.to_string()), calls))
}

/// [`parse_output`] for a generation that ended with `finish_reason`: a forced call cut off by
/// `max_tokens` (`"length"`: its constraint was not complete) is no call, so the reply keeps
/// `length` and its text as content.
pub fn parse_reply(
    text: &str,
    syntax: Syntax,
    tools: &Tools,
    finish_reason: &str,
) -> Option<(Option<String>, Vec<ToolCall>)> {
    if tools.forced() && finish_reason == "length" {
        return None;
    }
    parse_output(text, syntax, tools)
}

/// `<tool_call>{json}</tool_call>` blocks; the last may be unclosed (the reply ended in it).
fn parse_hermes(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + HERMES_OPEN.len()..];
        let (body, next) = match after.find(HERMES_CLOSE) {
            Some(end) => (&after[..end], &after[end + HERMES_CLOSE.len()..]),
            None => (after, ""),
        };
        calls.push(call_from_json(body.trim(), false)?);
        rest = next;
    }
    content.push_str(rest);
    Some((content, calls))
}

/// Llama 3.x (and Hermes without its tags): the reply is one JSON call (or several, separated by `;` or white space), after an
/// optional `<|python_tag|>`.
fn parse_llama(text: &str) -> Option<Vec<ToolCall>> {
    let text = text.trim();
    let mut rest = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim_start();
    if !rest.starts_with('{') {
        return None;
    }
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Box<RawValue>>();
        let raw = values.next()?.ok()?;
        calls.push(call_from_json(raw.get(), true)?);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    Some(calls)
}

/// `{"name": ..., "arguments" | "parameters": {...}}`. `strict`: the arguments must be there
/// (Llama's bare JSON; a Hermes block may leave them out for a function without any).
fn call_from_json(text: &str, strict: bool) -> Option<ToolCall> {
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        name: String,
        #[serde(borrow, default)]
        arguments: Option<&'a RawValue>,
        #[serde(borrow, default)]
        parameters: Option<&'a RawValue>,
    }
    let call: Call = serde_json::from_str(text).ok()?;
    let arguments = match call.arguments.or(call.parameters) {
        None if strict => return None,
        None => "{}".to_string(),
        Some(raw) => {
            let raw = raw.get();
            match serde_json::from_str::<Value>(raw).ok()? {
                Value::Object(_) => raw.to_string(),
                // Arguments as a JSON string holding the object (OpenAI's own wire shape).
                Value::String(inner) => match serde_json::from_str::<Value>(&inner).ok()? {
                    Value::Object(_) => inner,
                    _ => return None,
                },
                _ => return None,
            }
        }
    };
    Some(ToolCall {
        name: call.name,
        arguments,
    })
}

/// For streaming: lets through the text that cannot belong to a call and holds the rest
/// (Hermes: from `<tool_call>` on, and a tail that may grow into it; Llama 3.x: a reply that
/// starts like JSON or with `<|python_tag|>`), to be parsed at the end.
pub struct CallSplitter {
    syntax: Syntax,
    held: String,
    /// Everything from here on is held.
    holding: bool,
    /// (Llama 3.x) the reply is not a call: everything passes.
    passing: bool,
    /// (Hermes) some text went out already.
    released: bool,
}

impl CallSplitter {
    pub fn new(syntax: Syntax) -> Self {
        CallSplitter {
            syntax,
            held: String::new(),
            holding: false,
            passing: false,
            released: false,
        }
    }

    /// Adds generated text; returns the text that can be sent now.
    pub fn push(&mut self, text: &str) -> String {
        if self.passing {
            return text.to_string();
        }
        self.held.push_str(text);
        if self.holding {
            return String::new();
        }
        match self.syntax {
            Syntax::Hermes => {
                // A reply that starts as JSON may be a call without its tags: held whole.
                if !self.released {
                    let start = self.held.trim_start();
                    if start.is_empty() {
                        return String::new();
                    }
                    if start.starts_with('{') {
                        self.holding = true;
                        return String::new();
                    }
                }
                if let Some(at) = self.held.find(HERMES_OPEN) {
                    self.holding = true;
                    self.released |= at > 0;
                    return self.held.drain(..at).collect();
                }
                let keep_from = self
                    .held
                    .char_indices()
                    .map(|(i, _)| i)
                    .find(|&i| HERMES_OPEN.starts_with(&self.held[i..]))
                    .unwrap_or(self.held.len());
                self.released |= keep_from > 0;
                self.held.drain(..keep_from).collect()
            }
            Syntax::Llama3 => {
                let start = self.held.trim_start();
                if start.is_empty() || PYTHON_TAG.starts_with(start) {
                    String::new()
                } else if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                    self.holding = true;
                    String::new()
                } else {
                    self.passing = true;
                    std::mem::take(&mut self.held)
                }
            }
        }
    }

    /// The held text (to parse; sent as content if it holds no call).
    pub fn finish(self) -> String {
        self.held
    }
}

/// How a tokenizer's chat template takes tools: `None` when it does not render `tools` (then
/// lean's fallback, [`fallback_messages`], with the Hermes syntax), else the syntax its
/// instructions teach (`<tool_call>`: Hermes; Llama 3.x's `"parameters"` JSON; Hermes
/// otherwise). A probe function is rendered as `tools`: a template that writes its name takes
/// tools. Render once per tokenizer and keep the answer.
pub fn template_syntax(tokenizer: &Tokenizer) -> Option<Syntax> {
    const PROBE: &str = "lean_probe_function_7f3a";
    let mut kwargs = serde_json::Map::new();
    kwargs.insert(
        "tools".into(),
        json!([{"type": "function", "function": {"name": PROBE, "description": "probe",
            "parameters": {"type": "object", "properties": {}}}}]),
    );
    let text = tokenizer
        .apply_chat_template_full(&[FullChatMessage::new("user", "hi")], true, &kwargs)
        .ok()?;
    if !text.contains(PROBE) {
        return None;
    }
    let llama = !text.contains(HERMES_OPEN)
        && (text.contains("Environment: ipython")
            || text.contains("{\"name\": function name, \"parameters\""));
    Some(if llama {
        Syntax::Llama3
    } else {
        Syntax::Hermes
    })
}

/// A chat with tools, ready for the template: what to render and how to read the reply.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolChat {
    /// The messages to render (lean's fallback rewrites them for a template without tools).
    pub messages: Vec<FullChatMessage>,
    /// The template's variables (with `tools` for a template that takes them).
    pub kwargs: serde_json::Map<String, Value>,
    /// The syntax of the calls to parse out of the reply; `None` without tools.
    pub syntax: Option<Syntax>,
    /// For a forced call (`tool_choice` "required" or a named function): the Lark grammar of
    /// exactly one call, for `lean_constraint::ConstraintSpec::Lark`.
    pub grammar: Option<String>,
}

/// Prepares `messages` (with their calls and results) and `tools` for a template that takes
/// tools in `template` ([`template_syntax`]) or, for `None`, for lean's fallback. Every surface
/// (lean-cli, `lean-cli serve`, the wasm engine) renders a chat with tools through this.
pub fn prepare_chat(
    template: Option<Syntax>,
    messages: &[FullChatMessage],
    tools: Option<&Tools>,
    kwargs: &serde_json::Map<String, Value>,
) -> ToolChat {
    let mut kwargs = kwargs.clone();
    let messages = match template {
        Some(_) => {
            if let Some(tools) = tools {
                kwargs.insert("tools".into(), tools.definitions());
            }
            messages.to_vec()
        }
        None => fallback_messages(messages, tools),
    };
    let syntax = tools.map(|_| template.unwrap_or(Syntax::Hermes));
    let grammar = match (tools, syntax) {
        (Some(tools), Some(syntax)) if tools.forced() => Some(forced_call_grammar(tools, syntax)),
        _ => None,
    };
    ToolChat {
        messages,
        kwargs,
        syntax,
        grammar,
    }
}

/// OpenAI's `tool_calls` of one reply: `[{id, type: "function", function: {name, arguments}}]`
/// (`arguments` the JSON text the model wrote), with `index` where `indexed` (stream deltas);
/// the ids are new, `call_` and 24 letters and digits as OpenAI's.
pub fn openai_tool_calls(calls: &[ToolCall], indexed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let mut value = json!({
                "id": new_call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            });
            if indexed {
                value["index"] = json!(index);
            }
            value
        })
        .collect()
}

/// A new call id: `call_` and 24 letters and digits, unique within the process.
pub fn new_call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    #[cfg(not(target_arch = "wasm32"))]
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // (wasm32-unknown-unknown has no clock in std: the counter alone.)
    #[cfg(target_arch = "wasm32")]
    let nanos = 0x5eed_u64;
    // splitmix64 over the time and a counter: unique within the process, unlikely to repeat.
    let mut state = nanos
        ^ NEXT
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut id = String::from("call_");
    for _ in 0..24 {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        id.push(ALPHABET[(z % ALPHABET.len() as u64) as usize] as char);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tools {
        parse_tools(
            Some(&json!([
                {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "now"}},
            ])),
            None,
        )
        .unwrap()
        .unwrap()
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn hermes_calls_are_parsed_with_the_text_around_them() {
        let tools = weather();
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        assert_eq!(
            parse_output(one, Syntax::Hermes, &tools),
            Some((None, vec![call("get_weather", "{\"city\": \"Paris\"}")]))
        );
        let two = format!("Let me look.\n{one}\n<tool_call>\n{{\"name\": \"now\"}}\n</tool_call>");
        assert_eq!(
            parse_output(&two, Syntax::Hermes, &tools),
            Some((
                Some("Let me look.".into()),
                vec![
                    call("get_weather", "{\"city\": \"Paris\"}"),
                    call("now", "{}")
                ]
            ))
        );
        // Without the tags (a small model's habit): the whole reply is the call's JSON.
        assert_eq!(
            parse_output(
                " {\"name\": \"now\", \"arguments\": {}}\n",
                Syntax::Hermes,
                &tools
            ),
            Some((None, vec![call("now", "{}")]))
        );
        // Arguments as a JSON string; an unclosed last block (the reply ended there).
        let stringly = "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}";
        assert_eq!(
            parse_output(stringly, Syntax::Hermes, &tools),
            Some((None, vec![call("get_weather", "{\"city\": \"Oslo\"}")]))
        );
    }

    #[test]
    fn malformed_calls_are_plain_content() {
        let tools = weather();
        for text in [
            "",
            "The weather is fine.",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
            "<tool_call>\n{\"name\": \"unknown\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "<tool_call>\nnot json\n</tool_call>",
            "<tool_call></tool_call>",
            "<tool_call>",
            "</tool_call><tool_call>{\"name\": 3}</tool_call>",
            "<tool_call>\n{\"name\": \"now\"}\n</tool_call><tool_call>\n{\"name\": \"nope\"}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"not an object\"}\n</tool_call>",
            "<tool_call>é\u{0}</tool_call>",
        ] {
            assert_eq!(parse_output(text, Syntax::Hermes, &tools), None, "{text:?}");
        }
        for text in [
            "",
            "Sure: {\"name\": \"get_weather\"}",
            "{\"name\": \"get_weather\"}",
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"",
            "{\"name\": \"get_weather\", \"parameters\": {}} and some text",
            "{\"name\": \"other\", \"parameters\": {}}",
            "<|python_tag|>",
            "<|python_tag|>print(1)",
            "[{\"name\": \"now\", \"parameters\": {}}]",
            "{\"name\": \"now\", \"parameters\": 5}",
        ] {
            assert_eq!(parse_output(text, Syntax::Llama3, &tools), None, "{text:?}");
        }
    }

    #[test]
    fn llama_calls_are_parsed_with_or_without_the_python_tag() {
        let tools = weather();
        let bare = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let want = Some((None, vec![call("get_weather", "{\"city\": \"Paris\"}")]));
        assert_eq!(parse_output(bare, Syntax::Llama3, &tools), want);
        assert_eq!(
            parse_output(&format!("<|python_tag|>{bare}"), Syntax::Llama3, &tools),
            want
        );
        assert_eq!(
            parse_output(&format!("\n {bare}\n"), Syntax::Llama3, &tools),
            want
        );
        let two = format!("{bare}; {{\"name\": \"now\", \"arguments\": {{}}}}");
        assert_eq!(
            parse_output(&two, Syntax::Llama3, &tools).unwrap().1,
            [
                call("get_weather", "{\"city\": \"Paris\"}"),
                call("now", "{}")
            ]
        );
    }

    #[test]
    fn the_splitter_holds_calls_and_passes_text() {
        let mut hermes = CallSplitter::new(Syntax::Hermes);
        let mut sent = String::new();
        for piece in [
            "Let me ",
            "check.<tool",
            "_call>\n{\"name\"",
            ": \"now\"}\n</tool_call>",
        ] {
            sent.push_str(&hermes.push(piece));
        }
        assert_eq!(sent, "Let me check.");
        assert_eq!(
            hermes.finish(),
            "<tool_call>\n{\"name\": \"now\"}\n</tool_call>"
        );
        let mut hermes = CallSplitter::new(Syntax::Hermes);
        assert_eq!(hermes.push("\n"), "");
        assert_eq!(hermes.push("{\"name\""), "");
        assert_eq!(hermes.push("}"), "");
        assert_eq!(hermes.finish(), "\n{\"name\"}");
        let mut hermes = CallSplitter::new(Syntax::Hermes);
        assert_eq!(hermes.push("a <"), "a ");
        assert_eq!(hermes.push("b é"), "<b é");
        assert_eq!(hermes.push(" {"), " {");
        assert_eq!(hermes.finish(), "");

        let mut llama = CallSplitter::new(Syntax::Llama3);
        assert_eq!(llama.push(" "), "");
        assert_eq!(llama.push("{\"name\""), "");
        assert_eq!(llama.push(": 1}"), "");
        assert_eq!(llama.finish(), " {\"name\": 1}");
        let mut llama = CallSplitter::new(Syntax::Llama3);
        assert_eq!(llama.push("<|python"), "");
        assert_eq!(llama.push("_tag|>{"), "");
        let mut llama = CallSplitter::new(Syntax::Llama3);
        assert_eq!(llama.push("Hello"), "Hello");
        assert_eq!(llama.push(" {"), " {");
        assert_eq!(llama.finish(), "");
    }

    #[test]
    fn bad_tools_and_tool_choices_name_their_parameter() {
        let ok = json!([{"type": "function", "function": {"name": "f"}}]);
        let cases = [
            (json!({"a": 1}), None, "tools"),
            (json!([3]), None, "tools[0]"),
            (json!([{"type": "retrieval"}]), None, "tools[0].type"),
            (json!([{"type": "function"}]), None, "tools[0].function"),
            (
                json!([{"type": "function", "function": {}}]),
                None,
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                None,
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": 3}}]),
                None,
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]),
                None,
                "tools[1].function.name",
            ),
            (ok.clone(), Some(json!("sometimes")), "tool_choice"),
            (
                ok.clone(),
                Some(json!({"type": "function", "function": {"name": "g"}})),
                "tool_choice",
            ),
            (ok.clone(), Some(json!({"type": "function"})), "tool_choice"),
            (ok.clone(), Some(json!(1)), "tool_choice"),
            (json!([]), Some(json!("required")), "tool_choice"),
        ];
        for (tools, choice, param) in cases {
            let err = parse_tools(Some(&tools), choice.as_ref()).unwrap_err();
            assert_eq!(err.param, param, "{tools} {choice:?}: {}", err.message);
        }
        assert_eq!(parse_tools(Some(&ok), Some(&json!("none"))).unwrap(), None);
        assert_eq!(parse_tools(Some(&json!([])), None).unwrap(), None);
        assert_eq!(parse_tools(None, Some(&json!("auto"))).unwrap(), None);
        let named = parse_tools(
            Some(&ok),
            Some(&json!({"type": "function", "function": {"name": "f"}})),
        )
        .unwrap()
        .unwrap();
        assert_eq!(named.choice, ToolChoice::Named("f".into()));
        assert_eq!(
            named.tools[0].definition,
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}})
        );
    }

    #[test]
    fn the_fallback_describes_the_tools_in_the_system_message() {
        let tools = weather();
        let messages: Vec<FullChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "22 C", "tool_call_id": "call_1"},
        ]))
        .unwrap();
        let out = fallback_messages(&messages, Some(&tools));
        let system = out[0].content.as_deref().unwrap();
        assert!(system.starts_with("Be brief.\n\n# Tools\n"), "{system}");
        assert!(system.contains("\"name\":\"get_weather\""), "{system}");
        assert!(system.contains("<tool_call>"), "{system}");
        assert_eq!(
            out[2],
            FullChatMessage::new(
                "assistant",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"
            )
        );
        assert_eq!(
            out[3],
            FullChatMessage::new("user", "<tool_response>\n22 C\n</tool_response>")
        );
        let out = fallback_messages(&messages[1..2], Some(&tools));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].role, "system");
    }

    #[test]
    fn the_forced_grammar_writes_the_call_syntax() {
        let tools = weather();
        let grammar = forced_call_grammar(&tools, Syntax::Hermes);
        assert!(grammar.starts_with("start: call_0 | call_1\n"), "{grammar}");
        assert!(
            grammar.contains(r#"call_0: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " args_0 "}\n</tool_call>""#),
            "{grammar}"
        );
        let named = Tools {
            choice: ToolChoice::Named("now".into()),
            ..tools
        };
        let grammar = forced_call_grammar(&named, Syntax::Llama3);
        assert!(grammar.starts_with("start: call_0\n"), "{grammar}");
        assert!(
            grammar.contains(r#"call_0: "{\"name\": \"now\", \"parameters\": " args_0 "}""#),
            "{grammar}"
        );
    }
}
