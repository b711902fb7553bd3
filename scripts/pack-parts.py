"""Packs the split pieces (NAME.NN) in DIR into DIR/part-NN folders of at most 55 MiB each, the
largest first, for uploads to the lent GPU machine (64 MiB a call, the tree included); the
device scripts join them by name there.  python3 scripts/pack-parts.py DIR"""
import os
import re
import shutil
import sys

d = sys.argv[1]
pieces = sorted((f for f in os.listdir(d) if re.search(r"\.\d\d$", f)),
                key=lambda f: -os.path.getsize(os.path.join(d, f)))
parts = []  # [room, [pieces]]
for f in pieces:
    size = os.path.getsize(os.path.join(d, f))
    part = next((p for p in parts if p[0] >= size), None)
    if part is None:
        part = [55 << 20, []]
        parts.append(part)
    part[0] -= size
    part[1].append(f)
for n, (_, files) in enumerate(parts):
    os.makedirs(os.path.join(d, "part-%02d" % n))
    for f in files:
        shutil.move(os.path.join(d, f), os.path.join(d, "part-%02d" % n))
