//! `lean-cli serve` end to end: the real binary on a free port, spoken to over real sockets
//! (a small HTTP/1.1 client on std::net, so that a test can hang up mid-stream). Greedy replies
//! equal `lean-cli --json` for the same conversation, streamed or not; the next turn of a
//! conversation reuses the slot's cache; bad requests get OpenAI-style 4xx errors and the server
//! goes on; a client that hangs up frees its slot; an overflowing queue gets 503.
mod common;

use common::models;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MODEL: &str = "smollm2-135m-instruct-q4_0.gguf";

fn model_path() -> Option<String> {
    Some(models()?.join(MODEL).to_str().unwrap().to_string())
}

/// A running `lean-cli serve`, killed when dropped; a [`Client`] of it.
struct Server {
    child: Child,
    client: Client,
}

impl std::ops::Deref for Server {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

#[derive(Clone)]
struct Client {
    addr: String,
}

impl Server {
    fn start(extra: &[&str]) -> Option<Server> {
        let model = model_path()?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
            .args(["serve", "--model", &model, "--port", "0", "--threads", "2"])
            .args(extra)
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
        // Keep draining stderr so that the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in stderr.lines() {});
        Some(Server {
            child,
            client: Client { addr },
        })
    }
}

impl Client {
    fn get(&self, path: &str) -> Reply {
        Reply::read(self.send("GET", path, ""))
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        Reply::read(self.send("POST", path, &body.to_string()))
    }

    fn post_raw(&self, path: &str, body: &str) -> Reply {
        Reply::read(self.send("POST", path, body))
    }

    fn send(&self, method: &str, path: &str, body: &str) -> TcpStream {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        )
        .unwrap();
        // A refused body may be answered before it is all sent.
        let _ = stream.write_all(body.as_bytes());
        stream
    }

    /// Opens a streamed request; the events are read one at a time.
    fn stream(&self, path: &str, body: &Value) -> Events {
        let mut reader = BufReader::new(self.send("POST", path, &body.to_string()));
        let (status, headers) = read_head(&mut reader);
        assert_eq!(status, 200, "streamed request refused");
        assert!(header(&headers, "content-type").starts_with("text/event-stream"));
        assert_eq!(header(&headers, "transfer-encoding"), "chunked");
        Events {
            reader,
            pending: Vec::new(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or("", |(_, v)| v.as_str())
}

fn read_head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            return (status, headers);
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.to_string(), value.trim().to_string()));
    }
}

/// One chunk of a chunked body; `None` at its end.
fn read_chunk(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut size = String::new();
    reader.read_line(&mut size).ok()?;
    let size = usize::from_str_radix(size.trim(), 16).ok()?;
    let mut chunk = vec![0; size + 2];
    reader.read_exact(&mut chunk).ok()?;
    chunk.truncate(size);
    (size > 0).then_some(chunk)
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Reply {
    fn read(stream: TcpStream) -> Reply {
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader);
        let mut body = Vec::new();
        if header(&headers, "transfer-encoding") == "chunked" {
            while let Some(chunk) = read_chunk(&mut reader) {
                body.extend(chunk);
            }
        } else {
            let length: usize = header(&headers, "content-length").parse().unwrap_or(0);
            body.resize(length, 0);
            reader.read_exact(&mut body).unwrap();
        }
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&body)));
        Reply {
            status,
            headers,
            body,
        }
    }
}

/// Server-sent events of a streamed response.
struct Events {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl Events {
    /// The next event's data (`[DONE]` included); `None` when the body ended.
    fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let event = String::from_utf8(self.pending.drain(..end + 2).collect()).unwrap();
                let data = event.lines().find_map(|l| l.strip_prefix("data: "));
                return Some(data.expect("an event with data").to_string());
            }
            self.pending.extend(read_chunk(&mut self.reader)?);
        }
    }

    /// Every chunk up to `[DONE]` (which must come, then the body's end).
    fn all(mut self) -> Vec<Value> {
        let mut chunks = Vec::new();
        loop {
            let data = self.next_data().expect("the stream ends with data: [DONE]");
            if data == "[DONE]" {
                assert_eq!(self.next_data(), None, "nothing after [DONE]");
                return chunks;
            }
            chunks.push(serde_json::from_str(&data).unwrap());
        }
    }

    /// Hangs up.
    fn close(self) {
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

/// `lean-cli --json` on the same conversation (or raw prompt), greedy.
fn cli(args: &[&str], tokens: usize) -> Value {
    let model = model_path().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
        .args([
            "--model",
            &model,
            "--json",
            "--threads",
            "2",
            "--ctx",
            "1024",
        ])
        .args(["--tokens", &tokens.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cli_chat(messages: &Value, tokens: usize) -> Value {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let file = std::env::temp_dir().join(format!(
        "lean-serve-test-{}-{}.json",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&file, messages.to_string()).unwrap();
    let out = cli(&["--messages", file.to_str().unwrap()], tokens);
    let _ = std::fs::remove_file(file);
    out
}

/// The CLI's finish reason as OpenAI names it.
fn openai_finish(cli: &Value) -> &'static str {
    match cli["finish_reason"].as_str().unwrap() {
        "stop" => "stop",
        _ => "length",
    }
}

fn assert_usage(usage: &Value, cli: &Value) {
    let prompt = cli["prompt_ids"].as_array().unwrap().len() as u64;
    let completion = cli["token_ids"].as_array().unwrap().len() as u64;
    assert_eq!(usage["prompt_tokens"], prompt);
    assert_eq!(usage["completion_tokens"], completion);
    assert_eq!(usage["total_tokens"], prompt + completion);
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
}

/// The concatenated deltas of a streamed chat, its finish reason and its usage chunk.
fn collect_chat_stream(chunks: &[Value]) -> (String, String, Value) {
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = Value::Null;
    for chunk in chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], chunks[0]["id"]);
        if let Some(choice) = chunk["choices"].as_array().unwrap().first() {
            assert!(finish.is_empty(), "a chunk after the finish reason");
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = reason.to_string();
            }
        } else {
            usage = chunk["usage"].clone();
        }
    }
    (text, finish, usage)
}

#[test]
fn greedy_replies_equal_the_cli_and_the_next_turn_uses_the_cache() {
    let Some(server) = Server::start(&["--ctx", "1024"]) else {
        return;
    };
    let first = json!([
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]);
    let expected = cli_chat(&first, 24);
    let request =
        json!({"model": "anything", "messages": first, "max_tokens": 24, "temperature": 0});

    let reply = server.post("/v1/chat/completions", &request);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = &reply.body;
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "anything");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(content, expected["text"].as_str().unwrap());
    assert_eq!(choice["finish_reason"], openai_finish(&expected));
    assert_usage(&body["usage"], &expected);

    // Streamed: the same text in pieces, then the usage chunk; the prompt is cached now.
    let mut streamed_request = request.clone();
    streamed_request["stream"] = json!(true);
    streamed_request["stream_options"] = json!({"include_usage": true});
    let chunks = server
        .stream("/v1/chat/completions", &streamed_request)
        .all();
    let (text, finish, usage) = collect_chat_stream(&chunks);
    assert_eq!(text, content);
    assert_eq!(finish, openai_finish(&expected));
    assert!(chunks.len() > 3, "streamed in pieces: {chunks:?}");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null()));
    assert_usage(&usage, &expected);
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // The next turn: the reply and a new question after the first turn.
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": content}));
    second.push(json!({"role": "user", "content": "And of Germany?"}));
    let second = Value::Array(second);
    let expected_second = cli_chat(&second, 24);
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": second, "max_completion_tokens": 24, "temperature": 0}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.body["choices"][0]["message"]["content"],
        expected_second["text"]
    );
    assert_usage(&reply.body["usage"], &expected_second);
    let cached = reply.body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt_tokens = reply.body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached > 0 && cached < prompt_tokens,
        "cached {cached} of {prompt_tokens}"
    );

    // A stop string cuts the text before it, streamed or not (it may straddle tokens).
    let cut = content
        .char_indices()
        .map(|(i, _)| i)
        .nth(content.chars().count() / 2)
        .unwrap();
    let stop: String = content[cut..].chars().take(3).collect();
    let before = &content[..content.find(&stop).unwrap()];
    let mut stopped = request.clone();
    stopped["stop"] = json!(["never-generated", stop]);
    let reply = server.post("/v1/chat/completions", &stopped);
    assert_eq!(reply.body["choices"][0]["message"]["content"], before);
    assert_eq!(reply.body["choices"][0]["finish_reason"], "stop");
    stopped["stream"] = json!(true);
    let (text, finish, _) =
        collect_chat_stream(&server.stream("/v1/chat/completions", &stopped).all());
    assert_eq!((text.as_str(), finish.as_str()), (before, "stop"));

    // Raw completion, whole and streamed.
    let prompt = "The quick brown fox";
    let expected = cli(&["--raw", "--prompt", prompt], 16);
    let request = json!({"model": "m", "prompt": prompt, "max_tokens": 16, "temperature": 0});
    let reply = server.post("/v1/completions", &request);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["object"], "text_completion");
    assert!(reply.body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(reply.body["choices"][0]["text"], expected["text"]);
    assert_eq!(
        reply.body["choices"][0]["finish_reason"],
        openai_finish(&expected)
    );
    assert_usage(&reply.body["usage"], &expected);
    let mut streamed_request = request.clone();
    streamed_request["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", &streamed_request).all();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, expected["text"].as_str().unwrap());
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        openai_finish(&expected)
    );

    let models = server.get("/v1/models");
    assert_eq!(models.status, 200);
    assert_eq!(models.body["object"], "list");
    assert_eq!(models.body["data"][0]["id"], "smollm2-135m-instruct-q4_0");
    assert_eq!(models.body["data"][0]["object"], "model");
    let health = server.get("/health");
    assert_eq!(health.body["status"], "ok");
}

fn assert_error(reply: &Reply, status: u16, param: Option<&str>, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.body);
    let error = &reply.body["error"];
    assert!(
        !error["message"].as_str().unwrap_or("").is_empty(),
        "{what}: {}",
        reply.body
    );
    assert!(error["type"].is_string(), "{what}: {}", reply.body);
    let object = error.as_object().unwrap();
    assert!(
        object.contains_key("param") && object.contains_key("code"),
        "{what}"
    );
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{what}: {}", reply.body);
    }
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_goes_on() {
    let Some(server) = Server::start(&["--ctx", "256"]) else {
        return;
    };
    let user = json!([{"role": "user", "content": "Hi"}]);
    let chat = "/v1/chat/completions";
    assert_error(
        &server.post_raw(chat, "{\"messages\": ["),
        400,
        None,
        "invalid JSON",
    );
    assert_error(&server.post_raw(chat, "[1, 2]"), 400, None, "not an object");
    let cases = [
        (json!({}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": "Hi"}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "Hi"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": 42}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"messages": user, "max_tokens": 0}), "max_tokens"),
        (json!({"messages": user, "max_tokens": -5}), "max_tokens"),
        (
            json!({"messages": user, "max_tokens": 1_000_000_000}),
            "max_tokens",
        ),
        (
            json!({"messages": user, "max_completion_tokens": 0}),
            "max_completion_tokens",
        ),
        (json!({"messages": user, "n": 2}), "n"),
        (json!({"messages": user, "logprobs": true}), "logprobs"),
        (
            json!({"messages": user, "tools": [{"type": "function", "function": {"name": "f b"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"messages": user, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": user, "functions": [{"name": "f"}]}),
            "functions",
        ),
        (
            json!({"messages": user, "response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            json!({"messages": user, "logit_bias": {"42": 5}}),
            "logit_bias",
        ),
        (
            json!({"messages": user, "presence_penalty": 0.5}),
            "presence_penalty",
        ),
        (
            json!({"messages": user, "frequency_penalty": 1}),
            "frequency_penalty",
        ),
        (
            json!({"messages": user, "temperature": "hot"}),
            "temperature",
        ),
        (json!({"messages": user, "stop": 7}), "stop"),
    ];
    for (body, param) in &cases {
        assert_error(
            &server.post(chat, body),
            400,
            Some(param),
            &body.to_string(),
        );
    }
    let too_long =
        json!({"messages": [{"role": "user", "content": "word ".repeat(300)}], "max_tokens": 16});
    let reply = server.post(chat, &too_long);
    assert_error(&reply, 400, Some("messages"), "prompt past the context");
    assert_eq!(reply.body["error"]["code"], "context_length_exceeded");
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("256") && message.contains("16 max_tokens"),
        "{message}"
    );
    assert_error(
        &server.post("/v1/completions", &json!({"prompt": 5})),
        400,
        Some("prompt"),
        "non-string prompt",
    );
    let huge = format!(
        "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
        "a".repeat(5 << 20)
    );
    assert_error(&server.post_raw(chat, &huge), 413, None, "body over 4 MiB");
    assert_error(&server.get("/v1/nothing"), 404, None, "unknown route");
    assert_error(&server.get(chat), 405, None, "GET on a POST route");

    let reply = server.post(
        chat,
        &json!({"messages": user, "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(reply.status, 200, "still serving: {}", reply.body);
    assert_eq!(reply.body["usage"]["completion_tokens"], 4);
    drop(server);

    // --truncation auto drops the oldest turns (after the system message) until it fits.
    let Some(server) = Server::start(&["--ctx", "256", "--truncation", "auto"]) else {
        return;
    };
    let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
    for i in 0..6 {
        messages.push(json!({"role": "user", "content": format!("Question {i}: {}", "tell me more ".repeat(10))}));
        messages.push(json!({"role": "assistant", "content": "sure ".repeat(20)}));
    }
    messages.push(json!({"role": "user", "content": "Last question?"}));
    let reply = server.post(
        chat,
        &json!({"messages": messages, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let dropped: usize = header(&reply.headers, "x-lean-dropped-messages")
        .parse()
        .unwrap();
    assert!(
        dropped >= 2 && dropped.is_multiple_of(2),
        "whole turns dropped: {dropped}"
    );
    assert!(reply.body["usage"]["prompt_tokens"].as_u64().unwrap() + 8 <= 256);
}

#[test]
fn a_client_that_hangs_up_frees_its_slot_and_an_overflow_gets_503() {
    let Some(server) = Server::start(&["--ctx", "2048", "--slots", "1", "--queue", "1"]) else {
        return;
    };
    let long = json!({
        "messages": [{"role": "user", "content": "Count to ten thousand."}],
        "max_tokens": 2000, "ignore_eos": true, "temperature": 0, "stream": true,
    });
    let mut events = server.stream("/v1/chat/completions", &long);
    events.next_data().unwrap(); // the role chunk
    events.next_data().unwrap(); // the first token: the prefill is done
    let t = Instant::now();
    const SAMPLE: u32 = 20;
    for _ in 0..SAMPLE {
        events.next_data().unwrap();
    }
    let per_token = t.elapsed() / SAMPLE;

    // One request waits in the queue; the next one does not fit.
    let client = server.client.clone();
    let queued = std::thread::spawn(move || {
        let reply = client.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}),
        );
        (reply.status, Instant::now())
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.get("/health").body["queued"] != 1 {
        assert!(Instant::now() < deadline, "the request never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    assert_error(&reply, 503, None, "queue overflow");

    let hung_up = Instant::now();
    events.close();
    let (status, served) = queued.join().unwrap();
    assert_eq!(status, 200);
    let waited = served - hung_up;
    let rest_of_long = per_token * 1900;
    assert!(
        waited < rest_of_long / 4,
        "the queued request waited {waited:?} after the hang-up; the long generation had {rest_of_long:?} to go"
    );
    // The slot is freed just after its last event is sent.
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.get("/health").body["free_slots"] != 1 {
        assert!(Instant::now() < deadline, "the slot stays busy");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.get("/health").body["queued"], 0);
}

/// `response_format` over real sockets: a json_schema reply is JSON valid under the schema and
/// equals `lean-cli --json-schema FILE` (whole and streamed); json_object on the raw
/// completions endpoint; a schema the constraint library rejects is a 400 naming the problem,
/// and the server goes on.
#[test]
fn response_format_constrains_replies_and_a_rejected_schema_is_a_400() {
    let Some(server) = Server::start(&["--ctx", "1024"]) else {
        return;
    };
    let schema_file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../lean-constraint/tests/schemas/sentiment_enum.json");
    let case: Value = serde_json::from_slice(&std::fs::read(&schema_file).unwrap()).unwrap();
    let schema = case["schema"].clone();
    let messages = json!([{"role": "user", "content": case["prompt"]}]);

    // The CLI with the same schema (from a file holding the schema alone).
    let file = std::env::temp_dir().join(format!("lean-serve-schema-{}.json", std::process::id()));
    std::fs::write(&file, schema.to_string()).unwrap();
    let messages_file = std::env::temp_dir().join(format!(
        "lean-serve-schema-msgs-{}.json",
        std::process::id()
    ));
    std::fs::write(&messages_file, messages.to_string()).unwrap();
    let expected = cli(
        &[
            "--messages",
            messages_file.to_str().unwrap(),
            "--json-schema",
            file.to_str().unwrap(),
        ],
        120,
    );
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&messages_file);
    assert_eq!(expected["finish_reason"], "stop", "{expected}");

    let request = json!({
        "messages": messages, "max_tokens": 120, "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "sentiment", "schema": schema, "strict": true}},
    });
    let reply = server.post("/v1/chat/completions", &request);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let choice = &reply.body["choices"][0];
    let content = choice["message"]["content"].as_str().unwrap();
    assert_eq!(content, expected["text"].as_str().unwrap());
    assert_eq!(choice["finish_reason"], "stop");
    let value: Value = serde_json::from_str(content).unwrap();
    assert!(["positive", "negative", "neutral"].contains(&value["sentiment"].as_str().unwrap()));
    let confidence = value["confidence"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&confidence), "{value}");
    assert_eq!(value.as_object().unwrap().len(), 2, "{value}");

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (text, finish, _) =
        collect_chat_stream(&server.stream("/v1/chat/completions", &streamed).all());
    assert_eq!((text.as_str(), finish.as_str()), (content, "stop"));

    // json_object on the raw completions endpoint.
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "A JSON object describing a red apple:", "max_tokens": 150,
                "temperature": 0, "response_format": {"type": "json_object"}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let choice = &reply.body["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    if choice["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    }

    // Rejected: an unknown type, a contradiction, a bad pattern; then a bad response_format.
    for (schema, what) in [
        (json!({"type": "strng"}), "strng"),
        (
            json!({"type": "string", "pattern": "[a-"}),
            "unclosed character class",
        ),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 2}),
            "json_schema",
        ),
    ] {
        let reply = server.post(
            "/v1/chat/completions",
            &json!({"messages": messages, "response_format": {"type": "json_schema",
                    "json_schema": {"name": "bad", "schema": schema}}}),
        );
        assert_error(&reply, 400, Some("response_format"), what);
        assert_eq!(reply.body["error"]["code"], "invalid_response_format");
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{message}");
    }
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "response_format": {"type": "json_schema", "json_schema": []}}),
    );
    assert_error(
        &reply,
        400,
        Some("response_format"),
        "json_schema not an object",
    );
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "ignore_eos": true, "max_tokens": 4,
                "response_format": {"type": "json_object"}}),
    );
    assert_error(&reply, 400, Some("ignore_eos"), "ignore_eos with a format");

    // The server goes on.
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn lookup_replies_equal_plain_decoding_and_sampled_requests_still_work() {
    let Some(server) = Server::start(&["--ctx", "1024", "--lookup", "6"]) else {
        return;
    };
    // A reply that repeats its prompt: the guesses are made, checked and mostly kept.
    let messages = json!([
        {"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog, then the lazy dog sleeps."},
    ]);
    let expected = cli_chat(&messages, 32);
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 32, "temperature": 0}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let content = reply.body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(content, expected["text"].as_str().unwrap());
    // Sampled requests speculate too (the same distribution, other random draws).
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 8, "temperature": 0.8, "seed": 3}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn a_prediction_speeds_the_reply_without_changing_it() {
    // No --lookup: a request's prediction alone turns speculative decoding on.
    let Some(server) = Server::start(&["--ctx", "1024"]) else {
        return;
    };
    let messages =
        json!([{"role": "user", "content": "Write a Python function that adds two numbers."}]);
    let expected = cli_chat(&messages, 40);
    let text = expected["text"].as_str().unwrap();
    // The expected reply with a word changed: most guesses are kept, some refused.
    let prediction = text.replacen("def", "fn", 1);
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 40, "temperature": 0,
                "prediction": {"type": "content", "content": prediction}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap(),
        text
    );
    let details = &reply.body["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 10,
        "{details}"
    );
    // Under a response format too: the structured reply, guessed from its own text.
    let format = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false}}});
    let ask = json!([{"role": "user", "content": "Give a person's name and age as JSON."}]);
    let structured = |prediction: Option<&str>| {
        let mut body = json!({"messages": ask, "max_tokens": 40, "temperature": 0,
                              "response_format": format});
        if let Some(p) = prediction {
            body["prediction"] = json!({"type": "content", "content": p});
        }
        let reply = server.post("/v1/chat/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body
    };
    let plain = structured(None);
    let object = plain["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(object.starts_with('{'), "{object}");
    let guessed = structured(Some(object));
    assert_eq!(guessed["choices"][0]["message"]["content"], object);
    let details = &guessed["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 3,
        "{details}"
    );
    // Without a prediction the counts are zero; a malformed one is a 400 naming it.
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(
        reply.body["usage"]["completion_tokens_details"]["accepted_prediction_tokens"],
        0
    );
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4, "prediction": {"type": "text", "content": "x"}}),
    );
    assert_error(&reply, 400, Some("prediction"), "prediction.type");
}

#[test]
fn a_draft_model_speeds_replies_on_every_slot_without_changing_them() {
    let Some(m) = models() else { return };
    let draft = m.join("smollm2-135m-instruct-q8_0.gguf");
    let draft = draft.to_str().unwrap();
    let Some(server) = Server::start(&[
        "--ctx",
        "1024",
        "--slots",
        "2",
        "--draft",
        draft,
        "--draft-max",
        "4",
    ]) else {
        return;
    };
    // Two requests at once: each slot guesses with its own copy of the draft model's cache.
    let prompts = [
        "Repeat exactly: the quick brown fox jumps over the lazy dog, then the lazy dog sleeps.",
        "Write a Python function that adds two numbers.",
    ];
    let replies: Vec<_> = prompts
        .iter()
        .map(|prompt| {
            let client = server.client.clone();
            let messages = json!([{"role": "user", "content": prompt}]);
            std::thread::spawn(move || {
                client.post(
                    "/v1/chat/completions",
                    &json!({"messages": messages, "max_tokens": 32, "temperature": 0}),
                )
            })
        })
        .collect();
    for (reply, prompt) in replies.into_iter().zip(prompts) {
        let reply = reply.join().unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        let expected = cli_chat(&json!([{"role": "user", "content": prompt}]), 32);
        assert_eq!(
            reply.body["choices"][0]["message"]["content"], expected["text"],
            "{prompt}"
        );
        // The Q8_0 draft of the Q4_0 model: nearly the same network, its guesses kept (it
        // costs what the target does, so the cost check soon pauses guessing).
        let details = &reply.body["usage"]["completion_tokens_details"];
        assert!(
            details["accepted_prediction_tokens"].as_u64().unwrap() > 0,
            "{details}"
        );
    }
    // A constrained request runs without guesses; the server goes on.
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "A JSON object, please."}],
                "max_tokens": 8, "response_format": {"type": "json_object"}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused_at_start() {
    let (Some(m), Some(model)) = (models(), model_path()) else {
        return;
    };
    let qwen = m.join("qwen2.5-coder-0.5b-instruct-q4_0.gguf");
    for (extra, what) in [
        (
            vec!["--draft", qwen.to_str().unwrap()],
            "151936 tokens, the model's 49152",
        ),
        (vec!["--draft", &model, "--draft-max", "0"], "--draft-max"),
        (vec!["--draft", &model, "--lookup", "4"], "--lookup"),
        (vec!["--draft-max", "4"], "--draft"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
            .args(["serve", "--model", &model, "--port", "0"])
            .args(&extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} started");
        assert!(stderr.contains(what), "{extra:?}: {stderr}");
    }
}

/// Resident memory of a process in KiB (Linux), `None` elsewhere.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What one soak request does; each good kind is checked against the CLI.
#[derive(Clone, Copy, Debug)]
enum SoakRequest {
    Chat(usize),
    StreamedChat(usize),
    Completion,
    Malformed(usize),
    PromptPastContext,
    BodyTooLarge,
    HangUpMidStream,
    HangUpMidBody,
}

/// Requests from 8 clients at once, mixing good requests, malformed bodies, prompts past the
/// context, oversized bodies and clients that hang up mid-stream or mid-body: every good
/// reply equals the CLI's, every bad one is a 4xx, the server's memory stays flat and no slot
/// or queue entry is left busy. `LEAN_SOAK_REQUESTS` sets the total (default 1000).
#[test]
fn a_soak_of_mixed_good_bad_and_abandoned_requests_leaves_the_server_exact_and_flat() {
    let Some(server) = Server::start(&["--ctx", "256", "--slots", "2", "--queue", "64"]) else {
        return;
    };
    let total: usize = std::env::var("LEAN_SOAK_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    const TOKENS: usize = 6;
    let conversations = [
        json!([{"role": "user", "content": "What is the capital of France?"}]),
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]),
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}]),
        json!([{"role": "user", "content": "Write a haiku about rain."}]),
    ];
    let expected: Vec<String> = conversations
        .iter()
        .map(|c| cli_chat(c, TOKENS)["text"].as_str().unwrap().to_string())
        .collect();
    let raw_prompt = "The three primary colors are";
    let expected_raw = cli(&["--raw", "-p", raw_prompt], TOKENS)["text"]
        .as_str()
        .unwrap()
        .to_string();
    let malformed: [&str; 6] = [
        "{\"messages\": [",
        "[1, 2]",
        "{}",
        "{\"messages\": [{\"role\": \"wizard\", \"content\": \"Hi\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": -1}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"temperature\": \"hot\"}",
    ];
    let huge = format!(
        "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
        "a".repeat(5 << 20)
    );

    let run = |request: SoakRequest, client: &Client| {
        let chat = "/v1/chat/completions";
        let good = |i: usize, stream: bool| json!({"messages": conversations[i], "max_tokens": TOKENS, "temperature": 0, "stream": stream});
        match request {
            SoakRequest::Chat(i) => {
                let reply = client.post(chat, &good(i, false));
                assert_eq!(reply.status, 200, "{request:?}: {}", reply.body);
                let content = &reply.body["choices"][0]["message"]["content"];
                assert_eq!(content.as_str().unwrap(), expected[i], "{request:?}");
            }
            SoakRequest::StreamedChat(i) => {
                let (text, _, usage) =
                    collect_chat_stream(&client.stream(chat, &good(i, true)).all());
                assert_eq!(text, expected[i], "{request:?}");
                assert!(usage.is_null(), "no usage chunk unless asked for");
            }
            SoakRequest::Completion => {
                let body = json!({"prompt": raw_prompt, "max_tokens": TOKENS, "temperature": 0});
                let reply = client.post("/v1/completions", &body);
                assert_eq!(reply.status, 200, "{request:?}: {}", reply.body);
                assert_eq!(
                    reply.body["choices"][0]["text"].as_str().unwrap(),
                    expected_raw
                );
            }
            SoakRequest::Malformed(i) => {
                assert_error(
                    &client.post_raw(chat, malformed[i]),
                    400,
                    None,
                    malformed[i],
                );
            }
            SoakRequest::PromptPastContext => {
                let body = json!({"messages": [{"role": "user", "content": "word ".repeat(300)}], "max_tokens": 8});
                assert_error(
                    &client.post(chat, &body),
                    400,
                    Some("messages"),
                    "past the context",
                );
            }
            SoakRequest::BodyTooLarge => {
                assert_error(&client.post_raw(chat, &huge), 413, None, "body over 4 MiB");
            }
            SoakRequest::HangUpMidStream => {
                let body = json!({"messages": conversations[0], "max_tokens": 200, "ignore_eos": true, "temperature": 0, "stream": true});
                let mut events = client.stream(chat, &body);
                events.next_data().unwrap(); // the role chunk
                events.next_data().unwrap(); // a token: the slot is generating
                events.close();
            }
            SoakRequest::HangUpMidBody => {
                let mut stream = TcpStream::connect(&client.addr).unwrap();
                let _ = write!(
                    stream,
                    "POST {chat} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"messages\": [{{\"ro"
                );
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    };
    // A fixed pseudo-random mix (xorshift), the same on every run.
    let pick = |seed: u64| {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = (x >> 11) as usize;
        match k % 100 {
            0..=29 => SoakRequest::Chat(k / 100 % conversations.len()),
            30..=49 => SoakRequest::StreamedChat(k / 100 % conversations.len()),
            50..=57 => SoakRequest::Completion,
            58..=72 => SoakRequest::Malformed(k / 100 % malformed.len()),
            73..=79 => SoakRequest::PromptPastContext,
            80..=81 => SoakRequest::BodyTooLarge,
            82..=93 => SoakRequest::HangUpMidStream,
            _ => SoakRequest::HangUpMidBody,
        }
    };

    // Warm up with every kind once, so that the memory baseline has every buffer in place.
    let warm_up = [
        SoakRequest::Chat(0),
        SoakRequest::StreamedChat(1),
        SoakRequest::Completion,
        SoakRequest::Malformed(0),
        SoakRequest::PromptPastContext,
        SoakRequest::BodyTooLarge,
        SoakRequest::HangUpMidStream,
        SoakRequest::HangUpMidBody,
    ];
    for request in warm_up {
        run(request, &server.client);
    }
    let pid = server.child.id();
    let wait_idle = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let health = server.get("/health").body;
            if health["free_slots"] == 2 && health["queued"] == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "a slot or queue entry stays busy: {health}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_idle();

    // Rounds of requests from 8 clients at once; the memory is sampled after each. The first
    // round is the baseline: concurrency itself raises the allocator's high-water mark (bodies
    // of 4 MiB read side by side), once; a leak grows with every round after it.
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 4;
    let t = Instant::now();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    let mut rss = Vec::new();
    for round in 0..ROUNDS {
        let (first, last) = (total * round / ROUNDS, total * (round + 1) / ROUNDS);
        let round_counts = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let run = &run;
                    let client = server.client.clone();
                    scope.spawn(move || {
                        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
                        for i in (first + c..last).step_by(CLIENTS) {
                            let request = pick(i as u64 + 1);
                            run(request, &client);
                            let kind = format!("{request:?}");
                            let kind = kind.split('(').next().unwrap().to_string();
                            *kinds.entry(kind).or_default() += 1;
                        }
                        kinds
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (kind, n) in round_counts.into_iter().flatten() {
            *counts.entry(kind).or_default() += n;
        }
        wait_idle();
        rss.push(rss_kib(pid));
    }
    let elapsed = t.elapsed();
    // The server still answers exactly after the soak.
    run(SoakRequest::Chat(2), &server.client);
    eprintln!(
        "soak: {total} requests from {CLIENTS} clients in {elapsed:.1?}: {counts:?}; RSS after each round {rss:?} KiB"
    );
    assert_eq!(counts.values().sum::<usize>(), total);
    if let (Some(Some(baseline)), Some(Some(end))) = (rss.first(), rss.last()) {
        // Flat: no per-request growth after the first round (750 leaked 4 KiB pages would
        // already be 3 MiB).
        assert!(
            *end <= baseline + 16 * 1024,
            "RSS grew from {baseline} to {end} KiB over the last {} requests: {rss:?}",
            total - total / ROUNDS
        );
    }
}
