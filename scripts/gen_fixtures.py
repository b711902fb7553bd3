#!/usr/bin/env python3
"""Reference fixtures: HF transformers in float32 on each test GGUF's dequantized weights.

Run by hand (needs torch, which CI never installs), after scripts/fetch-test-models.sh:
    python scripts/gen_fixtures.py [MODELS_DIR] [--only NAME ...]   → fixtures/hf/<model>.json
(--only: a model file name, with or without .gguf, or a prefix of it; default: the first five,
 the models that transformers' own GGUF loader reads.)

How the reference model is built depends on the file:
  transformers' GGUF loader            SmolLM2, Qwen2.5 and Gemma 3 (checked against loading the
                                        dequantized tensors by hand into the true config, below)
  the true HF config + the GGUF's      the random-weight Llama 3.2 / Qwen3 files of
  dequantized tensors                   scripts/make_test_models.py (transformers' loader would
                                        drop Llama 3.2's llama3 rope scaling: the GGUF holds it as
                                        rope_freqs.weight); the llama Q/K row permutation is undone
                                        as transformers' loader does

For every model file × prompt it records:
  prompt_ids      the prompt's token ids (chat prompts through the tokenizer's chat template)
  greedy_ids      greedy continuation (argmax at every step, KV cache, no stop on EOS)
  steps           per generated step: top-k ids and logits, and margin = top1 - top2 logit
  positions       teacher-forced over prompt + greedy ids in one forward pass: per position the
                  top-k ids and logits (the reference for batched prefill)
and, for a file whose chat template asks strftime_now for the date (Llama 3.2), template_time: the
Unix time (UTC) the chat prompts were rendered at (TEMPLATE_TIME; the engine must be pinned to it).
Near-ties (margin < 0.01) are where a float32 summation-order difference can flip a token; the
margins are kept so a failing test can say which kind of failure it is.
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_test_models  # noqa: E402  (the random models' true configs)

TOPK = 8

MODELS = [
    # (gguf file, tokenizer dir, how the reference is built, prompt set)
    ("smollm2-135m-instruct-q4_1.gguf", "smollm2-135m-instruct", "gguf", "default"),
    ("smollm2-135m-instruct-q4_0.gguf", "smollm2-135m-instruct", "gguf", "default"),
    ("smollm2-135m-instruct-q8_0.gguf", "smollm2-135m-instruct", "gguf", "default"),
    ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct", "gguf", "default"),
    ("qwen2.5-coder-0.5b-instruct-q4_0.gguf", "qwen2.5-coder-0.5b-instruct", "gguf", "default"),
    ("llama-3.2-1b-random-q4_0.gguf", "llama-3.2", "llama", "random"),
    ("llama-3.2-1b-random-q8_0.gguf", "llama-3.2", "llama", "random"),
    ("qwen3-0.6b-random-q4_0.gguf", "qwen2.5-coder-0.5b-instruct", "qwen3", "random"),
    ("qwen3-0.6b-random-q8_0.gguf", "qwen2.5-coder-0.5b-instruct", "qwen3", "random"),
    ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m", "gemma3", "gemma3"),
]
DEFAULT_MODELS = 5

# The time that templates' strftime_now sees (Llama 3.2's prints "Today Date: 26 Jul 2024"); a
# fixture whose template asks for it records it as "template_time" (Unix seconds, UTC).
TEMPLATE_TIME = 1721952000

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

# Random-weight models: a few raw prompts and chats, shorter greedy runs.
RANDOM_PROMPTS = [
    ("raw_short", "raw", "The quick brown fox", 20),
    ("raw_code", "raw", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", 20),
    ("raw_long", "raw", LONG_TEXT, 16),
    ("chat_short", "chat", [{"role": "user", "content": "What is the capital of France?"}], 20),
    ("chat_system", "chat", [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ], 20),
]

# Gemma 3 270M is a base model without a chat template: the raw prompts, and one longer than its
# 512-token sliding window.
GEMMA3_PROMPTS = [p for p in PROMPTS if p[1] == "raw"] + [
    ("raw_sliding_window", "raw", "\n\n".join([LONG_TEXT] * 3), 24),
]

PROMPT_SETS = {"default": PROMPTS, "random": RANDOM_PROMPTS, "gemma3": GEMMA3_PROMPTS}


class _PinnedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.fromtimestamp(TEMPLATE_TIME, tz or datetime.timezone.utc).replace(tzinfo=tz)


def _pin_template_time() -> None:
    import transformers.utils.chat_template_utils as ctu

    ctu.datetime = _PinnedDatetime


def gguf_tensors(path: str):
    """name → dequantized float32 array (numpy order) of every tensor of a GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's llama Q/K row permutation (transformers' LlamaTensorProcessor)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


HF_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GEMMA3_NAMES = {**HF_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


def hf_state_dict(tensors: dict, kind: str, cfg) -> dict:
    """The GGUF's tensors under Hugging Face names, as convert_hf_to_gguf.py's inverse."""
    names = GEMMA3_NAMES if kind == "gemma3" else HF_NAMES
    sd = {}
    for name, w in tensors.items():
        if name == "rope_freqs.weight":
            continue  # HF computes the llama3 frequencies from rope_scaling
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        else:
            _, b, part, _ = name.split(".")
            hf = f"model.layers.{b}.{names[part]}.weight"
            if kind == "llama" and part == "attn_q":
                w = reverse_permute(w, cfg.num_attention_heads)
            elif kind == "llama" and part == "attn_k":
                w = reverse_permute(w, cfg.num_key_value_heads)
        if kind == "gemma3" and name.endswith("norm.weight"):
            w = w - 1  # the converter stores Gemma's RMSNorm weights + 1
        sd[hf] = torch.from_numpy(np.ascontiguousarray(w))
    return sd


def gemma3_270m_config():
    """google/gemma-3-270m's config.json (text model)."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling=None, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
        attention_bias=False, attn_logit_softcapping=None, final_logit_softcapping=None,
        use_bidirectional_attention=False, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )


def build_from_gguf_tensors(path: str, kind: str):
    """An HF model of the true config with the GGUF's dequantized tensors."""
    from transformers import Gemma3ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if kind == "llama":
        cfg, cls = LlamaConfig(**make_test_models.LLAMA_3_2), LlamaForCausalLM
    elif kind == "qwen3":
        cfg, cls = Qwen3Config(**make_test_models.QWEN3), Qwen3ForCausalLM
    else:
        cfg, cls = gemma3_270m_config(), Gemma3ForCausalLM
    cfg._attn_implementation = "eager"
    model = cls(cfg).to(torch.float32)
    missing, unexpected = model.load_state_dict(hf_state_dict(gguf_tensors(path), kind, cfg), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def load_reference(models_dir: str, gguf_file: str, kind: str):
    """(model, description of how it was built)."""
    if kind == "gguf":
        model = AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=gguf_file, dtype=torch.float32)
        how = "float32"
    elif kind == "gemma3":
        model = AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=gguf_file, dtype=torch.float32,
                                                     attn_implementation="eager")
        check = build_from_gguf_tensors(os.path.join(models_dir, gguf_file), kind)
        _check_same_logits(model, check)
        how = ("float32, eager attention; transformers' GGUF loader (Gemma3ForCausalLM), checked equal to "
               "google/gemma-3-270m's config with the GGUF's dequantized tensors (norm weights - 1)")
    else:
        model = build_from_gguf_tensors(os.path.join(models_dir, gguf_file), kind)
        cls = type(model).__name__
        true = "Llama-3.2-1B's config (2 layers, rope_scaling llama3)" if kind == "llama" else "Qwen3-0.6B's config (2 layers)"
        how = (f"float32, eager attention; {cls} of {true} with the GGUF's dequantized tensors"
               + (" (Q/K row permutation undone as transformers' GGUF loader does)" if kind == "llama" else ""))
    model.eval()
    return model, how


def _check_same_logits(a, b) -> None:
    ids = torch.tensor([[2] + list(range(1000, 1700))])  # past the 512 sliding window
    la, lb = a(ids).logits, b(ids).logits
    err = (la - lb).abs().max().item()
    print(f"  transformers' GGUF loader vs the dequantized tensors in the true config: max |logit diff| {err:.2e}")
    assert err < 1e-4, err


def topk(logits: torch.Tensor):
    v, i = torch.topk(logits, TOPK)
    return [int(x) for x in i], [float(x) for x in v]


def selected(only: list[str]):
    if not only:
        return MODELS[:DEFAULT_MODELS]
    out = []
    for m in MODELS:
        if any(m[0] == o or m[0] == o + ".gguf" or m[0].startswith(o) for o in only):
            out.append(m)
    missing = [o for o in only if not any(m[0] == o or m[0] == o + ".gguf" or m[0].startswith(o) for m in MODELS)]
    if missing:
        sys.exit(f"gen_fixtures: no model matches {missing}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models_dir", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "models"))
    ap.add_argument("--only", action="append", default=[], help="model file (or prefix); repeatable")
    args = ap.parse_args()
    models_dir = os.path.abspath(args.models_dir)
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf")
    os.makedirs(out_dir, exist_ok=True)
    torch.set_grad_enabled(False)
    _pin_template_time()
    for gguf_file, tok_dir, build, prompt_set in selected(args.only):
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, tok_dir))
        model, how = load_reference(models_dir, gguf_file, build)
        template = getattr(tok, "chat_template", None) or ""
        cases = []
        for name, kind, content, n_new in PROMPT_SETS[prompt_set]:
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
        margins = sorted(s["margin"] for c in cases for s in c["steps"])
        pos_margins = sorted(p["top_logits"][0] - p["top_logits"][1] for c in cases for p in c["positions"])
        top = max(abs(v) for c in cases for p in c["positions"] for v in p["top_logits"])
        print(f"{gguf_file}: greedy margins min {margins[0]:.4f} median {margins[len(margins) // 2]:.4f}, "
              f"<0.05: {sum(m < 0.05 for m in margins)}/{len(margins)}; position margins min {pos_margins[0]:.4f} "
              f"median {pos_margins[len(pos_margins) // 2]:.4f}, <0.05: {sum(m < 0.05 for m in pos_margins)}/"
              f"{len(pos_margins)}; max |top logit| {top:.2f}", flush=True)
        doc = {
            "model": gguf_file, "tokenizer": tok_dir,
            "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, {how}",
            "topk": TOPK, "cases": cases,
        }
        if "strftime_now" in template and any(c["kind"] == "chat" for c in cases):
            doc["template_time"] = TEMPLATE_TIME
        path = os.path.join(out_dir, gguf_file.replace(".gguf", ".json"))
        with open(path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        print(f"wrote {path} in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
