#!/usr/bin/env python3
"""Native expectations of tool calls, for the browser and lean-js tests.

    python3 scripts/gen_tool_fixtures.py [MODELS_DIR]   → fixtures/tools/<model>.json

Runs lean-cli (greedy, the chat template, `--tools`, `--tool-choice`) on SmolLM2-135M, whose
template takes no tools (lean's fallback: the tools in the system message, Hermes
`<tool_call>` syntax), and records what it generated: prompt and token ids, text, finish reason,
content and tool calls (without their ids, which are new each time):
- `forced`: a call to `get_weather` forced by `tool_choice` (its arguments constrained to the
  schema);
- `round_trip`: that call and a tool result fed back (`role: "tool"`), the model's answer.
lean-js must give the same ids in every browser and on every backend (tests/lean-js.spec.js,
packages/lean-js/test/tools.test.ts). Env: LEAN_CLI (default $CARGO_TARGET_DIR or target/,
release/lean-cli; build it with `cargo build --release -p lean-cli`).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct-q4_0"
TOKENIZER = "smollm2-135m-instruct"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "The current time"}},
]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
CALL_ID = "call_0123456789abcdefghijklmn"
RESULT = '{"temperature": 22, "condition": "sunny"}'


def run(cli: str, models: Path, tmp: str, messages: list, choice: str, max_tokens: int) -> dict:
    messages_file = Path(tmp, "messages.json")
    messages_file.write_text(json.dumps(messages))
    tools_file = Path(tmp, "tools.json")
    tools_file.write_text(json.dumps(TOOLS))
    out = subprocess.run(
        [cli, "-m", str(models / f"{MODEL}.gguf"), "--tokenizer", str(models / TOKENIZER),
         "--messages", str(messages_file), "--tools", str(tools_file), "--tool-choice", choice,
         "-n", str(max_tokens), "--json", "-t", "1"],
        check=True, capture_output=True, text=True,
    )
    result = json.loads(out.stdout)
    return {
        "messages": messages,
        "tool_choice": choice,
        "max_tokens": max_tokens,
        "prompt_ids": result["prompt_ids"],
        "token_ids": result["token_ids"],
        "text": result["text"],
        "finish_reason": result["finish_reason"],
        "content": result["content"],
        "tool_calls": [{"type": c["type"], "function": c["function"]} for c in result["tool_calls"] or []],
    }


def main() -> None:
    models = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LEAN_MODELS", REPO / "models"))
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    cli = os.environ.get("LEAN_CLI", str(target / "release" / "lean-cli"))
    out = {"model": MODEL, "tokenizer": TOKENIZER, "generated_by": "lean-cli --tools --tool-choice --json (greedy)",
           "tools": TOOLS, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        forced = run(cli, models, tmp, QUESTION, "get_weather", 64)
        assert forced["finish_reason"] == "tool_calls", forced
        call = forced["tool_calls"][0]
        history = QUESTION + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": CALL_ID, "type": "function", "function": call["function"]}]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT},
        ]
        round_trip = run(cli, models, tmp, history, "auto", 48)
        for name, case in [("forced", forced), ("round_trip", round_trip)]:
            out["cases"].append({"name": name, **case})
            print(f"{name}: {len(case['token_ids'])} tokens, {case['finish_reason']}: {case['text']!r}")
    path = REPO / "fixtures" / "tools" / f"{MODEL}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
