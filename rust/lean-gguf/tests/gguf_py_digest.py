"""Reference digests of GGUF files as gguf-py reads them, for tests/real_models.rs.

Both sides serialise everything they parsed (version, alignment, data offset, every metadata
value bit for bit, every tensor's name, type, dims, offset and size) in the same canonical form
and hash it with 64-bit FNV-1a. Usage:
    python gguf_py_digest.py FILE...        # prints "<digest> <file>"
    python gguf_py_digest.py --dump FILE    # writes the canonical form to stdout, for diffing
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType


def encode_value(field, types, idx_iter):
    vtype = types[0]
    if vtype == GGUFValueType.ARRAY:
        raise AssertionError("nested arrays are handled by the caller")
    part = field.parts[next(idx_iter)]
    tid = int(vtype)
    if vtype == GGUFValueType.STRING:
        raw = bytes(part)
        return f"{tid}:{len(raw)}:".encode() + raw
    if vtype == GGUFValueType.FLOAT32:
        return f"{tid}:{int(part.view(np.uint32)[0]):08x}".encode()
    if vtype == GGUFValueType.FLOAT64:
        return f"{tid}:{int(part.view(np.uint64)[0]):016x}".encode()
    return f"{tid}:{int(part[0])}".encode()


def canonical(path):
    reader = GGUFReader(path)
    version = int(reader.fields["GGUF.version"].parts[-1][0])
    out = [f"version {version}\nalignment {reader.alignment}\ndata_offset {reader.data_offset}\n".encode()]
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        idx_iter = iter(field.data)
        if field.types[0] == GGUFValueType.ARRAY:
            items = [encode_value(field, field.types[1:], idx_iter) for _ in field.data]
            enc = f"9:{len(items)}[".encode() + b" ".join(items) + b"]"
        else:
            enc = encode_value(field, field.types, idx_iter)
        out.append(b"kv " + key.encode() + b" " + enc + b"\n")
    for t in reader.tensors:
        dims = ",".join(str(int(d)) for d in t.shape)
        out.append(f"tensor {t.name} {int(t.tensor_type)} {dims} {t.data_offset} {t.n_bytes}\n".encode())
    return b"".join(out)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


if __name__ == "__main__":
    if sys.argv[1] == "--dump":
        sys.stdout.buffer.write(canonical(sys.argv[2]))
    else:
        for path in sys.argv[1:]:
            print(f"{fnv1a64(canonical(path)):016x} {path}")
