//! Tool calls through the engine (`lean::tools`) on the real test models, each with its GGUF's
//! own template: the syntax is found from the template (Qwen2.5, Qwen3: Hermes; Llama 3.2: its
//! JSON; SmolLM2: none, lean's fallback); a forced call (`tool_choice` "required") parses into one
//! call whose arguments validate against the function's schema (the `jsonschema` crate); the
//! round trip call → tool result → final answer; a forced call cut off by max_tokens is no call
//! and ends with `length`.
mod common;

use lean::tokenizer::FullChatMessage;
use lean::tools::{self, Syntax, Tools};
use lean::{Engine, FinishReason, GenerateOptions, Model, Prompt, Tokenizer};
use lean_constraint::ConstraintSpec;
use serde_json::{json, Map, Value};

const MODELS: [(&str, Option<Syntax>); 4] = [
    (
        "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
        Some(Syntax::Hermes),
    ),
    ("qwen3-0.6b-random-q4_0.gguf", Some(Syntax::Hermes)),
    ("llama-3.2-1b-random-q4_0.gguf", Some(Syntax::Llama3)),
    ("smollm2-135m-instruct-q4_0.gguf", None),
];

fn engine(file: &str) -> Option<Engine> {
    let path = common::models_dir()?.join(file);
    if !path.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} missing",
            path.display()
        );
        return None;
    }
    let model = Model::load_file(&path).unwrap();
    let tokenizer = Tokenizer::from_gguf(&model.gguf, None, None).unwrap();
    Some(Engine::new(model, tokenizer, 1024).unwrap())
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

fn tools(choice: Value) -> Tools {
    let list = json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Get the current weather in a city", "parameters": weather_schema()}},
        {"type": "function", "function": {"name": "get_time",
            "description": "Get the current time in a timezone",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 16}},
                           "required": ["timezone"], "additionalProperties": false}}},
    ]);
    tools::parse_tools(Some(&list), Some(&choice))
        .unwrap()
        .unwrap()
}

/// Renders `messages` with `tools` as every surface does (`tools::prepare_chat`) and generates
/// greedily: the generation and the chat's syntax.
fn run(
    engine: &mut Engine,
    messages: &[FullChatMessage],
    tools: &Tools,
    max_tokens: usize,
) -> (lean::Generation, Syntax) {
    let template = tools::template_syntax(&engine.tokenizer);
    let chat = tools::prepare_chat(template, messages, Some(tools), &Map::new());
    let ids = engine
        .tokenizer
        .encode_chat_full(&chat.messages, true, &chat.kwargs)
        .unwrap();
    let options = GenerateOptions {
        max_tokens,
        constraint: chat.grammar.map(ConstraintSpec::Lark),
        ..Default::default()
    };
    let generation = engine
        .generate(&Prompt::Ids(ids), &options, |_| true)
        .unwrap();
    (generation, chat.syntax.unwrap())
}

#[test]
fn templates_say_their_call_syntax() {
    for (file, want) in MODELS {
        let Some(engine) = engine(file) else {
            return;
        };
        assert_eq!(tools::template_syntax(&engine.tokenizer), want, "{file}");
    }
}

#[test]
fn a_forced_call_validates_then_its_result_gets_an_answer() {
    for (file, _) in MODELS {
        let Some(mut engine) = engine(file) else {
            return;
        };
        let question = FullChatMessage::new("user", "What is the weather like in Paris today?");
        let forced = tools(json!({"type": "function", "function": {"name": "get_weather"}}));
        let (generation, syntax) = run(&mut engine, std::slice::from_ref(&question), &forced, 80);
        let finish = generation.finish_reason.as_str();
        assert_eq!(finish, "stop", "{file}: {}", generation.text);
        let (content, calls) = tools::parse_reply(&generation.text, syntax, &forced, finish)
            .unwrap_or_else(|| panic!("{file}: no call in {:?}", generation.text));
        assert_eq!(content, None, "{file}");
        assert_eq!(calls.len(), 1, "{file}");
        assert_eq!(calls[0].name, "get_weather");
        let arguments: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert!(
            jsonschema::is_valid(&weather_schema(), &arguments),
            "{file}: {arguments}"
        );

        // "required": either function, the same guarantees.
        let required = tools(json!("required"));
        let (generation, syntax) = run(&mut engine, std::slice::from_ref(&question), &required, 80);
        let finish = generation.finish_reason.as_str();
        let (_, calls) = tools::parse_reply(&generation.text, syntax, &required, finish)
            .unwrap_or_else(|| panic!("{file}: no call in {:?}", generation.text));
        assert_eq!(calls.len(), 1, "{file}");

        // The call and its result go back; the model answers (tool_choice auto: a text or a
        // call, either parsed or left as content, never an error).
        let openai = tools::openai_tool_calls(&calls, false);
        let mut call_message = FullChatMessage::new("assistant", "");
        call_message.content = None;
        call_message.tool_calls = Some(
            openai
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    let arguments: Value =
                        serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                    c["function"]["arguments"] = arguments;
                    c
                })
                .collect(),
        );
        let mut result = FullChatMessage::new("tool", "22 degrees and sunny");
        result.tool_call_id = openai[0]["id"].as_str().map(str::to_string);
        let conversation = [question, call_message, result];
        let auto = tools(json!("auto"));
        let (answer, _) = run(&mut engine, &conversation, &auto, 16);
        assert!(!answer.token_ids.is_empty(), "{file}");
        let template = tools::template_syntax(&engine.tokenizer);
        let chat = tools::prepare_chat(template, &conversation, Some(&auto), &Map::new());
        let text = engine
            .tokenizer
            .apply_chat_template_full(&chat.messages, true, &chat.kwargs)
            .unwrap();
        assert!(text.contains("22 degrees and sunny"), "{file}: {text}");
        assert!(text.contains("\"get_weather\""), "{file}: {text}");
    }
}

#[test]
fn a_forced_call_cut_off_by_max_tokens_is_no_call_and_ends_with_length() {
    let Some(mut engine) = engine(MODELS[0].0) else {
        return;
    };
    let forced = tools(json!("required"));
    let question = FullChatMessage::new("user", "What is the weather like in Paris today?");
    let (generation, syntax) = run(&mut engine, &[question], &forced, 6);
    assert_eq!(generation.finish_reason, FinishReason::Length);
    assert_eq!(generation.token_ids.len(), 6);
    assert!(
        generation.text.starts_with("<tool_call>"),
        "{}",
        generation.text
    );
    assert_eq!(
        tools::parse_reply(&generation.text, syntax, &forced, "length"),
        None
    );
}
