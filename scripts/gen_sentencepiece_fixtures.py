#!/usr/bin/env python3
"""transformers' ids for the tokenizer corpus through SentencePiece ("llama") GGUF vocabularies.

lean builds a GGUF's tokenizer from its metadata as transformers' `from_pretrained(dir,
gguf_file=...)` does. This writes rust/lean-tokenizer/tests/data/sentencepiece-ids.json,
{"<case>": {"ids": [[...]], "ids_with_special": [[...]], "decoded": [...],
"decoded_with_special": [...]}} (one case a line) with, for each string s of corpus.json,

  ids[i]                  = tok(s, add_special_tokens=False)["input_ids"]
  ids_with_special[i]     = tok(s, add_special_tokens=True)["input_ids"]
  decoded[i]              = tok.decode(ids[i]), or null where that is s itself
  decoded_with_special[i] = tok.decode(ids_with_special[i])

tok = AutoTokenizer.from_pretrained(dir, gguf_file=name). The cases:
  * "tiny-sentencepiece.gguf" (tests/data, from scripts/gen_sentencepiece_gguf.py): arch "llama";
  * "tiny-sentencepiece.gguf as phi3", "tiny-sentencepiece.gguf as gemma3": the same file with
    general.architecture rewritten (written to a temporary directory), for transformers'
    phi3_tokenizer and gemma_tokenizer;
  * "gemma-3-270m-q4_k_m.gguf" (MODELS_DIR, from scripts/fetch-test-models.sh): arch "gemma3",
    262,144 tokens and no merges. Where MODELS_DIR has its converted tokenizer directory
    (gemma-3-270m/, what `derive_test_models.py tokenizer` writes), the results are checked to be
    the ones that directory gives too.

transformers is imported without torch as derive_test_models.py does.

usage: ~/.cache/lean/venv/bin/python scripts/gen_sentencepiece_fixtures.py [MODELS_DIR]
       (MODELS_DIR defaults to $LEAN_MODELS, else ~/.cache/lean/models)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "rust", "lean-tokenizer", "tests", "data")
sys.path.insert(0, HERE)

from derive_test_models import _import_transformers_gguf_without_torch  # noqa: E402

_import_transformers_gguf_without_torch()
from transformers import AutoTokenizer  # noqa: E402


TINY = "tiny-sentencepiece.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"
VARIANTS = ["phi3", "gemma3"]


def reference(tok, corpus):
    ids = [tok(s, add_special_tokens=False)["input_ids"] for s in corpus]
    ids_special = [tok(s, add_special_tokens=True)["input_ids"] for s in corpus]
    decoded = [tok.decode(x) for x in ids]
    return {
        "ids": ids,
        "ids_with_special": ids_special,
        "decoded": [None if d == s else d for d, s in zip(decoded, corpus)],
        "decoded_with_special": [tok.decode(x) for x in ids_special],
    }


def with_architecture(src, dst, arch):
    """A copy of the GGUF `src` whose general.architecture is `arch`."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=arch, use_temp_file=False)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    import tempfile

    if len(sys.argv) > 1:
        models_dir = sys.argv[1]
    else:
        models_dir = os.environ.get("LEAN_MODELS") or os.path.expanduser("~/.cache/lean/models")
    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    if not os.path.isfile(os.path.join(models_dir, GEMMA)):
        sys.exit(f"{os.path.join(models_dir, GEMMA)} is missing (run scripts/fetch-test-models.sh)")

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(TINY, DATA, TINY, None)]
        for arch in VARIANTS:
            with_architecture(os.path.join(DATA, TINY), os.path.join(tmp, f"{arch}.gguf"), arch)
            cases.append((f"{TINY} as {arch}", tmp, f"{arch}.gguf", None))
        cases.append((GEMMA, models_dir, GEMMA, "gemma-3-270m"))
        for case, directory, name, converted in cases:
            tok = AutoTokenizer.from_pretrained(os.path.abspath(directory), gguf_file=name)
            result = reference(tok, corpus)
            out[case] = result
            print(
                f"{case} ({type(tok).__name__}): {sum(map(len, result['ids']))} ids, "
                f"{sum(d is not None for d in result['decoded'])} of {len(corpus)} do not round-trip"
            )
            if converted and os.path.isfile(os.path.join(directory, converted, "tokenizer.json")):
                saved = reference(AutoTokenizer.from_pretrained(os.path.join(directory, converted)), corpus)
                differ = [k for k in result if result[k] != saved[k]]
                if differ:
                    sys.exit(f"{case}: the GGUF and {converted}/ give different {', '.join(differ)}")
                print(f"  {converted}/ gives the same ids and decodes")

    path = os.path.join(DATA, "sentencepiece-ids.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write(
            ",\n".join(
                json.dumps(k) + ":" + json.dumps(v, separators=(",", ":"), ensure_ascii=False) for k, v in out.items()
            )
        )
        f.write("\n}\n")
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == out, "sentencepiece-ids.json does not read back equal"
    print(f"wrote {path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
