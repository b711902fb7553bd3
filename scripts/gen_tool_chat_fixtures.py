#!/usr/bin/env python3
"""Reference renderings of chats with tools, tool calls and tool results through the test models'
chat templates, as transformers' `apply_chat_template(messages, tools=..., **kwargs)` renders them.

transformers (and torch) are not needed: this mirrors what `apply_chat_template` does with plain
jinja2 (transformers/utils/chat_template_utils.py, `_compile_jinja_template` and
`render_jinja_template`):
- an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension;
- the filter `tojson` = `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
  sort_keys=sort_keys)`, the globals `raise_exception` (raises TemplateError) and `strftime_now`;
- the context: `messages`, `tools` (None without tools), `documents` (None),
  `add_generation_prompt`, the tokenizer's special tokens (`special_tokens_map`: bos_token,
  eos_token, unk_token, pad_token… as strings), then the caller's kwargs.
The template and the special tokens come from each GGUF's metadata (`tokenizer.chat_template`,
`tokenizer.ggml.*_token_id` into `tokenizer.ggml.tokens`), as transformers' GGUF loader reads
them. Messages are dicts with only the keys a message has (`'tool_calls' in message` is false
for a plain one), `content` None for an assistant that only calls, arguments as dicts (HF's
convention; the templates `tojson` them).

    pip install jinja2
    python3 scripts/gen_tool_chat_fixtures.py [MODELS_DIR]   # default $LEAN_MODELS or ~/.cache/lean/models

writes rust/lean-tokenizer/tests/data/tool-chats.json, read by tests/tool_chats.rs (CI never
runs Python).
"""
import hashlib
import json
import os
import struct
import sys
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "rust/lean-tokenizer/tests/data/tool-chats.json"

# Every test model file family: the three whose templates take tools and two that do not
# (their renderings show that tools are ignored, which lean detects and replaces by its fallback).
MODELS = [
    "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
    "qwen3-0.6b-random-q4_0.gguf",
    "llama-3.2-1b-random-q4_0.gguf",
    "smollm2-135m-instruct-q4_0.gguf",
]
# (gemma-3-270m-q4_k_m.gguf has no tokenizer.chat_template in its metadata.)

# A fixed clock for strftime_now (Llama 3.x writes today's date without date_string).
PINNED_TIME = 1_721_952_000  # 2024-07-26 00:00:00 UTC


def read_gguf_metadata(path):
    """The GGUF header's key/value metadata (v2/v3), without the tensors."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos : pos + n].decode("utf-8")
        pos += n
        return s

    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(kind):
        if kind in scalars:
            return take(scalars[kind])
        if kind == 8:
            return string()
        if kind == 9:
            item = take("I")
            n = take("Q")
            return [value(item) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {kind}")

    assert data[:4] == b"GGUF", path
    pos = 4
    take("I")  # version
    take("Q")  # tensors
    count = take("Q")
    metadata = {}
    for _ in range(count):
        key = string()
        metadata[key] = value(take("I"))
    return metadata


def special_tokens(metadata):
    """transformers' special_tokens_map from a GGUF (its gguf loader's id keys)."""
    tokens = metadata["tokenizer.ggml.tokens"]
    names = [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("sep_token", "tokenizer.ggml.seperator_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ]
    return {name: tokens[metadata[key]] for name, key in names if key in metadata}


class AssistantTracker(jinja2.ext.Extension):
    """transformers' `{% generation %}` block (renders its body; only masks use it)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(PINNED_TIME, tz=timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_flights",
        "description": "Find flights between two airports",
        "parameters": {
            "type": "object",
            "properties": {
                "from": {"type": "string"},
                "to": {"type": "string"},
                "passengers": {"type": "integer", "minimum": 1},
                "flexible": {"type": "boolean"},
                "max_price": {"type": "number"},
                "stops": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["from", "to"],
            "additionalProperties": False,
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def call(name, arguments, id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if id is not None:
        c["id"] = id
    return c


def cases():
    ask = {"role": "user", "content": "What is the weather like in Zürich?"}
    system = {"role": "system", "content": "You are a travel assistant. Be brief."}
    weather_call = {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Zürich", "unit": "celsius"}, "call_1")]}
    weather_result = {"role": "tool", "content": "18 degrees, light rain", "tool_call_id": "call_1"}
    return [
        ("tools_question", [ask], [WEATHER], True, {}),
        ("tools_system_question", [system, ask], [WEATHER, SEARCH, NOW], True, {}),
        ("round_trip", [ask, weather_call, weather_result], [WEATHER], True, {}),
        (
            "round_trip_answered",
            [system, ask, weather_call, weather_result, {"role": "assistant", "content": "It is 18 °C with light rain."}],
            [WEATHER],
            False,
            {},
        ),
        (
            "two_calls_two_results",
            [
                {"role": "user", "content": "Weather in Oslo, and flights from OSL to ZRH for 2 under 300.5?"},
                {
                    "role": "assistant",
                    "content": "Let me check both.",
                    "tool_calls": [
                        call("get_weather", {"city": "Oslo"}, "call_a"),
                        call(
                            "search_flights",
                            {"from": "OSL", "to": "ZRH", "passengers": 2, "flexible": True, "max_price": 300.5, "stops": ["CPH", "FRA"]},
                            "call_b",
                        ),
                    ],
                },
                {"role": "tool", "content": "-3 degrees, snow", "tool_call_id": "call_a"},
                {"role": "tool", "content": '[{"flight": "SK1", "price": 250}]', "tool_call_id": "call_b", "name": "search_flights"},
            ],
            [WEATHER, SEARCH],
            True,
            {},
        ),
        ("no_argument_call", [{"role": "user", "content": "What time is it?"}, {"role": "assistant", "content": None, "tool_calls": [call("now", {})]}, {"role": "tool", "content": "12:00"}], [NOW], True, {}),
        ("calls_without_tools", [ask, weather_call, weather_result], None, True, {}),
    ]


def model_kwargs(model):
    if model.startswith("llama-3"):
        return [{"date_string": "26 Jul 2024"}, {"date_string": "26 Jul 2024", "tools_in_user_message": False}]
    if model.startswith("qwen3"):
        return [{}, {"enable_thinking": False}]
    return [{}]


def main():
    models_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LEAN_MODELS", Path.home() / ".cache/lean/models"))
    out = {"generator": "scripts/gen_tool_chat_fixtures.py", "jinja2": jinja2.__version__, "pinned_time": PINNED_TIME, "models": []}
    for model in MODELS:
        metadata = read_gguf_metadata(models_dir / model)
        source = metadata["tokenizer.chat_template"]
        template = compile_template(source)
        specials = special_tokens(metadata)
        renderings = []
        for name, messages, tools, add_generation_prompt, extra in cases():
            for kwargs in model_kwargs(model):
                kwargs = {**kwargs, **extra}
                context = {**specials, **kwargs}
                try:
                    rendered = template.render(
                        messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **context
                    )
                    error = None
                except Exception as e:  # raise_exception's TemplateError, or a TypeError (None + str)
                    rendered, error = None, f"{type(e).__name__}: {e}"
                renderings.append(
                    {
                        "name": name,
                        "messages": messages,
                        "tools": tools,
                        "add_generation_prompt": add_generation_prompt,
                        "kwargs": kwargs,
                        "rendered": rendered,
                        "error": error,
                    }
                )
        out["models"].append(
            {
                "file": model,
                "template_sha256": hashlib.sha256(source.encode()).hexdigest(),
                "renders_tools": any(c["rendered"] and "get_weather" in c["rendered"] and c["tools"] for c in renderings if c["name"] == "tools_question"),
                "special_tokens": specials,
                "cases": renderings,
            }
        )
        print(f"{model}: {len(renderings)} renderings, {sum(c['error'] is not None for c in renderings)} template errors")
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
