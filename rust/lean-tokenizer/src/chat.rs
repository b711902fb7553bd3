//! Chat templates rendered as transformers renders them
//! (transformers/utils/chat_template_utils.py, `_cached_compile_jinja_template` and
//! `render_jinja_template`): jinja2 with `trim_blocks`, `lstrip_blocks`, no trailing newline kept,
//! loop controls, `raise_exception`, `strftime_now`, a `tojson` that is Python's `json.dumps`
//! (`ensure_ascii=False` by default), and Python string/dict methods through minijinja-contrib's
//! pycompat. Values print as Python prints them (`None`, `True`, `['a']`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use minijinja::budget::{self, Deadline, Exceeded, Limits};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};
use serde_json::Value as Json;

use crate::TokenizerError;

/// One chat message, as the `{role, content}` dicts transformers passes to templates.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat message with the fields of tool calling, in the shape transformers passes to chat
/// templates (HF's convention, which Qwen2.5's, Qwen3's and Llama 3.x's templates read):
/// - an assistant's calls: `content` may be `None` (the template's `none`) and `tool_calls` is
///   `[{"type": "function", "function": {"name", "arguments"}}]`, `arguments` a JSON object
///   (the templates write it with `tojson`), plus the call's `id` where known;
/// - a tool's result: role `"tool"`, its text in `content`, `tool_call_id` (and `name`) where
///   given.
///
/// Fields left `None` are absent from the template's message (Llama 3.x's asks
/// `'tool_calls' in message`), except `content`, which is always there.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq)]
pub struct FullChatMessage {
    pub role: String,
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Json>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl FullChatMessage {
    /// A plain `{role, content}` message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        FullChatMessage {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

impl From<ChatMessage> for FullChatMessage {
    fn from(message: ChatMessage) -> Self {
        FullChatMessage::new(message.role, message.content)
    }
}

const TEMPLATE_NAME: &str = "chat_template";
/// Chat templates come with model files from anywhere: they are untrusted code. A render may run
/// this many minijinja instructions (a real template over a long chat takes well under 1 % of it;
/// the limit is reached in about a second natively)...
pub(crate) const TEMPLATE_FUEL: u64 = 20_000_000;
/// ...and write this many bytes beyond twice what it was given (messages, tools, extra
/// variables, special tokens): a real template adds a few bytes of markup a message. The rendered
/// text is tokenized next, at about 1 µs a byte with ~300 bytes of memory a byte in `tokenizers`'
/// encoding, so a fixed cap as large as any chat could need (64 MiB once) let a 50-byte
/// recursive macro cost 10 s and 2 GiB after a fast render (found by fuzzing).
pub(crate) const TEMPLATE_OUTPUT_ALLOWANCE: usize = 1 << 20;
/// Bytes a render may create in all, as a multiple of the output cap: strings and lists its
/// operators and filters build, and what `{{ }}` writes into the output and into captures (a
/// macro's or a block's result, written again by its caller). Fuel counts instructions, not
/// bytes: one `~`, `replace` or `join` may double or square what it is given, and a macro that
/// calls itself twice doubles its result at each level (found by fuzzing: 1.7 s of copying
/// before the fuel ran out). One value may not exceed the output cap. minijinja asks before it
/// allocates (lean's patch, `rust/vendor/minijinja/src/budget.rs`).
pub(crate) const TEMPLATE_CREATED_PER_OUTPUT: usize = 8;

/// The most a render over `given` bytes of input may write.
pub(crate) fn template_max_output(given: usize) -> usize {
    TEMPLATE_OUTPUT_ALLOWANCE.saturating_add(given.saturating_mul(2))
}

/// How long a render may run: real templates take milliseconds over thousands of turns, but
/// one instruction may work in proportion to its values (`s|upper` on a 1 MB string, 100,000
/// times), which neither fuel nor the byte limits bound.
pub(crate) const TEMPLATE_TIME_LIMIT_MS: f64 = 1000.0;

/// What a render over `given` bytes may create, and until when it may run.
fn template_limits(given: usize) -> Limits {
    let max_output = template_max_output(given);
    Limits {
        value_bytes: max_output,
        total_bytes: max_output.saturating_mul(TEMPLATE_CREATED_PER_OUTPUT),
        deadline: Some(Deadline {
            now_ms: clock_ms,
            at_ms: clock_ms() + TEMPLATE_TIME_LIMIT_MS,
        }),
    }
}

/// Milliseconds on a monotonic clock (the deadline's).
#[cfg(not(target_arch = "wasm32"))]
fn clock_ms() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
        * 1e3
}

/// Milliseconds on the page's clock (`std::time::Instant` panics on wasm32-unknown-unknown).
#[cfg(target_arch = "wasm32")]
fn clock_ms() -> f64 {
    js_sys::Date::now()
}

/// `strftime_now` reads the system clock while the pinned time is this.
const CLOCK_NOT_PINNED: i64 = i64::MIN;

pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    pinned_time: Arc<AtomicI64>,
}

impl ChatTemplate {
    /// The template transformers would use: the chat_template.jinja text when given, otherwise the
    /// config's `chat_template` (a string, or the `default` entry of a `[{name, template}]` list).
    pub(crate) fn resolve(config: &Json, file: Option<&str>) -> Result<String, TokenizerError> {
        if let Some(text) = file {
            return Ok(text.to_string());
        }
        match config.get("chat_template") {
            None | Some(Json::Null) => Err(TokenizerError::NoChatTemplate(
                "neither a chat_template.jinja nor a \"chat_template\" in tokenizer_config.json"
                    .into(),
            )),
            Some(Json::String(text)) => Ok(text.clone()),
            Some(Json::Array(entries)) => {
                let mut names = Vec::new();
                for entry in entries {
                    let name = entry.get("name").and_then(Json::as_str);
                    let template = entry.get("template").and_then(Json::as_str);
                    match (name, template) {
                        (Some("default"), Some(template)) => return Ok(template.to_string()),
                        (Some(name), Some(_)) => names.push(name.to_string()),
                        _ => {
                            return Err(TokenizerError::Config(
                                "a \"chat_template\" list entry lacks a string \"name\" or \"template\"".into(),
                            ))
                        }
                    }
                }
                Err(TokenizerError::NoChatTemplate(format!(
                    "tokenizer_config.json has chat templates {names:?} but none named \"default\""
                )))
            }
            Some(_) => Err(TokenizerError::Config(
                "\"chat_template\" is neither a string nor a list".into(),
            )),
        }
    }

    pub(crate) fn compile(source: String) -> Result<ChatTemplate, TokenizerError> {
        let pinned_time = Arc::new(AtomicI64::new(CLOCK_NOT_PINNED));
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(python_methods);
        env.set_formatter(python_formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        let clock = Arc::clone(&pinned_time);
        env.add_function(
            "strftime_now",
            move |format: &str| -> Result<String, Error> {
                let now = match clock.load(Ordering::Relaxed) {
                    CLOCK_NOT_PINNED => system_time()?,
                    pinned => pinned,
                };
                Ok(strftime(format, now))
            },
        );
        // Constant folding builds values too (`'x' * 10**8`): a fold refused here is left to
        // the render, under the render's limits.
        let limits = Limits {
            deadline: None, // no instructions run
            ..template_limits(source.len())
        };
        let (added, _) =
            budget::with_limits(limits, || env.add_template_owned(TEMPLATE_NAME, source));
        added.map_err(|e| TokenizerError::Template(describe(&e)))?;
        Ok(ChatTemplate { env, pinned_time })
    }

    pub(crate) fn set_time(&self, unix_seconds: Option<i64>) {
        self.pinned_time
            .store(unix_seconds.unwrap_or(CLOCK_NOT_PINNED), Ordering::Relaxed);
    }

    /// Renders `messages` ([`ChatMessage`]s or [`FullChatMessage`]s: anything that serializes to
    /// the message dicts the template reads).
    pub(crate) fn render<M: serde::Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        special_tokens: &[(&'static str, String)],
        kwargs: &serde_json::Map<String, Json>,
    ) -> Result<String, TokenizerError> {
        let mut context: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        context.extend(
            special_tokens
                .iter()
                .map(|(name, text)| (*name, Value::from(text.as_str()))),
        );
        // Last, so that they win, as transformers' `apply_chat_template(**kwargs)`.
        context.extend(
            kwargs
                .iter()
                .map(|(name, value)| (name.as_str(), Value::from_serialize(value))),
        );
        let context: Value = context.into_iter().collect();
        let given = json_len(messages)
            + json_len(kwargs)
            + special_tokens
                .iter()
                .map(|(_, text)| text.len())
                .sum::<usize>();
        // The output cap is also the largest value (`template_limits`).
        let limits = template_limits(given);
        let max_output = limits.value_bytes;
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        let mut out = CappedOutput {
            bytes: Vec::new(),
            limit: max_output,
            overflowed: false,
        };
        let (rendered, usage) =
            budget::with_limits(limits, || template.render_captured_to(context, &mut out));
        match rendered {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|_| TokenizerError::Template("the output is not valid UTF-8".into())),
            Err(_) if out.overflowed => Err(TokenizerError::Template(format!(
                "the template wrote more than {} (1 MiB beyond twice the {} it was given); refused (a template that explodes?)",
                bytes(max_output),
                bytes(given)
            ))),
            Err(_) if usage.exceeded.is_some() => Err(TokenizerError::Template(match usage.exceeded {
                Some(Exceeded::Value(size)) => format!(
                    "the template made a value of {} or more, over its limit of {} (1 MiB beyond twice the {} it was given); stopped (a template that explodes?)",
                    bytes(size),
                    bytes(limits.value_bytes),
                    bytes(given)
                ),
                Some(Exceeded::Time) => format!(
                    "the template ran longer than {TEMPLATE_TIME_LIMIT_MS} ms; stopped (work in proportion to long values, in a loop?)"
                ),
                _ => format!(
                    "the template created more than {} in all (strings and lists it built, and what macros and blocks return to their callers); stopped (a template that explodes?)",
                    bytes(limits.total_bytes)
                ),
            })),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(TokenizerError::Template(format!(
                "the template ran more than {TEMPLATE_FUEL} instructions; stopped (a loop that does not end?)"
            ))),
            Err(e) => Err(TokenizerError::Template(describe(&e))),
        }
    }
}

/// The length of `value`'s JSON, counted as it is written (no copy of a long chat is kept).
fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(0, |()| count.0)
}

/// `n` bytes for a person: "2.5 MiB", "300 KiB", "12 bytes".
fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}

/// The rendered text, refused past `limit` bytes.
struct CappedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("template output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The error with its causes (a filter's failure is the cause of the render error).
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

#[cfg(not(target_arch = "wasm32"))]
fn system_time() -> Result<i64, Error> {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("strftime_now: system clock: {e}"),
            )
        })?;
    Ok(since_epoch.as_secs() as i64)
}

#[cfg(target_arch = "wasm32")]
fn system_time() -> Result<i64, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        "strftime_now: wasm32 has no clock; call Tokenizer::set_template_time first",
    ))
}

/// Python's str, list and dict methods (minijinja-contrib's pycompat), with the two that can
/// build a string far larger than their inputs charged first: `str.replace` and `str.join`.
fn python_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(text) = value.as_str() {
        match (method, args) {
            ("replace", [from, to, ..]) => {
                if let (Some(from), Some(to)) = (from.as_str(), to.as_str()) {
                    budget::charge_replace(text, from, to)?;
                }
            }
            ("join", [items]) => return Ok(Value::from(budget::join(items.try_iter()?, text)?)),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Prints values as jinja2 does (Python's `str`): strings raw, `None`, `True`/`False`, Python
/// reprs for lists and dicts, Python float reprs. Autoescaping stays off, as in transformers.
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => {
            let text = value.as_str().unwrap_or_default();
            budget::charge_total(text.len())?;
            out.write_str(text).map_err(Error::from)
        }
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            let mut text = String::new();
            python_str(&mut text, value)?;
            budget::charge_total(text.len())?;
            out.write_str(&text).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `str(value)`: like `repr` except that a top-level string is itself.
fn python_str(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => python_repr(out, value)?,
    }
    Ok(())
}

fn python_repr(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, "inf", "nan")?,
        ValueKind::String => python_repr_str(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(out, &item)?;
                budget::check_value(out.len())?; // one long string, many times
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(out, &key)?;
                out.push_str(": ");
                python_repr(out, &value.get_item(&key)?)?;
                budget::check_value(out.len())?;
            }
            out.push('}');
        }
        _ => out.push_str(&budget::to_string(value)?),
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`.
fn python_repr_str(out: &mut String, text: &str) {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An integer as is, a float as Python's `repr` writes it (`1.0`, `1e+16`, `1.5e-07`).
fn write_number(out: &mut String, value: &Value, infinity: &str, nan: &str) -> Result<(), Error> {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let x = f64::try_from(value.clone())?;
    if x.is_nan() {
        out.push_str(nan);
    } else if x.is_infinite() {
        if x < 0.0 {
            out.push('-');
        }
        out.push_str(infinity);
    } else {
        python_float_repr(out, x);
    }
    Ok(())
}

/// Python's float repr: the shortest round-tripping digits, positional for exponents -4..16,
/// otherwise scientific with a sign and at least two exponent digits.
fn python_float_repr(out: &mut String, x: f64) {
    // Rust's `{:e}` gives the same shortest round-trip digits: "d.ddde-7".
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa
        .strip_prefix('-')
        .map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    out.push_str(sign);
    if (-4..16).contains(&exponent) {
        if exponent < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
            out.push_str(&digits);
        } else {
            let point = exponent as usize + 1;
            if digits.len() <= point {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', point - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, options as keyword arguments.
fn tojson(value: &Value, options: Kwargs) -> Result<String, Error> {
    let ensure_ascii = options
        .get::<Option<bool>>("ensure_ascii")?
        .unwrap_or(false);
    let indent = match options.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 1024) as usize)),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or a string",
                ))
            }
        },
    };
    let (item_separator, key_separator) = match options.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => (
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        // json.dumps: ", " without indent, "," with it (lines end there anyway).
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let sort_keys = options.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let dumper = JsonDumper {
        ensure_ascii,
        indent,
        item_separator,
        key_separator,
        sort_keys,
    };
    let mut out = String::new();
    dumper.dump(&mut out, value, 0)?;
    Ok(out)
}

struct JsonDumper {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

impl JsonDumper {
    fn dump(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value, "Infinity", "NaN")?,
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, '[', ']', &items, depth, |out, item| {
                    self.dump(out, item, depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((self.key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, '{', '}', &entries, depth, |out, (key, item)| {
                    self.string(out, key);
                    out.push_str(&self.key_separator);
                    self.dump(out, item, depth + 1)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: object of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    fn container<T>(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[T],
        depth: usize,
        mut write_item: impl FnMut(&mut String, &T) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_separator);
            }
            self.newline(out, depth + 1)?;
            write_item(out, item)?;
            budget::check_value(out.len())?; // one long string, many times
        }
        self.newline(out, depth)?;
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) -> Result<(), Error> {
        if let Some(indent) = &self.indent {
            budget::check_value(out.len() + 1 + depth.saturating_mul(indent.len()))?;
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
        Ok(())
    }

    /// json.dumps turns str, int, float, bool and None keys into strings.
    fn key(&self, key: &Value) -> Result<String, Error> {
        match key.kind() {
            ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
            ValueKind::None => Ok("null".into()),
            ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
            ValueKind::Number => {
                let mut text = String::new();
                write_number(&mut text, key, "Infinity", "NaN")?;
                Ok(text)
            }
            kind => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            )),
        }
    }

    fn string(&self, out: &mut String, text: &str) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !(' '..='~').contains(&c) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A subset of C's strftime for `strftime_now`, in UTC: %a %A %b %B %d %e %H %I %j %m %M %p %S
/// %y %Y %Z %z (empty, as for Python's naive datetime.now()) %%, a `-` flag drops zero padding (glibc's `%-d`); other directives stay as written.
fn strftime(format: &str, unix_seconds: i64) -> String {
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix_seconds.div_euclid(86_400);
    let seconds_of_day = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (
        seconds_of_day / 3600,
        seconds_of_day / 60 % 60,
        seconds_of_day % 60,
    );
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let number = |out: &mut String, n: i64, width: usize| {
            let _ = if unpadded {
                write!(out, "{n}")
            } else {
                write!(out, "{n:0width$}")
            };
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('d') => number(&mut out, day, 2),
            Some('e') => {
                let _ = if unpadded {
                    write!(out, "{day}")
                } else {
                    write!(out, "{day:2}")
                };
            }
            Some('H') => number(&mut out, hour, 2),
            Some('I') => number(&mut out, hour12, 2),
            Some('j') => number(&mut out, day_of_year, 3),
            Some('m') => number(&mut out, month, 2),
            Some('M') => number(&mut out, minute, 2),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('S') => number(&mut out, second, 2),
            Some('y') => number(&mut out, year.rem_euclid(100), 2),
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            // datetime.now() is naive: no zone name or offset.
            Some('Z') | Some('z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
            }
        }
    }
    out
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // March = 0
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_index = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, context: Value) -> Result<String, TokenizerError> {
        let chat = ChatTemplate::compile(source.to_string())?;
        chat.set_time(Some(1_722_470_400 + 13 * 3600 + 5 * 60 + 9)); // 2024-08-01 13:05:09 UTC
        let template = chat
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        template
            .render(context)
            .map_err(|e| TokenizerError::Template(describe(&e)))
    }

    /// Renders `source` over `messages` through the limits real chats run under.
    fn render_chat(source: &str, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        let chat = ChatTemplate::compile(source.to_string())?;
        chat.render(
            messages,
            true,
            &[("eos_token", "</s>".into())],
            &Default::default(),
        )
    }

    #[test]
    fn extra_variables_reach_the_template_and_win_over_special_tokens() {
        // Qwen3's switch, as its template writes it.
        let qwen3 = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
            {% if add_generation_prompt %}<|im_start|>assistant\n\
            {% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}{{ eos_token }}";
        let chat = ChatTemplate::compile(qwen3.to_string()).unwrap();
        let hi = [ChatMessage::new("user", "hi")];
        let specials = [("eos_token", "</s>".to_string())];
        let render = |kwargs: serde_json::Value| {
            let serde_json::Value::Object(kwargs) = kwargs else {
                unreachable!()
            };
            chat.render(&hi, true, &specials, &kwargs).unwrap()
        };
        let thinking = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n</s>";
        assert_eq!(render(serde_json::json!({})), thinking);
        assert_eq!(
            render(serde_json::json!({"enable_thinking": true})),
            thinking
        );
        assert_eq!(
            render(serde_json::json!({"enable_thinking": false, "eos_token": "<eos>"})),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<eos>"
        );

        // Llama 3.x prints today's date unless `date_string` is given.
        let llama = include_str!("../../../scripts/llama-3.2-chat-template.jinja");
        let chat = ChatTemplate::compile(llama.to_string()).unwrap();
        chat.set_time(Some(1_722_470_400)); // 2024-08-01
        let kwargs = serde_json::json!({"date_string": "26 Jul 2024"});
        let serde_json::Value::Object(kwargs) = kwargs else {
            unreachable!()
        };
        let dated = chat.render(&hi, true, &[], &kwargs).unwrap();
        assert!(dated.contains("Today Date: 26 Jul 2024"), "{dated}");
        let today = chat.render(&hi, true, &[], &Default::default()).unwrap();
        assert!(today.contains("Today Date: 01 Aug 2024"), "{today}");
    }

    #[test]
    fn tool_calls_and_tool_results_reach_the_templates_as_transformers_passes_them() {
        let messages: Vec<FullChatMessage> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "22 C", "tool_call_id": "call_1"},
        ]))
        .unwrap();
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("tools".into(), tools);

        // Qwen2.5's template (its message loop, as in the GGUF's tokenizer.chat_template).
        let qwen = r#"{%- if tools %}{{- '<tools>' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- '</tools>\n' }}{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- endif %}
{%- endfor %}"#;
        let chat = ChatTemplate::compile(qwen.to_string()).unwrap();
        let text = chat.render(&messages, false, &[], &kwargs).unwrap();
        assert!(
            text.starts_with(r#"<tools>{"type": "function", "function": {"name": "get_weather""#),
            "{text}"
        );
        assert!(
            text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"),
            "{text}"
        );
        assert!(
            text.ends_with("<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>\n"),
            "{text}"
        );

        // Llama 3.2's: `'tool_calls' in message` must be false for plain messages.
        let llama = include_str!("../../../scripts/llama-3.2-chat-template.jinja");
        let chat = ChatTemplate::compile(llama.to_string()).unwrap();
        chat.set_time(Some(1_722_470_400));
        let text = chat.render(&messages, true, &[], &kwargs).unwrap();
        assert!(text.contains("Environment: ipython"), "{text}");
        assert!(
            text.contains("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"),
            "{text}"
        );
        assert!(
            text.contains("<|start_header_id|>ipython<|end_header_id|>\n\n\"22 C\"<|eot_id|>"),
            "{text}"
        );
        // Plain messages render as before.
        let plain = [ChatMessage::new("user", "hi")];
        let full: Vec<FullChatMessage> = plain.iter().cloned().map(Into::into).collect();
        assert_eq!(
            chat.render(&plain, true, &[], &Default::default()).unwrap(),
            chat.render(&full, true, &[], &Default::default()).unwrap()
        );
    }

    #[test]
    fn untrusted_templates_are_stopped_with_a_clear_error() {
        let hi = [ChatMessage::new("user", "hi")];
        let cases = [
            // 10^10 iterations: stopped by fuel.
            (
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                "instructions",
            ),
            // 10 GB of output: stopped at the output cap.
            (
                "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
                "MiB",
            ),
            // Unbounded recursion: minijinja's depth limit.
            (
                "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                "recursion",
            ),
            // A macro doubling its result at each level (2^40 KB): stopped by the bytes its
            // results carry up, long before fuel (found by fuzzing: 1.7 s of copying then).
            (
                "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}{{ 'x' * 1000 }}{% endif %}{% endmacro %}{{ f(40) }}",
                "macros and blocks return",
            ),
            // A macro whose calls branch, each writing 400 bytes of raw text (12 MB of output
            // from 50 bytes of input; found by fuzzing: fast to render, then 10 s and 2 GiB to
            // tokenize): stopped by the bytes its results carry up, bounded by the input's size.
            (
                &*format!("{{% macro f(n) %}}{{% if n > 5 %}}{{{{ f(n - 7) }}}}{{{{ f(n - 1) }}}}{}{{% endif %}}{{% endmacro %}}{{{{ f(51) }}}}", "raw text ".repeat(44)),
                "created more than 8.0 MiB in all",
            ),
            // The same text written at the top level: refused at the output cap.
            (
                &*format!("{{% for i in range(3000) %}}{}{{% endfor %}}", "raw text ".repeat(44)),
                "wrote more than 1.0 MiB (1 MiB beyond twice the",
            ),
            ("{{ 'x' * 1000000000 }}", "too large"),
            ("{{ range(1000000000000)|length }}", "too many"),
        ];
        // Values that grow past the render's limits, each from a few bytes: before minijinja
        // asked first (lean's patch), each aborted the process on a failed allocation or ran
        // for minutes. A value over the output cap is refused before it is built.
        const VALUE: &str = "the template made a value of";
        const TOTAL: &str = "created more than 8.0 MiB in all";
        const TIME: &str = "ran longer than 1000 ms";
        const NESTED: &str =
            "{% set a = ['x' * 100000] * 10 %}{% set b = [a] * 10 %}{% set c = [b] * 10 %}";
        let doubling = |step: &str| {
            format!("{{% set ns = namespace(s='x') %}}{{% for i in range(60) %}}{{% set ns.s = {step} %}}{{% endfor %}}{{{{ ns.s|length }}}}")
        };
        let growing: Vec<(String, &str)> = vec![
            (doubling("ns.s ~ ns.s"), VALUE),
            (doubling("ns.s + ns.s"), VALUE),
            (doubling("[ns.s, ns.s]|join"), VALUE),
            (doubling("ns.s|replace('x', 'xx')"), VALUE),
            (doubling("ns.s.replace('x', 'xx')"), VALUE),
            (doubling("'%s%s'|format(ns.s, ns.s)"), VALUE),
            (doubling("'{}{}'.format(ns.s, ns.s)"), VALUE),
            (doubling("''.join([ns.s, ns.s])"), VALUE),
            (doubling("(ns.s ~ ns.s)|upper"), VALUE),
            ("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|last }}".into(), VALUE),
            ("{{ ('x' * 1000)|replace('x', 'x' * 10000) }}".into(), VALUE),
            ("{{ 'a\nb\nc'|indent(10000000000) }}".into(), VALUE),
            ("{{ ([1] * 1000000000000)|list|length }}".into(), VALUE),
            ("{{ ([1] * 1000000000000)|sort|first }}".into(), VALUE),
            ("{{ ([1] * 1000000000)|join|length }}".into(), VALUE),
            ("{{ ((['x'] * 1000000000) ~ '')|length }}".into(), VALUE),
            ("{{ (messages * 100000000)|tojson|length }}".into(), VALUE),
            ("{{ [1]|slice(1000000000000) }}".into(), VALUE),
            ("{{ [1]|batch(1000000000000, 'x') }}".into(), VALUE),
            ("{{ '%999999999999s'|format('x') }}".into(), VALUE),
            ("{{ '{:>999999999999}'.format('x') }}".into(), VALUE),
            ("{{ '%.999999999f'|format(1.5) }}".into(), VALUE),
            ("{{ messages|tojson(indent='x' * 1000000) }}".into(), VALUE),
            // A list of lists of one 100 KB string: 100 MB as text, however it is written.
            (format!("{NESTED}{{{{ c }}}}"), "wrote more than 1.0 MiB"), // streamed: the output cap
            (format!("{NESTED}{{{{ c|string|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ c|tojson|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ (c ~ '')|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ c|join|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ c|pprint|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ c|e|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ '%s'|format(c)|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ '{{}}'.format(c)|length }}}}"), VALUE),
            (format!("{NESTED}{{{{ ''.join(c)|length }}}}"), VALUE),
            // Many values each under the cap: stopped by the total.
            ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [('x' * 500000) ~ i] %}{% endfor %}".into(), TOTAL),
            ("{% set s = 'x' * 500000 %}{% for i in range(100000) %}{% set t = s|replace('x', 'y') ~ i %}{% endfor %}".into(), TOTAL),
            // Work in proportion to a 1 MB value, 100,000 times: stopped by the deadline.
            ("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set t = s|upper %}{% endfor %}".into(), TIME),
            ("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set t = s|list %}{% endfor %}".into(), TIME),
            ("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}".into(), TIME),
            ("{% set l = range(100000)|list %}{% for i in range(100000) %}{% set t = l|sort %}{% endfor %}".into(), TIME),
            // Folded at compile time, then refused by the render.
            ("{{ ('x' * 99999999)|length }}".into(), VALUE),
        ];
        let growing: Vec<(&str, &str)> = growing.iter().map(|(s, w)| (s.as_str(), *w)).collect();
        let cases: Vec<(&str, &str)> = cases.into_iter().chain(growing).collect();
        for (source, want) in cases {
            let start = std::time::Instant::now();
            let err = render_chat(source, &hi).unwrap_err().to_string();
            assert!(err.contains(want), "{source}: {err}");
            // (A second at most on a quiet machine; generous here for loaded CI runners.)
            assert!(
                start.elapsed().as_secs() < 20,
                "{source}: {:?}",
                start.elapsed()
            );
        }
    }

    #[test]
    fn real_templates_over_long_chats_stay_far_from_the_limits() {
        // ChatML with a system default, as SmolLM2's and Qwen's templates: 2,000 turns.
        let source = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let messages: Vec<ChatMessage> = (0..2000)
            .map(|i| {
                ChatMessage::new(
                    if i % 2 == 0 { "user" } else { "assistant" },
                    format!("turn {i} ").repeat(20),
                )
            })
            .collect();
        let text = render_chat(source, &messages).unwrap();
        assert!(text.len() > 2000 * 100);
        let chat = ChatTemplate::compile(source.to_string()).unwrap();
        let template = chat.env.get_template(TEMPLATE_NAME).unwrap();
        let context = minijinja::context! { messages => Value::from_serialize(&messages), add_generation_prompt => true };
        let limits = template_limits(json_len(&messages));
        let (captured, usage) = budget::with_limits(limits, || {
            template.render_captured_to(context, std::io::sink())
        });
        let (used, _) = captured.unwrap().state().fuel_levels().unwrap();
        assert!(
            used < TEMPLATE_FUEL / 20,
            "2,000 turns used {used} of {TEMPLATE_FUEL} fuel"
        );
        // Its `+` builds each turn's text, then writes it: about twice the output.
        assert!(
            usage.charged < limits.total_bytes / 3,
            "2,000 turns created {} of {}",
            usage.charged,
            limits.total_bytes
        );
    }

    fn data(json: &str) -> Value {
        Value::from_serialize(serde_json::from_str::<Json>(json).unwrap())
    }

    // Expected strings below are what transformers' jinja environment renders (checked with
    // ~/.cache/lean/venv's transformers 5.24 / jinja2).
    #[test]
    fn tojson_matches_python_json_dumps() {
        // A template literal keeps the key order (serde_json's maps would sort it).
        let source = r#"{% set x = {"name": "f", "z": [1, 2.5, 1e16, 1e-7, true, none], "s": s, "e": {}, "l": []} %}"#;
        let context = Value::from_iter([("s", Value::from("é\"\\\n\u{1}😀<&>"))]);
        assert_eq!(
            render(&format!("{source}{{{{ x | tojson }}}}"), context.clone()).unwrap(),
            r#"{"name": "f", "z": [1, 2.5, 1e+16, 1e-07, true, null], "s": "é\"\\\n\u0001😀<&>", "e": {}, "l": []}"#
        );
        assert_eq!(
            render(
                &format!("{source}{{{{ x.z | tojson(indent=2) }}}}"),
                context.clone()
            )
            .unwrap(),
            "[\n  1,\n  2.5,\n  1e+16,\n  1e-07,\n  true,\n  null\n]"
        );
        assert_eq!(
            render(
                &format!("{source}{{{{ x | tojson(ensure_ascii=True, sort_keys=True, separators=(',', ':')) }}}}"),
                context
            )
            .unwrap(),
            r#"{"e":{},"l":[],"name":"f","s":"\u00e9\"\\\n\u0001\ud83d\ude00<&>","z":[1,2.5,1e+16,1e-07,true,null]}"#
        );
    }

    #[test]
    fn values_print_like_python() {
        let context =
            Value::from_iter([("x", data(r#"{"a": [1, "it's", null, false], "b": 0.1}"#))]);
        assert_eq!(
            render(
                "{{ none }} {{ true }} {{ x.a }} {{ x }} {{ x.b * 3 }} {{ 2.0 }}",
                context
            )
            .unwrap(),
            r#"None True [1, "it's", None, False] {'a': [1, "it's", None, False], 'b': 0.1} 0.30000000000000004 2.0"#
        );
    }

    #[test]
    fn whitespace_control_and_loop_controls_match_jinja2() {
        let source = "{% for i in range(5) %}\n  {% if i == 3 %}{% break %}{% endif %}\n  {{ i }}\n{% endfor %}\n";
        assert_eq!(render(source, Value::from(())).unwrap(), "  0\n  1\n  2\n");
    }

    #[test]
    fn python_string_methods_work() {
        let context = Value::from_iter([("s", Value::from("  Hello World  "))]);
        assert_eq!(
            render(
                "{{ s.strip().lower() }}|{{ s.split() }}|{{ s.strip().startswith('Hel') }}",
                context
            )
            .unwrap(),
            "hello world|['Hello', 'World']|True"
        );
    }

    #[test]
    fn raise_exception_reports_its_message() {
        let err = render(
            "{{ raise_exception('Conversation roles must alternate') }}",
            Value::from(()),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("Conversation roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn strftime_now_formats_the_pinned_time() {
        assert_eq!(
            render(
                "{{ strftime_now('%d %b %Y|%A %B %-d %e|%H:%M:%S %I%p|%j %y %Z %z %% %Q') }}",
                Value::from(())
            )
            .unwrap(),
            "01 Aug 2024|Thursday August 1  1|13:05:09 01PM|214 24   % %Q"
        );
    }

    #[test]
    fn civil_dates_round_trip() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
