//! lean-cli end to end on a real test model: chat, raw and multi-turn prompts give the HF
//! reference's greedy ids; bad input exits non-zero with a message that names the problem.
mod common;

use common::models;
use std::process::Command;

fn fixture_case(name: &str) -> serde_json::Value {
    fixture_case_of("smollm2-135m-instruct-q4_0", name)
}

/// A case of the HF fixture of the model file `stem` (.gguf).
fn fixture_case_of(stem: &str, name: &str) -> serde_json::Value {
    let path = format!(
        "{}/../../fixtures/hf/{stem}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
        .clone()
}

fn lean(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Runs lean-cli --json and checks prompt ids and the greedy ids against the reference case
/// (the CLI stops at end-of-turn tokens, so its ids are a prefix of the reference's).
fn check_json(args: &[&str], case: &str) {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let mut all = vec![
        "--model",
        model.to_str().unwrap(),
        "--json",
        "--tokens",
        "24",
        "--threads",
        "2",
    ];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = lean(&all);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("prefill") && stderr.contains("decode"),
        "timings on stderr: {stderr}"
    );
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let reference = fixture_case(case);
    assert_eq!(ids(&out["prompt_ids"]), ids(&reference["prompt_ids"]));
    let ours = ids(&out["token_ids"]);
    assert!(!ours.is_empty());
    assert_eq!(ours[..], ids(&reference["greedy_ids"])[..ours.len()]);
    assert!(out["timings"]["decode_tokens_per_second"]
        .as_f64()
        .is_some());
}

#[test]
fn chat_prompt_matches_reference() {
    check_json(
        &["--prompt", "What is the capital of France?"],
        "chat_short",
    );
}

#[test]
fn system_prompt_matches_reference() {
    check_json(
        &[
            "--system",
            "You are a concise assistant. Answer in one sentence.",
            "--prompt",
            "Why is the sky blue?",
        ],
        "chat_system",
    );
}

#[test]
fn raw_prompt_matches_reference() {
    check_json(&["--raw", "--prompt", "The quick brown fox"], "raw_short");
}

#[test]
fn messages_file_matches_reference() {
    let case = fixture_case("chat_multiturn");
    let file = std::env::temp_dir().join(format!("lean-cli-messages-{}.json", std::process::id()));
    std::fs::write(&file, case["messages"].to_string()).unwrap();
    check_json(&["--messages", file.to_str().unwrap()], "chat_multiturn");
    let _ = std::fs::remove_file(file);
}

#[test]
fn streamed_text_equals_json_text() {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let base = [
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Name three colors.",
        "--tokens",
        "20",
    ];
    let (ok, streamed, _) = lean(&base);
    assert!(ok);
    let (ok, json, _) = lean(&[&base[..], &["--json"]].concat());
    assert!(ok);
    let out: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(
        streamed.trim_end_matches('\n'),
        out["text"].as_str().unwrap()
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let (ok, _, err) = lean(&["--model", "/nonexistent.gguf", "--prompt", "hi"]);
    assert!(!ok && err.contains("/nonexistent.gguf"), "{err}");
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let model = model.to_str().unwrap();
    let (ok, _, err) = lean(&[
        "--model",
        model,
        "--prompt",
        &"word ".repeat(100),
        "--ctx",
        "32",
    ]);
    assert!(!ok && err.contains("32"), "{err}");
    let (ok, _, err) = lean(&["--model", model, "--prompt", "hi", "--top-p", "0"]);
    assert!(!ok && err.contains("top_p"), "{err}");
    let bad = std::env::temp_dir().join(format!("lean-cli-bad-{}.json", std::process::id()));
    std::fs::write(&bad, "{\"role\": \"user\"}").unwrap();
    let (ok, _, err) = lean(&["--model", model, "--messages", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("array"), "{err}");
    let _ = std::fs::remove_file(bad);
    let (ok, _, err) = lean(&[
        "--model",
        model,
        "--tokenizer",
        m.join("qwen2.5-coder-0.5b-instruct").to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert!(!ok && err.contains("tokenizer"), "{err}");
}

#[test]
fn bench_reports_json() {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let (ok, out, err) = lean(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--json",
    ]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(r["prefill_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(r["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(r["peak_rss_bytes"].as_u64().unwrap() > r["file_bytes"].as_u64().unwrap() / 2);
}

#[test]
fn bench_synthetic_needs_no_model_file() {
    let (ok, out, err) = lean(&[
        "bench",
        "--synthetic",
        "smollm2-360m",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "2",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--json",
    ]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r["model"], "synthetic smollm2-360m q4_0");
    assert_eq!(r["synthetic"]["shape"], "smollm2-360m");
    assert_eq!(r["synthetic"]["weights"], "q4_0");
    // 32 layers × (Q, K, V, O, gate, up, down), the 960-wide embedding Q8_0 (not a whole number
    // of Q6_K blocks), 2 norms per layer + the final one.
    assert_eq!(
        r["tensor_types"],
        serde_json::json!({"Q4_0": 32 * 7, "Q8_0": 1, "F32": 65})
    );
    // Per layer 960·960·2 + 960·320·2 + 3·960·2560 weights at 18 bytes per 32; the tied output
    // head 49152 × 960 at 34 bytes per 32.
    let layer = (960 * 960 * 2 + 960 * 320 * 2 + 3 * 960 * 2560) / 32 * 18;
    let head = 49152 * 960 / 32 * 34;
    assert_eq!(r["weight_bytes_per_token"], 32 * layer + head);
    let file = r["file_bytes"].as_u64().unwrap();
    assert!(
        file > (32 * layer + head) as u64 && file < 240_000_000,
        "{file}"
    );
    assert!(r["prefill_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(r["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(r["decode_weight_gb_per_second"].as_f64().unwrap() > 0.0);

    let (ok, _, err) = lean(&["bench", "--prompt-tokens", "8"]);
    assert!(!ok && err.contains("--synthetic SHAPE"), "{err}");
    let (ok, _, err) = lean(&["bench", "--synthetic", "llama-70b"]);
    assert!(!ok && err.contains("qwen2.5-3b"), "{err}");
}

/// The model file alone in a directory of its own: no tokenizer.json anywhere near it.
fn lone_copy(m: &std::path::Path, file: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lean-cli-lone-{}-{file}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lone = dir.join(file);
    if !lone.exists() {
        std::os::unix::fs::symlink(m.join(file), &lone).unwrap();
    }
    lone
}

#[test]
fn a_lone_gguf_chats_with_its_own_tokenizer_and_template() {
    let Some(m) = models() else { return };
    let lone = lone_copy(&m, "smollm2-135m-instruct-q4_0.gguf");
    for (args, case) in [
        (
            vec!["--prompt", "What is the capital of France?"],
            "chat_short",
        ),
        (
            vec!["--raw", "--prompt", "The quick brown fox"],
            "raw_short",
        ),
    ] {
        let mut all = vec![
            "--model",
            lone.to_str().unwrap(),
            "--json",
            "--tokens",
            "16",
            "--threads",
            "2",
        ];
        all.extend(args);
        let (ok, stdout, stderr) = lean(&all);
        assert!(ok, "{stderr}");
        assert!(
            stderr.contains("tokenizer from the GGUF's metadata"),
            "{stderr}"
        );
        let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let reference = fixture_case(case);
        assert_eq!(
            ids(&out["prompt_ids"]),
            ids(&reference["prompt_ids"]),
            "{case}"
        );
        let ours = ids(&out["token_ids"]);
        assert_eq!(
            ours[..],
            ids(&reference["greedy_ids"])[..ours.len()],
            "{case}"
        );
    }
    let _ = std::fs::remove_dir_all(lone.parent().unwrap());
}

#[test]
fn tokenize_prints_ids_for_a_text_and_for_json_lines() {
    let Some(m) = models() else { return };
    let reference = fixture_case("raw_short");
    let text = reference["prompt"]
        .as_str()
        .unwrap_or("The quick brown fox");
    for file in [
        "smollm2-135m-instruct-q4_0.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
    ] {
        let model = m.join(file);
        let model = model.to_str().unwrap();
        // The GGUF's tokenizer and the tokenizer.json next to it give the same ids.
        let (ok, from_gguf, err) = lean(&["tokenize", "-m", model, "--tokenizer", "gguf", text]);
        assert!(ok, "{err}");
        let (ok, from_json, err) = lean(&["tokenize", "-m", model, text]);
        assert!(ok, "{err}");
        assert_eq!(from_gguf, from_json, "{file}");
        if file.starts_with("smollm2") {
            let got: Vec<u64> = serde_json::from_str(from_gguf.trim()).unwrap();
            assert_eq!(got, ids(&reference["prompt_ids"]));
        }
    }
    // JSON Lines in, one array a line out; special-token text stays one id.
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
        .args([
            "tokenize",
            "-m",
            model.to_str().unwrap(),
            "--tokenizer",
            "gguf",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\"<|im_start|>user\"\n\n\"\"\n\"a\\nb\"\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<Vec<u64>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0][0], 1, "<|im_start|> is id 1");
    assert_eq!(lines[1], Vec::<u64>::new());
    assert_eq!(lines[2].len(), 3);
    // A line that is not a JSON string is an error naming the line.
    let mut child = Command::new(env!("CARGO_BIN_EXE_lean-cli"))
        .args(["tokenize", "-m", model.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\"ok\"\n{\"text\": 1}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2"), "{err}");
}

#[test]
fn tokenize_chat_gives_the_chat_prompt_as_ids_or_as_the_template_text() {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let model = model.to_str().unwrap();
    let chat = r#"[{"role": "user", "content": "Hi <|im_end|> there"}]"#;
    let (ok, text, err) = lean(&["tokenize", "-m", model, "--chat", "--template-text", chat]);
    assert!(ok, "{err}");
    let text: String = serde_json::from_str(text.trim()).unwrap();
    // SmolLM2's template: its default system turn, the user's, the assistant's opened.
    assert!(text.starts_with("<|im_start|>system\n"), "{text}");
    assert!(
        text.ends_with("<|im_start|>user\nHi <|im_end|> there<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    // The chat's ids are that text's (SmolLM2 adds no bos), special-token text kept whole.
    let (ok, chat_ids, err) = lean(&["tokenize", "-m", model, "--chat", chat]);
    assert!(ok, "{err}");
    let (ok, text_ids, err) = lean(&["tokenize", "-m", model, &text]);
    assert!(ok, "{err}");
    assert_eq!(chat_ids, text_ids);
    let ids: Vec<u64> = serde_json::from_str(chat_ids.trim()).unwrap();
    assert_eq!(
        ids.iter().filter(|&&id| id == 1).count(),
        3,
        "three <|im_start|>: {ids:?}"
    );
    // A message without content is an error that says what a chat is.
    let (ok, _, err) = lean(&["tokenize", "-m", model, "--chat", r#"[{"role": "user"}]"#]);
    assert!(!ok && err.contains("content"), "{err}");
    // --template-text needs --chat.
    let (ok, _, err) = lean(&["tokenize", "-m", model, "--template-text", "hi"]);
    assert!(!ok && err.contains("--chat"), "{err}");
}

#[test]
fn a_gguf_without_tokenizer_metadata_asks_for_a_tokenizer() {
    let Some(_) = models() else { return };
    // A valid GGUF (metadata only) that has no tokenizer.ggml.* keys.
    let dir = std::env::temp_dir().join(format!("lean-cli-notok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bare.gguf");
    let bytes = lean::gguf::GgufWriter::new()
        .add("general.architecture", "llama")
        .finish()
        .unwrap();
    std::fs::write(&file, bytes).unwrap();
    let (ok, _, err) = lean(&["tokenize", "-m", file.to_str().unwrap(), "hi"]);
    assert!(
        !ok && err.contains("tokenizer.ggml.model") && err.contains("--tokenizer"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `--template-kwargs` reaches the chat template: Llama 3.2's prints today's date unless given
/// `date_string`; with the date the reference was made on, the prompt ids are the reference's.
#[test]
fn template_kwargs_reach_the_chat_template() {
    let Some(m) = models() else { return };
    let model = m.join("llama-3.2-1b-random-q8_0.gguf");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/hf/llama-3.2-1b-random-q8_0.json"
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "chat_short")
        .unwrap();
    let prompt = case["messages"][0]["content"].as_str().unwrap();
    let model = model.to_str().unwrap();
    let base = ["--model", model, "--json", "--tokens", "1", "-p", prompt];
    let kwargs = r#"{"date_string": "26 Jul 2024"}"#;
    let (ok, stdout, stderr) = lean(&[&base[..], &["--template-kwargs", kwargs]].concat());
    assert!(ok, "{stderr}");
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(ids(&out["prompt_ids"]), ids(&case["prompt_ids"]));

    for (bad, why) in [
        ("[1]", "must be a JSON object"),
        ("{", "not valid JSON"),
        (r#"{"messages": []}"#, "may not set 'messages'"),
    ] {
        let (ok, _, stderr) = lean(&[&base[..], &["--template-kwargs", bad]].concat());
        assert!(!ok && stderr.contains(why), "{bad}: {stderr}");
    }
}

#[test]
fn lookup_gives_the_reference_ids_and_reports_its_passes() {
    // The raw code case repeats its prompt's tokens, so guesses are made and checked.
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let case = fixture_case("raw_code");
    let (ok, stdout, stderr) = lean(&[
        "--model",
        model.to_str().unwrap(),
        "--raw",
        "--prompt",
        case["prompt"].as_str().unwrap(),
        "--json",
        "--tokens",
        "32",
        "--threads",
        "2",
        "--lookup",
        "6",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("prompt lookup:"), "{stderr}");
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let ours = ids(&out["token_ids"]);
    assert_eq!(ours[..], ids(&case["greedy_ids"])[..ours.len()]);
    let spec = &out["timings"]["speculation"];
    assert!(spec["verifications"].as_u64().unwrap() > 0, "{spec}");
    assert!(spec["accepted_tokens"].as_u64().unwrap() <= spec["drafted_tokens"].as_u64().unwrap());
}

#[test]
fn lookup_samples_follows_constraints_and_refuses_zero_length_guesses() {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let model = model.to_str().unwrap();
    let (ok, _, err) = lean(&[
        "--model",
        model,
        "-p",
        "Hi",
        "-n",
        "8",
        "--lookup",
        "4",
        "--temperature",
        "0.7",
    ]);
    assert!(ok, "{err}");
    // Under a constraint: the same object as without guessing.
    let object = |extra: &[&str]| {
        let prompt = "Give a JSON object with a person's name and age.";
        let mut args = vec!["--model", model, "-p", prompt, "-n", "40", "--json-object"];
        args.extend_from_slice(extra);
        let (ok, out, err) = lean(&args);
        assert!(ok, "{err}");
        out
    };
    let plain = object(&[]);
    assert!(plain.trim_start().starts_with('{'), "{plain}");
    assert_eq!(object(&["--lookup", "4"]), plain);
    let (ok, _, err) = lean(&["--model", model, "-p", "Hi", "--lookup", "0"]);
    assert!(!ok);
    assert!(err.contains("at least one token"), "{err}");
}

#[test]
fn bench_spec_reports_the_same_tokens_for_every_task() {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q4_0.gguf");
    let (ok, out, err) = lean(&[
        "bench-spec",
        "--model",
        model.to_str().unwrap(),
        "--gen-tokens",
        "24",
        "--reps",
        "1",
        "--json",
    ]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let tasks = r["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["task"].as_str().unwrap()).collect();
    assert_eq!(names, ["code", "summary", "chat", "extract"]);
    for t in tasks {
        assert_eq!(t["same_tokens"], true, "{t}");
        assert!(t["lookup_decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    }
    assert!(
        tasks
            .iter()
            .any(|t| t["accepted_tokens"].as_u64().unwrap() > 0),
        "{r}"
    );
}

#[test]
fn a_draft_model_gives_the_reference_ids_and_another_vocabulary_is_refused() {
    let Some(m) = models() else { return };
    let model = m.join("smollm2-135m-instruct-q8_0.gguf");
    let draft = m.join("smollm2-135m-instruct-q4_0.gguf");
    let case = fixture_case_of("smollm2-135m-instruct-q8_0", "raw_code");
    let (ok, stdout, stderr) = lean(&[
        "--model",
        model.to_str().unwrap(),
        "--raw",
        "--prompt",
        case["prompt"].as_str().unwrap(),
        "--json",
        "--tokens",
        "24",
        "--threads",
        "2",
        "--draft",
        draft.to_str().unwrap(),
        "--draft-max",
        "4",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("draft model:"), "{stderr}");
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let ours = ids(&out["token_ids"]);
    assert_eq!(ours[..], ids(&case["greedy_ids"])[..ours.len()]);
    let spec = &out["timings"]["speculation"];
    assert!(spec["accepted_tokens"].as_u64().unwrap() > 0, "{spec}");

    // Qwen's vocabulary is not SmolLM2's: refused before anything runs, naming both sizes.
    let qwen = m.join("qwen2.5-coder-0.5b-instruct-q4_0.gguf");
    let (ok, _, stderr) = lean(&[
        "--model",
        model.to_str().unwrap(),
        "-p",
        "Hi",
        "--draft",
        qwen.to_str().unwrap(),
    ]);
    assert!(!ok, "a draft model with another vocabulary ran");
    assert!(
        stderr.contains("--draft") && stderr.contains("151936 tokens, the model's 49152"),
        "{stderr}"
    );
    // --draft-max needs --draft; --draft and --lookup are one or the other.
    let (ok, _, _) = lean(&[
        "--model",
        model.to_str().unwrap(),
        "-p",
        "Hi",
        "--draft-max",
        "3",
    ]);
    assert!(!ok);
    let (ok, _, _) = lean(&[
        "--model",
        model.to_str().unwrap(),
        "-p",
        "Hi",
        "--lookup",
        "3",
        "--draft",
        draft.to_str().unwrap(),
    ]);
    assert!(!ok);
}

#[test]
fn tools_and_a_forced_call_print_openai_tool_calls() {
    let Some(m) = models() else { return };
    let schema = serde_json::json!({"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false});
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city", "parameters": schema}}]);
    let dir = std::env::temp_dir().join(format!("lean-cli-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tools_file = dir.join("tools.json");
    std::fs::write(&tools_file, tools.to_string()).unwrap();
    let tools_path = tools_file.to_str().unwrap();
    // SmolLM2: lean's fallback (its template has no tools); Qwen2.5: its Hermes template.
    for file in [
        "smollm2-135m-instruct-q4_0.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
    ] {
        let model = m.join(file);
        let model = model.to_str().unwrap();
        let base = [
            "--model",
            model,
            "--tokenizer",
            "gguf",
            "--threads",
            "2",
            "--tokens",
            "60",
            "-p",
            "What is the weather like in Paris?",
            "--tools",
            tools_path,
        ];
        let (ok, stdout, stderr) =
            lean(&[&base[..], &["--tool-choice", "get_weather", "--json"]].concat());
        assert!(ok, "{file}: {stderr}");
        let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(out["finish_reason"], "tool_calls", "{file}: {out}");
        assert!(out["content"].is_null(), "{file}: {out}");
        let call = &out["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "get_weather");
        let arguments: serde_json::Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            jsonschema::is_valid(&schema, &arguments),
            "{file}: {arguments}"
        );

        // Streamed: the call's text is held back; the calls come as the last line.
        let (ok, stdout, stderr) = lean(&[&base[..], &["--tool-choice", "required"]].concat());
        assert!(ok, "{file}: {stderr}");
        assert!(stderr.contains("finish: tool_calls"), "{file}: {stderr}");
        let last: serde_json::Value =
            serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
        assert_eq!(
            last["tool_calls"][0]["function"]["name"], "get_weather",
            "{stdout}"
        );
        assert!(!stdout.contains("<tool_call>"), "{stdout}");
    }

    // The call and its result go back through --messages; the model answers.
    let messages = dir.join("messages.json");
    std::fs::write(&messages, serde_json::json!([
        {"role": "user", "content": "What is the weather like in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"},
    ]).to_string()).unwrap();
    let model = m.join("qwen2.5-coder-0.5b-instruct-q4_0.gguf");
    let (ok, stdout, stderr) = lean(&[
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        "gguf",
        "--threads",
        "2",
        "--tokens",
        "8",
        "--messages",
        messages.to_str().unwrap(),
        "--tools",
        tools_path,
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(!out["token_ids"].as_array().unwrap().is_empty(), "{out}");

    // Bad choices and files name the problem.
    for (args, want) in [
        (vec!["--tool-choice", "get_time"], "get_time"),
        (
            vec!["--tool-choice", "required", "--json-object"],
            "cannot be combined",
        ),
        (vec!["--raw"], "--raw"),
    ] {
        let (ok, _, stderr) = lean(
            &[
                &[
                    "--model",
                    model.to_str().unwrap(),
                    "--tokenizer",
                    "gguf",
                    "-p",
                    "hi",
                    "--tools",
                    tools_path,
                ][..],
                &args[..],
            ]
            .concat(),
        );
        assert!(!ok && stderr.contains(want), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
