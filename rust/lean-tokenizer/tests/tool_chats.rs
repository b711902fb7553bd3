//! Chats with tools, tool calls and tool results rendered through the test models' own chat
//! templates (their GGUFs' `tokenizer.chat_template`) equal transformers' renderings:
//! tests/data/tool-chats.json, written by scripts/gen_tool_chat_fixtures.py (jinja2 set up as
//! transformers' `apply_chat_template(messages, tools=...)`: its environment, `tojson`,
//! `raise_exception`, special tokens, kwargs). Covered: Qwen2.5's and Qwen3's Hermes templates,
//! Llama 3.2's JSON template (tools in the user message or the system message), and SmolLM2's,
//! which ignores tools; arguments as objects (with non-ASCII text, numbers, booleans, arrays),
//! several calls and results in a row, a call without arguments, calls without `tools`, and the
//! templates' own errors (Llama 3.2 refuses two calls at once; SmolLM2 cannot add a null content).

use lean_tokenizer::{FullChatMessage, Tokenizer};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct Fixture {
    pinned_time: i64,
    models: Vec<ModelCases>,
}

#[derive(Deserialize)]
struct ModelCases {
    file: String,
    special_tokens: Map<String, Value>,
    renders_tools: bool,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<FullChatMessage>,
    tools: Option<Value>,
    add_generation_prompt: bool,
    kwargs: Map<String, Value>,
    rendered: Option<String>,
    error: Option<String>,
}

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LEAN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    dir.is_dir().then_some(dir)
}

/// The tokenizer and chat template of a GGUF (its metadata only: the first bytes of the file).
fn gguf_tokenizer(path: &Path) -> Tokenizer {
    let file_len = std::fs::metadata(path).unwrap().len();
    let mut prefix = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .take(64 << 20)
        .read_to_end(&mut prefix)
        .unwrap();
    let gguf = lean_gguf::Gguf::parse_header(&prefix, file_len).unwrap();
    Tokenizer::from_gguf(&gguf, None, None).unwrap()
}

#[test]
fn tool_chats_render_as_transformers_renders_them() {
    let fixture: Fixture = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tool-chats.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let Some(dir) = models_dir() else {
        assert!(std::env::var_os("CI").is_none(), "test models missing");
        eprintln!("skipping: test models missing (scripts/fetch-test-models.sh)");
        return;
    };
    let mut failures = Vec::new();
    let mut compared = 0;
    for model in &fixture.models {
        let path = dir.join(&model.file);
        if !path.is_file() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} missing",
                path.display()
            );
            eprintln!("skipping {}: missing", model.file);
            continue;
        }
        let mut tokenizer = gguf_tokenizer(&path);
        tokenizer.set_template_time(Some(fixture.pinned_time));
        for (name, token) in &model.special_tokens {
            if name == "bos_token" || name == "eos_token" {
                let ours = match name.as_str() {
                    "bos_token" => tokenizer.bos_token(),
                    _ => tokenizer.eos_token(),
                };
                assert_eq!(ours, token.as_str(), "{}: {name}", model.file);
            }
        }
        for case in &model.cases {
            let mut kwargs = case.kwargs.clone();
            if let Some(tools) = &case.tools {
                kwargs.insert("tools".into(), tools.clone());
            }
            let ours = tokenizer.apply_chat_template_full(
                &case.messages,
                case.add_generation_prompt,
                &kwargs,
            );
            let label = format!("{} {} {:?}", model.file, case.name, case.kwargs);
            match (&case.rendered, ours) {
                (Some(want), Ok(got)) if &got == want => compared += 1,
                (Some(want), Ok(got)) => failures.push(format!(
                    "{label}:\n--- transformers\n{want}\n--- lean\n{got}"
                )),
                (Some(_), Err(e)) => failures.push(format!("{label}: lean failed: {e}")),
                (None, Ok(got)) => failures.push(format!(
                    "{label}: transformers failed ({:?}), lean rendered:\n{got}",
                    case.error
                )),
                (None, Err(_)) => compared += 1,
            }
        }
        // A template that takes tools writes the function's name; one that does not never does.
        let question = model
            .cases
            .iter()
            .find(|c| c.name == "tools_question")
            .unwrap();
        assert_eq!(
            question
                .rendered
                .as_deref()
                .is_some_and(|t| t.contains("get_weather")),
            model.renders_tools,
            "{}",
            model.file
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{compared} renderings equal transformers'");
}
