#!/usr/bin/env python3
"""Check that scripts/make_test_models.py writes what llama.cpp's convert_hf_to_gguf.py writes.

Run by hand (needs torch and llama.cpp's source, which CI never has):
    python scripts/check_test_models_vs_converter.py LLAMA_CPP_DIR [MODELS_DIR]

For each random model (its Q8_0 file) it builds the Hugging Face model as scripts/gen_fixtures.py
does (the true config, the GGUF's dequantized tensors, the llama Q/K permutation undone), saves it
with save_pretrained next to the tokenizer files, runs the converter on that directory twice
(--outtype f32 and --outtype q8_0) and compares with our file:
  * metadata: every key and value, apart from general.* naming keys (name, basename, size_label,
    finetune, ...) and general.file_type (differs for f32 by design). Qwen3's tokenizer.* keys are
    copied from the Qwen2.5 GGUF, while the converter here reads qwen2.5-coder-0.5b-instruct/,
    which transformers rebuilt from that GGUF: their differences are listed, not counted (the
    rebuilt tokenizer.json holds the 271 unused ids [PAD151665].. as ordinary tokens, type 1
    instead of 5; the old converter's add_bos_token = false has no counterpart there)
  * tensors: names, order, shapes, types (q8_0 run), values: the f32 run equals our file
    dequantized, bit for bit; the q8_0 run's tensor bytes equal ours
Exit status 1 on any difference.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

NAMING_KEYS = ("general.name", "general.basename", "general.size_label", "general.finetune", "general.version",
               "general.file_type")
MODELS = [
    # (our file, tokenizer dir, kind, tokenizer metadata copied from another GGUF)
    ("llama-3.2-1b-random-q8_0.gguf", "llama-3.2", "llama", False),
    ("qwen3-0.6b-random-q8_0.gguf", "qwen2.5-coder-0.5b-instruct", "qwen3", True),
]


def fields(reader) -> dict:
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        v = field.contents()
        out[key] = (field.types[0].name, v)
    return out


def describe(key: str, a, b) -> str:
    if isinstance(a[1], list) and isinstance(b[1], list) and len(a[1]) == len(b[1]):
        idx = [i for i, (x, y) in enumerate(zip(a[1], b[1])) if x != y]
        return (f"{len(idx)} of {len(a[1])} entries differ, ids {idx[0]}..{idx[-1]}: "
                f"ours {[a[1][i] for i in idx[:3]]} converter {[b[1][i] for i in idx[:3]]}")
    return f"ours {str(a)[:120]} converter {str(b)[:120]}"


def compare(ours_path: str, conv_f32: str, conv_q8: str, tokenizer_copied: bool) -> list[str]:
    import gguf

    problems = []
    notes = []
    ours, f32, q8 = (gguf.GGUFReader(p) for p in (ours_path, conv_f32, conv_q8))
    fo, ff = fields(ours), fields(f32)
    for key in sorted(set(fo) | set(ff)):
        if key in NAMING_KEYS:
            continue
        sink = notes if tokenizer_copied and key.startswith("tokenizer.") else problems
        if key not in fo:
            sink.append(f"metadata {key}: only the converter writes it: {str(ff[key])[:120]}")
        elif key not in ff:
            sink.append(f"metadata {key}: only we write it: {str(fo[key])[:120]}")
        elif fo[key] != ff[key]:
            sink.append(f"metadata {key}: {describe(key, fo[key], ff[key])}")
    for n in notes:
        print(f"  expected (tokenizer copied from the Qwen2.5 GGUF): {n}")
    ko = [k for k in fo if k not in NAMING_KEYS]
    kf = [k for k in ff if k not in NAMING_KEYS]
    if ko != kf:
        (print if tokenizer_copied else problems.append)(
            f"  note: metadata key order differs\n    ours      {ko}\n    converter {kf}")
    print(f"  metadata: {len(fo)} keys ours, {len(ff)} converter; file types ours "
          f"{fo['general.file_type'][1]}, converter f32 {ff['general.file_type'][1]}, q8_0 {fields(q8)['general.file_type'][1]}")
    to, tf, tq = ([t.name for t in r.tensors] for r in (ours, f32, q8))
    if to != tf or to != tq:
        problems.append(f"tensor names/order differ:\n    ours      {to}\n    converter {tf}\n    q8_0      {tq}")
    by_f32 = {t.name: t for t in f32.tensors}
    by_q8 = {t.name: t for t in q8.tensors}
    for t in ours.tensors:
        if t.name not in by_f32:
            continue
        c, cq = by_f32[t.name], by_q8[t.name]
        if list(t.shape) != list(c.shape) or list(t.shape) != list(cq.shape):
            problems.append(f"{t.name}: shape ours {list(t.shape)} converter {list(c.shape)} / {list(cq.shape)}")
            continue
        if c.tensor_type != gguf.GGMLQuantizationType.F32:
            problems.append(f"{t.name}: converter f32 run wrote {c.tensor_type.name}")
        if t.tensor_type != cq.tensor_type:
            problems.append(f"{t.name}: type ours {t.tensor_type.name} converter q8_0 run {cq.tensor_type.name}")
        ours_values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).ravel()
        conv_values = np.asarray(c.data, dtype=np.float32).ravel()
        if ours_values.tobytes() != conv_values.tobytes():
            n = int(np.sum(ours_values != conv_values))
            problems.append(f"{t.name}: {n} values differ, max |diff| {np.max(np.abs(ours_values - conv_values)):.3g}")
        if np.asarray(t.data).tobytes() != np.asarray(cq.data).tobytes():
            problems.append(f"{t.name}: q8_0 bytes differ from the converter's")
    print(f"  tensors: {len(to)} ours, {len(tf)} converter; values and q8_0 bytes compared")
    return problems


def main() -> None:
    import torch

    import gen_fixtures

    llama_cpp = os.path.abspath(sys.argv[1])
    models_dir = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "models"))
    torch.set_grad_enabled(False)
    failed = False
    for gguf_file, tok_dir, kind, tokenizer_copied in MODELS:
        print(f"{gguf_file}:", flush=True)
        ours = os.path.join(models_dir, gguf_file)
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir = os.path.join(tmp, gguf_file.replace("-q8_0.gguf", ""))
            model = gen_fixtures.build_from_gguf_tensors(ours, kind)
            model.save_pretrained(hf_dir)
            del model
            for f in os.listdir(os.path.join(models_dir, tok_dir)):
                shutil.copy(os.path.join(models_dir, tok_dir, f), hf_dir)
            outs = {}
            for outtype in ("f32", "q8_0"):
                outs[outtype] = os.path.join(tmp, f"conv-{outtype}.gguf")
                r = subprocess.run([sys.executable, os.path.join(llama_cpp, "convert_hf_to_gguf.py"), hf_dir,
                                    "--outtype", outtype, "--outfile", outs[outtype]],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stdout[-3000:], r.stderr[-3000:])
                    sys.exit(f"convert_hf_to_gguf.py failed for {gguf_file}")
            problems = compare(ours, outs["f32"], outs["q8_0"], tokenizer_copied)
        for p in problems:
            print("  DIFFERENT", p)
        if not problems:
            print("  agrees with convert_hf_to_gguf.py")
        failed |= bool(problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
