#!/usr/bin/env python3
"""Write rust/lean-tokenizer/tests/data/tiny-sentencepiece.gguf: a small SentencePiece (BPE with
byte fallback) vocabulary as llama.cpp's converter stores it, for lean's GGUF tokenizer tests.

general.architecture "llama", tokenizer.ggml.model "llama", no merges: the tokenizer is rebuilt
from the scores (transformers' `generate_merges`). The vocabulary is learned here by a few hundred
steps of plain BPE over the words of tests/data/corpus.json (each word starting with "\u2581", as
SentencePiece writes a space), so the corpus tokenizes into real multi-character pieces:

  0 <unk> (unknown)  1 <s>  2 </s> (control)  3..258 <0x00>..<0xFF> (byte)
  then the merged pieces, best first, then the single characters, then a few odd ones:
  whitespace tokens spelled with real spaces ("  ", as Gemma files store them), controls "<pad>"
  and "<mask>", a user-defined "<think>", a control "<|end|>", and a second "\u2581the" (a
  repeated spelling: the later id wins).

The tests also build the tokenizer of this vocabulary under general.architecture "phi3" and
"gemma3" (scripts/gen_sentencepiece_fixtures.py rewrites the key with gguf-py).

Scores fall by one every two pieces, so equal scores occur and their order matters. No tensors
(gguf-py writes a metadata-only file). Deterministic; the file is committed.

usage: ~/.cache/lean/venv/bin/python scripts/gen_sentencepiece_gguf.py
"""
import collections
import json
import os

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "rust", "lean-tokenizer", "tests", "data")
OUT = os.path.join(DATA, "tiny-sentencepiece.gguf")

MERGES = 520  # merged pieces learned
CHARS = 140  # most frequent characters kept as pieces (the rest fall back to bytes)
MAX_WORD = 16  # longer words are not learned from
SPACE = "\u2581"

# llama.cpp's llama_token_type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def words(corpus):
    """SentencePiece's view of the text: spaces as \u2581, a word = a \u2581 and what follows."""
    counts = collections.Counter()
    for text in corpus:
        text = SPACE + text.replace(" ", SPACE)
        start = 0
        for i in range(1, len(text) + 1):
            if i == len(text) or text[i] == SPACE:
                counts[text[start:i]] += 1
                start = i
    return counts


def learn(counts, alphabet):
    """Plain BPE: merge the most frequent adjacent pair (ties: first seen), MERGES times."""
    # Long words are the corpus's repeats ("aaaa..."): left out, they would fill the vocabulary.
    seqs = {w: [c if c in alphabet else None for c in w] for w in counts if len(w) <= MAX_WORD}
    pieces = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, seq in seqs.items():
            for pair in dict.fromkeys(zip(seq, seq[1:])):  # once per word: repeats do not win
                if None not in pair:
                    pairs[pair] += counts[w]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda item: item[1])  # first maximal: insertion order
        merged = a + b
        pieces.append(merged)
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    return pieces


def main():
    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    counts = words(corpus)
    chars = collections.Counter()
    for w, n in counts.items():
        for c in w:
            chars[c] += n
    # Most frequent first, ties by code point: deterministic.
    alphabet = [c for c, _ in sorted(chars.items(), key=lambda item: (-item[1], item[0]))[:CHARS]]
    alphabet = [c for c in alphabet if c.isprintable() or c == SPACE]
    merged = learn(counts, set(alphabet))

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for rank, piece in enumerate(merged + [c for c in alphabet if c not in merged]):
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(-float(rank // 2))
    # Whitespace stored as it reads, as Gemma files do; the gemma builders respell it as \u2581s.
    for piece in ("  ", "   ", "\u3000 ", "\t \t"):
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(-float(len(tokens)))
    # <pad> and <mask>: GemmaTokenizer adds them when missing, so a Gemma vocabulary has them.
    odd = [("<pad>", CONTROL), ("<mask>", CONTROL), ("<think>", USER_DEFINED), ("<|end|>", CONTROL)]
    for piece, ty in odd + [(SPACE + "the", NORMAL)]:
        assert ty != NORMAL or piece in tokens, piece
        tokens.append(piece)
        types.append(ty)
        scores.append(0.0 if ty != NORMAL else -float(len(tokens)))

    writer = gguf.GGUFWriter(OUT, arch="llama", use_temp_file=False)
    writer.add_name("tiny sentencepiece")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{OUT}: {len(tokens)} tokens, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
