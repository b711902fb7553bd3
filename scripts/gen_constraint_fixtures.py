#!/usr/bin/env python3
"""Native expectations of constrained decoding, for the browser and lean-js tests.

    python3 scripts/gen_constraint_fixtures.py [MODELS_DIR]   → fixtures/constraint/<model>.json

Runs lean-cli (greedy, the chat template, `--json-schema`) on SmolLM2-135M for each case below
and records what it generated: token ids, text, finish reason. lean-js must give the same ids in
every browser and on every backend (tests/lean-js.spec.js, packages/lean-js/test/worker.test.ts).
Env: LEAN_CLI (default $CARGO_TARGET_DIR or target/, release/lean-cli; build it with
`cargo build --release -p lean-cli`).
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
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
COUNTRY = {"type": "string", "enum": ["France", "Germany", "Italy", "Spain"]}
CASES = [
    # Nested constraints on every field (bounded string, enum, boolean, bounded integer), ~35 tokens.
    {
        "name": "city",
        "messages": MESSAGES,
        "max_tokens": 64,
        "schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "country": COUNTRY,
                "is_capital": {"type": "boolean"},
                "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["city", "country", "is_capital", "population_millions"],
            "additionalProperties": False,
        },
    },
    # A dozen tokens: for the slow rows (software WebGPU).
    {
        "name": "country",
        "messages": MESSAGES,
        "max_tokens": 32,
        "schema": {
            "type": "object",
            "properties": {"country": COUNTRY},
            "required": ["country"],
            "additionalProperties": False,
        },
    },
]


def main() -> None:
    models = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LEAN_MODELS", REPO / "models"))
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    cli = os.environ.get("LEAN_CLI", str(target / "release" / "lean-cli"))
    out = {"model": MODEL, "tokenizer": TOKENIZER, "generated_by": "lean-cli --json-schema (greedy)", "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            schema = Path(tmp, "schema.json")
            schema.write_text(json.dumps(case["schema"]))
            messages = Path(tmp, "messages.json")
            messages.write_text(json.dumps(case["messages"]))
            run = subprocess.run(
                [cli, "-m", str(models / f"{MODEL}.gguf"), "--tokenizer", str(models / TOKENIZER),
                 "--messages", str(messages), "--json-schema", str(schema),
                 "-n", str(case["max_tokens"]), "--json", "-t", "1"],
                check=True, capture_output=True, text=True,
            )
            result = json.loads(run.stdout)
            out["cases"].append({
                **case,
                "prompt_ids": result["prompt_ids"],
                "token_ids": result["token_ids"],
                "text": result["text"],
                "finish_reason": result["finish_reason"],
            })
            print(f"{case['name']}: {len(result['token_ids'])} tokens, {result['finish_reason']}: {result['text']!r}")
    path = REPO / "fixtures" / "constraint" / f"{MODEL}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
