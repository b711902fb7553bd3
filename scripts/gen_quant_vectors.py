#!/usr/bin/env python3
"""Generates rust/lean-quant/tests/data/quant_vectors.json: blocks of every tensor type with
gguf-py's dequantization of them, as bit patterns, for lean-quant's bit-exactness tests.

Run with the project venv (gguf-py + numpy):
    ~/.cache/lean/venv/bin/python scripts/gen_quant_vectors.py
Real blocks come from the test models in $LEAN_MODELS (default: models/). The output is
deterministic: re-running it reproduces the same file.

Each vector: {"type", "source", "blocks", "bytes": hex of the raw blocks,
"expected": hex of the little-endian f32 values gguf.quants.dequantize returns}.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "rust/lean-quant/tests/data/quant_vectors.json"
MODELS = Path(os.environ.get("LEAN_MODELS", ROOT / "models"))
SEED = 20240607

QUANT_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the f16 scale fields in each block (d first, then m/dmin where present);
# random bytes there would be NaN/inf/huge, so they are written separately.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

RANDOM_BLOCKS = {"small": 96, "k": 32}  # per type, by block size (32 vs 256 elements)

# (model file, tensor types sampled from it); a couple of tensors per type.
REAL_MODELS = [
    ("smollm2-135m-instruct-q4_1.gguf", [T.Q4_1, T.Q8_0, T.F32]),
    ("smollm2-135m-instruct-q4_0.gguf", [T.Q4_0]),
    ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", [T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F32]),
]


def block_shape(qtype):
    return gguf.GGML_QUANT_SIZES[qtype]  # (elements, bytes)


def random_scales(rng, n):
    """f16 scales with |d| log-uniform in 1e-4..1 and a random sign."""
    mag = 10.0 ** rng.uniform(-4.0, 0.0, size=n)
    sign = rng.choice([-1.0, 1.0], size=n)
    return (mag * sign).astype(np.float16)


def set_f16(blocks, offset, values):
    blocks[:, offset:offset + 2] = np.asarray(values, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def scale_mask(qtype, block_bytes):
    """True for bytes that are not f16 scale fields."""
    mask = np.ones(block_bytes, dtype=bool)
    for off in F16_FIELDS[qtype]:
        mask[off:off + 2] = False
    return mask


def random_quant_vectors(rng, qtype):
    n_elems, n_bytes = block_shape(qtype)
    n = RANDOM_BLOCKS["small" if n_elems == 32 else "k"]
    out = []

    blocks = rng.integers(0, 256, size=(n, n_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        set_f16(blocks, off, random_scales(rng, n))
    out.append(("random", blocks))

    # Edge blocks: quant/scale bytes all zero and all ones, under positive and negative scales.
    mask = scale_mask(qtype, n_bytes)
    edges = []
    for fill in (0x00, 0xFF):
        for sign in (1.0, -1.0):
            b = np.zeros(n_bytes, dtype=np.uint8)
            b[mask] = fill
            edges.append((b, sign))
    edge_blocks = np.stack([b for b, _ in edges])
    for i, off in enumerate(F16_FIELDS[qtype]):
        # d = ±0.5, min/dmin = ±0.25: exact, so the expected values are easy to check by hand.
        set_f16(edge_blocks, off, [sign * (0.5 if i == 0 else 0.25) for _, sign in edges])
    out.append(("edge:zero-and-max-bytes", edge_blocks))

    # Extreme but finite scales (zero, negative zero, smallest subnormal, largest normal)
    # over random quants: the f16 -> f32 widening must be exact for all of them.
    extremes = np.array([0.0, -0.0, 2.0 ** -24, -(2.0 ** -24), 6.1e-5, 65504.0, -65504.0], dtype=np.float16)
    ext_blocks = rng.integers(0, 256, size=(len(extremes), n_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        set_f16(ext_blocks, off, extremes)
    out.append(("edge:extreme-scales", ext_blocks))
    return out


def special_floats(dtype):
    return np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.finfo(dtype).max, -np.finfo(dtype).max,
                     np.finfo(dtype).tiny, np.finfo(dtype).smallest_subnormal,
                     -np.finfo(dtype).smallest_subnormal], dtype=dtype)


def random_finite_bits(rng, n, bits, exp_mask):
    """Random bit patterns of a float format, rejecting NaN (inf stays in the specials)."""
    words = rng.integers(0, 1 << bits, size=4 * n, dtype=np.uint64)
    words = words[(words & exp_mask) != exp_mask][:n]
    assert len(words) == n
    return words


def random_float_vectors(rng):
    out = []
    f32 = random_finite_bits(rng, 256, 32, 0x7F800000).astype(np.uint32).view(np.float32)
    out.append((T.F32, "random", np.concatenate([special_floats(np.float32), f32]).view(np.uint8)))
    f16 = random_finite_bits(rng, 512, 16, 0x7C00).astype(np.uint16).view(np.float16)
    out.append((T.F16, "random", np.concatenate([special_floats(np.float16), f16]).view(np.uint8)))
    bf16 = random_finite_bits(rng, 512, 16, 0x7F80).astype(np.uint16)
    # bf16 specials: ±0, ±1, ±inf, largest, smallest normal and subnormal.
    bf16_specials = np.array([0x0000, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7F7F, 0xFF7F, 0x0080, 0x0001,
                              0x8001], dtype=np.uint16)
    out.append((T.BF16, "random", np.concatenate([bf16_specials, bf16]).view(np.uint8)))
    return out


def quantized_normal_vectors(rng):
    """Blocks produced by gguf-py's own quantizers from normal data: realistic quant patterns."""
    out = []
    for qtype, n_elems in [(T.Q4_0, 256), (T.Q4_1, 256), (T.Q5_0, 256), (T.Q5_1, 256), (T.Q8_0, 256),
                           (T.F16, 128), (T.BF16, 128)]:
        data = (rng.standard_normal(n_elems) * rng.uniform(0.01, 2.0)).astype(np.float32)
        raw = np.asarray(quantize(data, qtype)).view(np.uint8).reshape(-1)
        out.append((qtype, "quantized:normal", raw))
    return out


def real_vectors(rng):
    out = []
    for model, qtypes in REAL_MODELS:
        path = MODELS / model
        if not path.exists():
            sys.exit(f"missing test model {path} (set LEAN_MODELS or run scripts/fetch-test-models.sh)")
        reader = gguf.GGUFReader(path)
        for qtype in qtypes:
            tensors = [t for t in reader.tensors if t.tensor_type == qtype]
            # The first tensor of the type and one chosen at random.
            picks = [tensors[0]]
            if len(tensors) > 1:
                picks.append(tensors[1 + int(rng.integers(0, len(tensors) - 1))])
            for t in picks:
                n_elems, n_bytes = block_shape(qtype)
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                blocks = raw.reshape(-1, n_bytes)
                if qtype == T.F32:
                    # F32 "blocks" are single elements: take one run of 64 from the start.
                    chosen = blocks[:64]
                else:
                    first = blocks[:2]
                    rand = blocks[np.sort(rng.choice(np.arange(2, len(blocks)), size=3, replace=False))]
                    chosen = np.concatenate([first, rand])
                out.append((qtype, f"real:{model}:{t.name}", chosen.reshape(-1)))
    return out


def vector(qtype, source, raw):
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    n_elems, n_bytes = block_shape(qtype)
    assert raw.size % n_bytes == 0
    n_blocks = raw.size // n_bytes
    expected = np.asarray(dequantize(raw.reshape(1, -1), qtype), dtype=np.float32).reshape(-1)
    assert expected.size == n_blocks * n_elems
    return {
        "type": qtype.name,
        "source": source,
        "blocks": n_blocks,
        "bytes": raw.tobytes().hex(),
        "expected": expected.astype("<f4").tobytes().hex(),
    }


def main():
    rng = np.random.default_rng(SEED)
    vectors = []
    for qtype in QUANT_TYPES:
        for source, blocks in random_quant_vectors(rng, qtype):
            vectors.append(vector(qtype, source, blocks))
    for qtype, source, raw in random_float_vectors(rng):
        vectors.append(vector(qtype, source, raw))
    for qtype, source, raw in quantized_normal_vectors(rng):
        vectors.append(vector(qtype, source, raw))
    for qtype, source, raw in real_vectors(rng):
        vectors.append(vector(qtype, source, raw))

    OUT.parent.mkdir(parents=True, exist_ok=True)
    # One vector per line keeps diffs readable.
    lines = ",\n".join(json.dumps(v, sort_keys=True) for v in vectors)
    OUT.write_text(f'{{"generator": "scripts/gen_quant_vectors.py", "gguf": "{gguf_version()}", '
                   f'"seed": {SEED}, "vectors": [\n{lines}\n]}}\n')
    print(f"wrote {len(vectors)} vectors, {OUT.stat().st_size} bytes, to {OUT.relative_to(ROOT)}")


def gguf_version():
    from importlib.metadata import version
    return version("gguf")


if __name__ == "__main__":
    main()
