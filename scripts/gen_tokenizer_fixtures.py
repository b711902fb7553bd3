#!/usr/bin/env python3
"""Reference data for lean-tokenizer's tests, produced by HF transformers (no torch needed).

For each test model's tokenizer directory (models/<name>/, written by fetch-test-models.sh) this
writes rust/lean-tokenizer/tests/data/<name>.json with
  * texts: encode ids (add_special_tokens true and false) and decode results (skip_special_tokens
    false and true), all from AutoTokenizer.from_pretrained(dir);
  * random_ids: random id sequences (multi-byte pieces, special tokens) with their decodes;
  * chats: apply_chat_template(tokenize=False) text and apply_chat_template(tokenize=True) ids;
  * gguf_vocab: the GGUF's tokenizer.ggml.tokens count and sha256 (tokens joined by "\n"), read
    with gguf-py, so the tests can check their own GGUF reader; the lists themselves stay out of
    the repository (the tests read the GGUF files).

usage: ~/.cache/lean/venv/bin/python scripts/gen_tokenizer_fixtures.py [MODELS_DIR]
"""
import hashlib
import json
import os
import random
import sys

import gguf
from transformers import AutoTokenizer

MODELS = [
    # (tokenizer dir, GGUF file whose vocabulary it belongs to)
    ("smollm2-135m-instruct", "smollm2-135m-instruct-q4_1.gguf"),
    ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
]

TEXTS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "multiple   spaces    between     words",
    "       ",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "tabs\there\t\tand\t\t\tthere",
    "windows\r\nline\r\nendings",
    " \t \n mixed \n\t whitespace \t\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "1234567890 3.14159 -42 1e-9 0xDEADBEEF 1,000,000",
    "12345678901234567890123456789012345678901234567890",
    "I'm sure it's what they've said: we'll see, you'd know, THEY'RE HERE",
    "中文分词测试：你好，世界！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다",
    "Emoji: 😀🎉👍🏽 and family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Math 𝔸𝕓𝕔 𝑥² + 𝑦² = 𝑧² and ancient 𐍈𐌰",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308 (decomposed) vs é à ñ ö (precomposed)",
    "Zalgo: Z\u0351\u036b\u0343a\u0360\u0344l\u0309\u0366g\u0346o\u0352",
    "Ελληνικά και Русский текст и עברית وعربي",
    "<|im_start|>user\nhi<|im_end|>\n",
    "text with <|endoftext|> inside and <|im_end|>at the end",
    "<|im_start|><|im_start|><|im_end|>",
    "almost special <|im_start and im_end|> and < |im_end| >",
    "a" * 300,
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 4,
    "https://example.com/path/to/resource?query=value&other=123#fragment",
    "email: someone.special@example.org, phone: +1 (555) 123-4567",
    "JSON: {\"key\": [1, 2, {\"nested\": null}], \"flag\": true}",
    "punctuation!!! ??? ... --- ___ *** ~~~ ``` '''",
    "\u00a0non-breaking\u00a0spaces\u2003em\u2009thin\u200bzero-width",
    "ﬁ ligature, Ａｂｃ fullwidth, ① circled, Ⅻ roman",
    "mixed 中文 and English and 😀 emoji in one line",
    "\u200d\ufeffBOM and joiners\u200c",
]

CHATS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "user", "content": "Hello!"}], False),
    (
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        True,
    ),
    (
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a haiku about Rust."},
            {"role": "assistant", "content": "Borrow checker hums\nlifetimes braided, never freed\nsafe threads sing in peace"},
            {"role": "user", "content": "Now one about WebAssembly."},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "second"},
            {"role": "user", "content": "third"},
            {"role": "assistant", "content": "fourth"},
        ],
        False,
    ),
    ([{"role": "user", "content": ""}], True),
    (
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": "   spaces   and\n\nnewlines\n"},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "翻译成英文：你好，世界 😀 e\u0301"},
            {"role": "assistant", "content": "Hello, world 😀 é"},
            {"role": "user", "content": "Danke! <|im_end|> ist ein Spezialtoken."},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "def f(x):\n\treturn x  # tab-indented\n"},
            {"role": "system", "content": "A system message that is not first."},
        ],
        True,
    ),
]


def random_id_sequences(tok, count: int, seed: int) -> list[list[int]]:
    """Id sequences that split multi-byte characters across tokens and mix in special tokens."""
    rng = random.Random(seed)
    vocab_size = len(tok)
    special_ids = sorted(tok.all_special_ids)
    added_ids = sorted(tok.added_tokens_decoder)
    # Tokens that are a lone UTF-8 lead or continuation byte under the byte-level mapping.
    fragment_ids = [i for i in range(min(vocab_size, 50000)) if "\ufffd" in tok.decode([i])]
    sequences = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.35 and fragment_ids:
                ids.append(rng.choice(fragment_ids))
            elif r < 0.45:
                ids.append(rng.choice(special_ids + added_ids))
            else:
                ids.append(rng.randrange(vocab_size))
        sequences.append(ids)
    return sequences


def gguf_vocab(path: str) -> dict:
    reader = gguf.GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    digest = hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()
    return {"file": os.path.basename(path), "count": len(tokens), "sha256_newline_joined": digest}


def fixture(models_dir: str, name: str, gguf_file: str) -> dict:
    tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, name))
    texts = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        texts.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special": tok.encode(text, add_special_tokens=True),
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    random_ids = [
        {
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        }
        for ids in random_id_sequences(tok, 12, seed=len(name))
    ]
    chats = []
    for messages, add_generation_prompt in CHATS:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        ids = tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
        chats.append(
            {"messages": messages, "add_generation_prompt": add_generation_prompt, "rendered": rendered, "ids": ids}
        )
    return {
        "generated_by": "scripts/gen_tokenizer_fixtures.py",
        "tokenizer_dir": name,
        "vocab_size": len(tok),
        "special_tokens_map": tok.special_tokens_map,
        "texts": texts,
        "random_ids": random_ids,
        "chats": chats,
        "gguf_vocab": gguf_vocab(os.path.join(models_dir, gguf_file)),
    }


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    models_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LEAN_MODELS", os.path.join(here, "..", "models"))
    out_dir = os.path.join(here, "..", "rust", "lean-tokenizer", "tests", "data")
    os.makedirs(out_dir, exist_ok=True)
    for name, gguf_file in MODELS:
        data = fixture(models_dir, name, gguf_file)
        out = os.path.join(out_dir, f"{name}.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {out}: {len(data['texts'])} texts, {len(data['random_ids'])} random id sequences, "
              f"{len(data['chats'])} chats")


if __name__ == "__main__":
    main()
