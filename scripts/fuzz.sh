#!/usr/bin/env bash
# Fuzzes lean's readers of untrusted input with cargo-fuzz (libFuzzer + AddressSanitizer): the
# GGUF parser, model construction (+ a forward pass of small models), the tokenizer from GGUF
# metadata, tokenizer.json and chat-template rendering (rust/lean-fuzz: the targets' bodies).
#   scripts/fuzz.sh [SECONDS] [TARGET...]   (default 60 s each, every target)
# Each target starts from its committed corpus fuzz/corpus/<target>/ (seeds: `cargo run -p
# lean-fuzz --bin make-seeds`); new inputs that widen coverage go to fuzz/artifacts/corpus-new/
# (not committed unless a crash made them worth keeping), crashes to fuzz/artifacts/<target>/.
# Prints one line per target: runs, coverage, peak RSS. Needs the nightly of scripts/build.sh
# (installs cargo-fuzz the first time). Env: LEAN_FUZZ_RSS_MB (default 2048), LEAN_FUZZ_JOBS,
# LEAN_FUZZ_SANITIZER (address, the default, or none: 5-10x the inputs, as CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf model tokenizer_gguf tokenizer_json chat_template)
nightly="${LEAN_NIGHTLY:-nightly-2026-05-19}"
rustup toolchain list | grep -q "^$nightly" || rustup toolchain install "$nightly" --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --version 0.13.2 --locked
status=0
for t in "${targets[@]}"; do
  new="fuzz/artifacts/corpus-new/$t"
  mkdir -p "$new" "fuzz/artifacts/$t"
  log="fuzz/artifacts/$t.log"
  # -timeout: one input may take at most 10 s (a hang is a finding); -rss_limit_mb bounds memory.
  if cargo +"$nightly" fuzz run --fuzz-dir fuzz --sanitizer "${LEAN_FUZZ_SANITIZER:-address}" \
      "$t" "$new" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb="${LEAN_FUZZ_RSS_MB:-2048}" \
      -print_final_stats=1 > "$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "fuzz $t: ok, $runs runs in ${seconds} s, $cov, peak RSS ${rss} MB"
  else
    status=1
    echo "fuzz $t: FAILED (log: $log; crash inputs: fuzz/artifacts/$t/)"
    grep -E 'panicked|ERROR: libFuzzer|SUMMARY' "$log" | head -5 || true
  fi
done
exit "$status"
