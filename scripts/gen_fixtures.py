#!/usr/bin/env python3
"""Reference fixtures: HF transformers in float32 on each test GGUF's dequantized weights.

Run by hand (needs torch, which CI never installs), after scripts/fetch-test-models.sh:
    python scripts/gen_fixtures.py [MODELS_DIR]     → fixtures/hf/<model>.json

For every model file × prompt it records:
  prompt_ids      the prompt's token ids (chat prompts through the tokenizer's chat template)
  greedy_ids      greedy continuation (argmax at every step, KV cache, no stop on EOS)
  steps           per generated step: top-k ids and logits, and margin = top1 - top2 logit
  positions       teacher-forced over prompt + greedy ids in one forward pass: per position the
                  top-k ids and logits (the reference for batched prefill)
Near-ties (margin < 0.01) are where a float32 summation-order difference can flip a token; the
margins are kept so a failing test can say which kind of failure it is.
"""
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TOPK = 8

MODELS = [
    # (gguf file, tokenizer dir)
    ("smollm2-135m-instruct-q4_1.gguf", "smollm2-135m-instruct"),
    ("smollm2-135m-instruct-q4_0.gguf", "smollm2-135m-instruct"),
    ("smollm2-135m-instruct-q8_0.gguf", "smollm2-135m-instruct"),
    ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct"),
    ("qwen2.5-coder-0.5b-instruct-q4_0.gguf", "qwen2.5-coder-0.5b-instruct"),
]

LONG_TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines were "
    "programmed by rewiring plugboards; later, stored-program computers let instructions live in the same "
    "memory as data. Assembly languages gave mnemonic names to machine operations, and compilers for "
    "FORTRAN and COBOL let scientists and business programmers describe what they wanted in notation closer "
    "to their own problems. Operating systems arrived to share expensive hardware among many users, first "
    "through batch queues and then through time-sharing, which made interactive computing possible. The "
    "microprocessor put an entire central processing unit on a single chip, and personal computers brought "
    "that power to homes and small offices. Networking then connected those machines: local networks in "
    "offices and universities, and eventually the global internet, whose simple packet-switching design "
    "proved remarkably adaptable. The world wide web layered hypertext on top of the internet, and search "
    "engines made its vast contents navigable. Mobile phones became general-purpose computers that fit in a "
    "pocket, with sensors, cameras and always-on connectivity. Meanwhile, graphics processors designed for "
    "games turned out to be excellent at the dense linear algebra behind neural networks, and large language "
    "models trained on enormous text corpora began to write, summarize and translate. Each step hid the "
    "complexity beneath it, so that people could think about their problems instead of the machine."
)

PROMPTS = [
    # (name, kind, content, new tokens)
    ("chat_short", "chat", [{"role": "user", "content": "What is the capital of France?"}], 40),
    ("chat_system", "chat", [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ], 40),
    ("chat_long", "chat", [{"role": "user", "content": "Summarize this text in three bullet points:\n\n" + LONG_TEXT}], 32),
    ("chat_multiturn", "chat", [
        {"role": "user", "content": "Write a Python function that reverses a string."},
        {"role": "assistant", "content": "def reverse(s):\n    return s[::-1]"},
        {"role": "user", "content": "Now make it handle None by returning an empty string."},
    ], 40),
    ("raw_short", "raw", "The quick brown fox", 40),
    ("raw_code", "raw", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", 40),
]


def topk(logits: torch.Tensor):
    v, i = torch.topk(logits, TOPK)
    return [int(x) for x in i], [float(x) for x in v]


def main() -> None:
    models_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "models"))
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf")
    os.makedirs(out_dir, exist_ok=True)
    torch.set_grad_enabled(False)
    for gguf_file, tok_dir in MODELS:
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, tok_dir))
        model = AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=gguf_file, dtype=torch.float32)
        model.eval()
        cases = []
        for name, kind, content, n_new in PROMPTS:
            if kind == "chat":
                text = tok.apply_chat_template(content, tokenize=False, add_generation_prompt=True)
                ids = tok(text, add_special_tokens=False)["input_ids"]
            else:
                text = content
                ids = tok(text)["input_ids"]
            input_ids = torch.tensor([ids])
            out = model(input_ids, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
            greedy, steps = [], []
            for _ in range(n_new):
                ti, tv = topk(logits)
                steps.append({"top_ids": ti, "top_logits": tv, "margin": tv[0] - tv[1]})
                nxt = ti[0]
                greedy.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1]
            full = model(torch.tensor([ids + greedy])).logits[0]
            positions = []
            for p in range(full.shape[0]):
                ti, tv = topk(full[p])
                positions.append({"top_ids": ti, "top_logits": tv})
            cases.append({
                "name": name, "kind": kind, "messages" if kind == "chat" else "prompt": content,
                "prompt_text": text, "prompt_ids": ids, "greedy_ids": greedy,
                "greedy_text": tok.decode(greedy), "steps": steps, "positions": positions,
            })
            print(f"{gguf_file} {name}: {len(ids)} prompt tokens, min margin "
                  f"{min(s['margin'] for s in steps):.4f}: {tok.decode(greedy)!r}", flush=True)
        doc = {
            "model": gguf_file, "tokenizer": tok_dir, "reference": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, float32",
            "topk": TOPK, "cases": cases,
        }
        path = os.path.join(out_dir, gguf_file.replace(".gguf", ".json"))
        with open(path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        print(f"wrote {path} in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
