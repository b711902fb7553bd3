//! Tool calls on `lean-cli serve` end to end, over real sockets with the real models: a forced
//! call (`tool_choice` naming a function, or "required") on every test model's template
//! (Qwen2.5's and Qwen3's Hermes `<tool_call>`, Llama 3.2's JSON, and SmolLM2's template without
//! tools through lean's fallback) returns an OpenAI `tool_calls` entry whose arguments validate
//! against the function's schema; a conversation with a call and its result renders as the
//! template writes it and generates; streamed calls come as `delta.tool_calls`; bad tools are
//! 400s.
mod common;

use common::models;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SMOLLM2: &str = "smollm2-135m-instruct-q4_0.gguf";
const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_0.gguf";
const QWEN3: &str = "qwen3-0.6b-random-q4_0.gguf";
const LLAMA32: &str = "llama-3.2-1b-random-q4_0.gguf";

/// A running `lean-cli serve` on `model` (its GGUF's own tokenizer and template), killed when
/// dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(model: &str) -> Option<Server> {
        let path = models()?.join(model);
        if !path.is_file() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} missing",
                path.display()
            );
            eprintln!("skipping: {} missing", path.display());
            return None;
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
            .args(["serve", "--port", "0", "--threads", "2", "--ctx", "1024"])
            .args(["--tokenizer", "gguf", "--model"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        let addr = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                panic!("lean-cli serve exited before listening: {seen}");
            }
            seen.push_str(&line);
            if let Some(addr) = line.trim().strip_prefix("lean: listening on http://") {
                break addr.to_string();
            }
        };
        std::thread::spawn(move || for _ in stderr.lines() {});
        Some(Server { child, addr })
    }

    /// POSTs to /v1/chat/completions; the status and the body (the raw body for a stream).
    fn chat(&self, body: &Value) -> (u16, String) {
        let body = body.to_string();
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        write!(
            stream,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let mut chunked = false;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size).unwrap();
                let size = usize::from_str_radix(size.trim(), 16).unwrap();
                let mut chunk = vec![0; size + 2];
                reader.read_exact(&mut chunk).unwrap();
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            reader.read_to_end(&mut body).unwrap();
        }
        (status, String::from_utf8(body).unwrap())
    }

    fn chat_json(&self, body: &Value) -> (u16, Value) {
        let (status, text) = self.chat(body);
        let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        (status, value)
    }

    /// A streamed chat: every chunk's JSON up to `[DONE]`.
    fn chat_stream(&self, body: &Value) -> Vec<Value> {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let (status, text) = self.chat(&body);
        assert_eq!(status, 200, "{text}");
        let data: Vec<&str> = text
            .split("\n\n")
            .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": false,
    })
}

fn time_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"timezone": {"type": "string", "maxLength": 16}},
        "required": ["timezone"],
        "additionalProperties": false,
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Get the current weather in a city", "parameters": weather_schema()}},
        {"type": "function", "function": {"name": "get_time",
            "description": "Get the current time in a timezone", "parameters": time_schema()}},
    ])
}

fn ask_weather() -> Value {
    json!([{"role": "user", "content": "What is the weather like in Paris today?"}])
}

/// The reply's one call: its name and its arguments, checked against the schema of that name.
fn assert_one_valid_call(reply: &Value) -> (String, Value) {
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let message = &choice["message"];
    assert_eq!(message["role"], "assistant");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{reply}");
    let call = &calls[0];
    assert_eq!(call["type"], "function");
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {reply}"));
    let schema = match name.as_str() {
        "get_weather" => weather_schema(),
        "get_time" => time_schema(),
        other => panic!("unknown function {other}"),
    };
    assert!(
        jsonschema::is_valid(&schema, &arguments),
        "{arguments} does not follow {schema}"
    );
    (name, arguments)
}

#[test]
fn a_named_tool_choice_forces_a_valid_call_on_every_model() {
    for model in [QWEN25, QWEN3, LLAMA32, SMOLLM2] {
        let Some(server) = Server::start(model) else {
            return;
        };
        let request = json!({
            "messages": ask_weather(), "tools": tools(), "temperature": 0, "max_tokens": 120,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        });
        let (status, reply) = server.chat_json(&request);
        assert_eq!(status, 200, "{model}: {reply}");
        let (name, _) = assert_one_valid_call(&reply);
        assert_eq!(name, "get_weather", "{model}");
        assert!(
            reply["choices"][0]["message"]["content"].is_null(),
            "{model}: {reply}"
        );

        // "required": a call to either function.
        let mut required = request.clone();
        required["tool_choice"] = json!("required");
        let (status, reply) = server.chat_json(&required);
        assert_eq!(status, 200, "{model}: {reply}");
        assert_one_valid_call(&reply);
    }
}

#[test]
fn a_streamed_call_comes_as_a_tool_calls_delta() {
    let Some(server) = Server::start(QWEN25) else {
        return;
    };
    let request = json!({
        "messages": ask_weather(), "tools": tools(), "temperature": 0, "max_tokens": 120,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    });
    let (_, whole) = server.chat_json(&request);
    let (_, whole_arguments) = assert_one_valid_call(&whole);
    let mut with_usage = request.clone();
    with_usage["stream_options"] = json!({"include_usage": true});
    let chunks = server.chat_stream(&with_usage);
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["delta"])
        .collect();
    let text: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(text, "", "{chunks:?}");
    let calls: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, whole_arguments);
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("tool_calls")]);
    let usage = &chunks.last().unwrap()["usage"];
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(usage[count], whole["usage"][count], "{count}");
    }

    // "auto": whatever the model writes, streamed and whole agree (greedy).
    let mut auto = request.clone();
    auto["tool_choice"] = json!("auto");
    let (status, whole) = server.chat_json(&auto);
    assert_eq!(status, 200, "{whole}");
    let chunks = server.chat_stream(&auto);
    let streamed_text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        streamed_text,
        message["content"].as_str().unwrap_or_default(),
        "{whole}"
    );
    let streamed_calls = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .count();
    let whole_calls = message["tool_calls"].as_array().map_or(0, Vec::len);
    assert_eq!(streamed_calls, whole_calls, "{whole}");
    if whole_calls > 0 {
        assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
    }
}

/// The conversation after a call: the assistant's call (content null, OpenAI's arguments
/// string) and the tool's result.
fn round_trip_messages() -> Value {
    json!([
        {"role": "user", "content": "What is the weather like in Paris today?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "22 degrees and sunny"},
    ])
}

#[test]
fn a_tool_result_renders_as_the_template_writes_it_and_generates() {
    let Some(dir) = models() else {
        return;
    };
    for model in [QWEN25, LLAMA32, SMOLLM2] {
        let Some(server) = Server::start(model) else {
            return;
        };
        let request = json!({"messages": round_trip_messages(), "tools": tools(),
                             "temperature": 0, "max_tokens": 24});
        let (status, reply) = server.chat_json(&request);
        assert_eq!(status, 200, "{model}: {reply}");
        let prompt_tokens = reply["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
        assert!(reply["usage"]["completion_tokens"].as_u64().unwrap() > 0);

        // The same conversation rendered here: the prompt holds the call and its result.
        let bytes = std::fs::read(dir.join(model)).unwrap();
        let gguf = lean::gguf::Gguf::parse(&bytes).unwrap();
        let tokenizer = lean::Tokenizer::from_gguf(&gguf, None, None).unwrap();
        let messages: Vec<lean::tokenizer::FullChatMessage> =
            serde_json::from_value(json!([
                {"role": "user", "content": "What is the weather like in Paris today?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "22 degrees and sunny"},
            ]))
            .unwrap();
        let mut kwargs = serde_json::Map::new();
        let (text, ids) = if model == SMOLLM2 {
            // No tools in this template: lean's fallback (tools in a system message, the call
            // and the result as Hermes text).
            let fallback = json!([
                {"role": "system", "content": null},
                {"role": "user", "content": "What is the weather like in Paris today?"},
                {"role": "assistant", "content": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"celsius\"}}\n</tool_call>"},
                {"role": "user", "content": "<tool_response>\n22 degrees and sunny\n</tool_response>"},
            ]);
            let mut fallback: Vec<lean::tokenizer::FullChatMessage> =
                serde_json::from_value(fallback).unwrap();
            let mut system = String::from("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>");
            for tool in tools().as_array().unwrap() {
                system.push('\n');
                system.push_str(&tool.to_string());
            }
            system.push_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
            fallback[0].content = Some(system);
            let text = tokenizer
                .apply_chat_template_full(&fallback, true, &kwargs)
                .unwrap();
            let ids = tokenizer
                .encode_chat_full(&fallback, true, &kwargs)
                .unwrap();
            (text, ids)
        } else {
            kwargs.insert("tools".into(), tools());
            let text = tokenizer
                .apply_chat_template_full(&messages, true, &kwargs)
                .unwrap();
            let ids = tokenizer
                .encode_chat_full(&messages, true, &kwargs)
                .unwrap();
            (text, ids)
        };
        assert_eq!(prompt_tokens, ids.len(), "{model}: {text}");
        let result = tokenizer.encode("22 degrees and sunny", false).unwrap();
        assert!(
            ids.windows(result.len()).any(|w| w == result.as_slice())
                || text.contains("22 degrees and sunny"),
            "{model}: {text}"
        );
        assert!(text.contains("22 degrees and sunny"), "{model}: {text}");
        assert!(text.contains("get_weather"), "{model}: {text}");
        match model {
            QWEN25 => {
                assert!(text.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>"), "{text}");
                assert!(
                    text.contains("<tool_response>\n22 degrees and sunny\n</tool_response>"),
                    "{text}"
                );
            }
            LLAMA32 => {
                assert!(text.contains("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}<|eot_id|>"), "{text}");
                assert!(
                    text.contains("<|start_header_id|>ipython<|end_header_id|>"),
                    "{text}"
                );
            }
            _ => assert!(text.contains("<tool_response>"), "{text}"),
        }
    }
}

#[test]
fn bad_tools_and_tool_choices_are_400s_naming_the_problem() {
    let Some(server) = Server::start(QWEN25) else {
        return;
    };
    let user = ask_weather();
    let cases = [
        (
            json!({"messages": user, "tools": {"name": "f"}}),
            "tools",
            "array",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function", "function": {"description": "x"}}]}),
            "tools[0].function.name",
            "name",
        ),
        (
            json!({"messages": user, "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}),
            "tool_choice",
            "get_stock",
        ),
        (
            json!({"messages": user, "tools": tools(), "tool_choice": "always"}),
            "tool_choice",
            "always",
        ),
        (
            json!({"messages": user, "tools": [{"type": "code_interpreter"}]}),
            "tools[0].type",
            "function",
        ),
        (
            json!({"messages": user, "tool_choice": "required"}),
            "tool_choice",
            "tools",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strng"}}}],
                "tool_choice": "required"}),
            "tools",
            "strng",
        ),
        (
            json!({"messages": user, "tools": tools(), "tool_choice": "required", "ignore_eos": true}),
            "ignore_eos",
            "ignore_eos",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
            "JSON",
        ),
    ];
    for (body, param, what) in cases {
        let (status, reply) = server.chat_json(&body);
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["param"], param, "{body}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{body}: {message}");
    }
    // A forced call that cannot finish within max_tokens: `length`, no call, the text as content
    // (whole and streamed).
    let cut = json!({"messages": user, "tools": tools(), "tool_choice": "required",
        "temperature": 0, "max_tokens": 5});
    let (status, reply) = server.chat_json(&cut);
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{reply}");
    assert!(choice["message"].get("tool_calls").is_none(), "{reply}");
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("<tool_call>"), "{reply}");
    let chunks = server.chat_stream(&cut);
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("length")]);
    assert!(chunks
        .iter()
        .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));

    // tool_choice "none": the tools are ignored, the reply is text.
    let (status, reply) = server.chat_json(&json!({"messages": user, "tools": tools(),
        "tool_choice": "none", "temperature": 0, "max_tokens": 4}));
    assert_eq!(status, 200, "{reply}");
    assert!(
        reply["choices"][0]["message"].get("tool_calls").is_none(),
        "{reply}"
    );
}
