#!/usr/bin/env bash
# Speculative decoding by prompt lookup, lean against llama.cpp side by side on this machine: issue
# 25's three tasks (rewrite a function, summarize a text, open chat; scripts/bench-spec-tasks.json),
# the same chat prompt text for both (`lean-cli tokenize --chat --template-text`), greedy, up to
# 128 tokens, guesses of up to 8 tokens. On the CPU by default; BACKEND=gpu on the GPU.
# - lean: `lean-cli bench-spec --backend BACKEND --lookup 8` (plain and lookup interleaved, median
#   of REPS; its cost check on, as a user gets it).
# - llama.cpp: `llama-lookup --spec-draft-n-max 8 --temp 0` (its prompt-lookup example: n-grams of
#   the prompt and the text so far), median of REPS runs; its plain decode is `llama-bench -p 0
#   -n 128 -d PROMPT_TOKENS` (decode after as many positions as the prompt), mean of REPS. With
#   BACKEND=gpu both get `-ngl 99` (every layer offloaded: llama.cpp built with a GPU backend,
#   e.g. LLAMA_VULKAN=1 scripts/llama-cpp-build.sh), with BACKEND=cpu `-ngl 0`. (ggml-vulkan skips
#   CPU-type devices such as Mesa's lavapipe: GGML_VK_VISIBLE_DEVICES=0 makes it take one.)
# The engines alternate for ROUNDS rounds; each cell is the median over the rounds. A benchmark,
# not a test: run it on a quiet machine.
#
#   scripts/bench-spec-vs-llama-cpp.sh [MODELS_DIR]   (default $LEAN_MODELS or ./models)
#   env: ROUNDS (2), REPS (3), THREADS (all cores), FILES (model file stems, default SmolLM2-135M
#        and Qwen2.5-Coder-0.5B, both Q4_0), BACKEND (cpu or gpu; default cpu),
#        LEAN_CLI (a prebuilt lean-cli: nothing is built for lean), LLAMA_BIN (a directory with
#        prebuilt llama-bench and llama-lookup: nothing is built for llama.cpp; default the CPU
#        build of scripts/llama-cpp-build.sh, or with BACKEND=gpu its LLAMA_VULKAN=1 build),
#        JSON_OUT (a file for the rows as JSON, llama.cpp's plain decode included)
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-${LEAN_MODELS:-$PWD/models}}
backend=${BACKEND:-cpu}
case "$backend" in cpu|gpu) ;; *) echo "bench-spec-vs-llama-cpp: BACKEND must be cpu or gpu" >&2; exit 2 ;; esac
if [ -n "${LLAMA_BIN:-}" ]; then
  bin=$LLAMA_BIN
elif [ "$backend" = gpu ]; then
  bin=$(LLAMA_VULKAN=1 scripts/llama-cpp-build.sh llama-bench llama-lookup)
else
  bin=$(scripts/llama-cpp-build.sh llama-bench llama-lookup)
fi
if [ -n "${LEAN_CLI:-}" ]; then
  lean=$LEAN_CLI
else
  cargo build --release --locked -p lean-cli >&2
  lean=${CARGO_TARGET_DIR:-target}/release/lean-cli
fi
export BACKEND=$backend
exec "${PYTHON:-python3}" - "$lean" "$bin" "$models" <<'PY'
import json, os, re, statistics, subprocess, sys

lean, bin_dir, models = sys.argv[1:4]
rounds = int(os.environ.get("ROUNDS", "2"))
reps = int(os.environ.get("REPS", "3"))
threads = int(os.environ.get("THREADS", str(os.cpu_count())))
backend = os.environ["BACKEND"]
ngl = ["-ngl", "99" if backend == "gpu" else "0"]
files = os.environ.get("FILES", "smollm2-135m-instruct-q4_0 qwen2.5-coder-0.5b-instruct-q4_0").split()
# The schema task (structured output) is lean's alone here: llama-lookup takes no JSON schema.
tasks = [t for t in json.load(open("scripts/bench-spec-tasks.json")) if "schema" not in t]

def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench-spec-vs-llama-cpp: {cmd[0]} failed:\n{p.stderr[-2000:]}")
    return p

def lean_round(model):
    out = run([lean, "bench-spec", "-m", model, "--tokenizer", "gguf", "--backend", backend,
               "-t", str(threads), "--lookup", "8", "--gen-tokens", "128", "--reps", str(reps),
               "--json"]).stdout
    return {t["task"]: t for t in json.loads(out)["tasks"]}

def llama_lookup(model, prompt):
    err = run([f"{bin_dir}/llama-lookup", "-m", model, "-p", prompt, "-n", "128",
               "--spec-draft-n-max", "8", "--temp", "0", "-t", str(threads), "-c", "4096", *ngl]).stderr
    get = lambda pattern: float(re.search(pattern, err).group(1))
    return {"tps": get(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)"),
            "encoded": int(get(r"encoded\s+(\d+) tokens")),
            "generated": int(get(r"n_predict\s+=\s+(\d+)")),
            "drafted": int(get(r"n_drafted\s+=\s+(\d+)")),
            "accepted": int(get(r"n_accept\s+=\s+(\d+)"))}

def llama_plain(model, depth):
    out = run([f"{bin_dir}/llama-bench", "-m", model, "-t", str(threads), "-p", "0", "-n", "128",
               "-d", str(depth), "-r", str(reps), "-o", "json", *ngl]).stdout
    r = json.loads(out)[0]
    device[0] = " ".join(x for x in (r.get("backends"), r.get("gpu_info")) if x)
    return r["avg_ts"]

device = [""]  # llama-bench's backends and GPU, as it reports them

rows = []
for f in files:
    model = f"{models}/{f}.gguf"
    if not os.path.isfile(model):
        sys.exit(f"bench-spec-vs-llama-cpp: {model} missing (scripts/fetch-test-models.sh)")
    prompts = {t["name"]: json.loads(run([lean, "tokenize", "-m", model, "--tokenizer", "gguf",
               "--chat", "--template-text", json.dumps(t["messages"])]).stdout) for t in tasks}
    cells = {t["name"]: {"lean": [], "lean_plain": [], "llama": [], "llama_plain": []} for t in tasks}
    last = {}
    for r in range(rounds):
        print(f"round {r + 1}: {f}", file=sys.stderr)
        for name, row in lean_round(model).items():
            cells[name]["lean"].append(row["lookup_decode_tokens_per_second"])
            cells[name]["lean_plain"].append(row["plain_decode_tokens_per_second"])
            last[("lean", name)] = row
        for name, prompt in prompts.items():
            runs = [llama_lookup(model, prompt) for _ in range(reps)]
            cells[name]["llama"].append(statistics.median(x["tps"] for x in runs))
            last[("llama", name)] = runs[-1]
            cells[name]["llama_plain"].append(llama_plain(model, runs[-1]["encoded"]))
    for name in prompts:
        c = {k: statistics.median(v) for k, v in cells[name].items()}
        l, m = last[("lean", name)], last[("llama", name)]
        rows.append({"model": f, "task": name, "backend": backend, "prompt_tokens": l["prompt_tokens"],
                     "lean": {"plain": c["lean_plain"], "lookup": c["lean"],
                              "speedup": c["lean"] / c["lean_plain"], "generated": l["generated_tokens"],
                              "accepted": l["accepted_tokens"], "drafted": l["drafted_tokens"]},
                     "llama_cpp": {"plain": c["llama_plain"], "lookup": c["llama"],
                                   "speedup": c["llama"] / c["llama_plain"], "generated": m["generated"],
                                   "accepted": m["accepted"], "drafted": m["drafted"],
                                   "prompt_tokens": m["encoded"], "device": device[0]},
                     "lookup_ratio": c["lean"] / c["llama"]})

print(f"{backend}, {threads} threads, guesses of up to 8 tokens, median of {rounds} rounds x {reps} reps"
      + (f"; llama.cpp on {device[0]}" if device[0] else ""))
print("| model | task | prompt | lean plain / lookup tok/s (x) | accepted | llama.cpp plain / lookup tok/s (x) | accepted | lean/llama.cpp lookup |")
print("|---|---|---:|---|---:|---|---:|---:|")
for r in rows:
    a, b = r["lean"], r["llama_cpp"]
    print(f"| {r['model']} | {r['task']} | {r['prompt_tokens']} | {a['plain']:.1f} / {a['lookup']:.1f} ({a['speedup']:.2f}x) "
          f"| {a['accepted']}/{a['drafted']} of {a['generated']} | {b['plain']:.1f} / {b['lookup']:.1f} ({b['speedup']:.2f}x) "
          f"| {b['accepted']}/{b['drafted']} of {b['generated']} | {r['lookup_ratio']:.2f}x |")
print(json.dumps(rows), file=open(os.environ.get("JSON_OUT", "/dev/null"), "w"))
PY
