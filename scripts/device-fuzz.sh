#!/usr/bin/env bash
# The fuzz targets' long run (issue 19: ≥ 10 M executions a target) on the lent machine's 16
# cores, which has no Rust toolchain and no network: the libFuzzer binaries are built here and
# carried.
#
#   scripts/device-fuzz.sh prepare        here: build every target (cargo-fuzz, nightly of
#                                         scripts/fuzz.sh; LEAN_FUZZ_SANITIZER: address (default)
#                                         or none) and copy the binaries into .devfuzz/
#   scripts/device-fuzz.sh run SECONDS    there (the `run` tool, carry [".devfuzz"]): every target
#                                         at once, FUZZ_JOBS forked jobs each (default 3, or
#                                         "target=N,...", 0 leaves one out), from its committed corpus (fuzz/corpus/)
#                                         and what earlier runs of this machine found
#                                         (/tmp/corpus), for SECONDS; logs and a summary to $OUT
#
# A crash or a timeout (one input over 10 s) or an input over 2 GiB of memory is a finding: its
# input is written to $OUT/crashes/. .devfuzz/ is git-ignored (.git/info/exclude).
# Without a sanitizer a target runs 5-10x more inputs a second; lean's own code has no unsafe
# outside its SIMD kernels, and a panic, a hang or the memory limit are caught either way. Each
# job runs single-threaded (RAYON_NUM_THREADS=1: the model target's forward pass would otherwise
# spread a tiny model over every core the other jobs need).
set -uo pipefail
cd "$(dirname "$0")/.."
targets=(gguf model tokenizer_gguf tokenizer_json chat_template)

prepare() {
    set -e
    local exclude nightly target
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx '/.devfuzz/' "$exclude" 2>/dev/null || echo /.devfuzz/ >>"$exclude"
    nightly="${LEAN_NIGHTLY:-nightly-2026-05-19}"
    command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --version 0.13.2 --locked
    target=${CARGO_TARGET_DIR:-fuzz/target}
    CARGO_TARGET_DIR=$target nice -n 10 cargo +"$nightly" fuzz build --fuzz-dir fuzz \
        --sanitizer "${LEAN_FUZZ_SANITIZER:-address}"
    echo "${LEAN_FUZZ_SANITIZER:-address}" >.devfuzz-sanitizer
    # Stripped of debug info and xz-packed: 136 MB of ASan binaries become 26 MB (the carry
    # limit is 64 MiB).
    local bins
    bins=$(mktemp -d)
    for t in "${targets[@]}"; do
        cp "$target/x86_64-unknown-linux-gnu/release/$t" "$bins/"
        strip --strip-debug "$bins/$t"
    done
    rm -rf .devfuzz && mkdir -p .devfuzz
    tar -C "$bins" -cJf .devfuzz/bins.tar.xz "${targets[@]}"
    mv .devfuzz-sanitizer .devfuzz/sanitizer
    rm -rf "$bins"
    du -sh .devfuzz
}

run() {
    local seconds=${1:?seconds}
    local out=${OUT:-/tmp/out}
    mkdir -p "$out/crashes" /tmp/fuzzbin
    tar -C /tmp/fuzzbin -xJf .devfuzz/bins.tar.xz
    echo "sanitizer: $(cat .devfuzz/sanitizer 2>/dev/null || echo address)" | tee "$out/summary.txt"
    export RAYON_NUM_THREADS=1
    for t in "${targets[@]}"; do
        mkdir -p "/tmp/corpus/$t"
        local jobs=3
        case ",${FUZZ_JOBS:-}," in
        *",$t="*) jobs=$(echo ",$FUZZ_JOBS," | sed "s/.*,$t=\([0-9]*\),.*/\1/") ;;
        ,[0-9]*,) jobs=$FUZZ_JOBS ;;
        esac
        # 0 jobs: this run leaves the target out (its goal is met).
        [ "$jobs" -gt 0 ] || continue
        # -fork: jobs in child processes, a crash or timeout in one is recorded and the run goes
        # on (-ignore_crashes etc.), so one finding does not stop the count.
        (/tmp/fuzzbin/"$t" -fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
            -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="$out/crashes/$t-" "/tmp/corpus/$t" "fuzz/corpus/$t" \
            >"$out/$t.log" 2>&1; echo "exit $?" >>"$out/$t.log") &
    done
    wait
    for t in "${targets[@]}"; do
        [ -f "$out/$t.log" ] || continue
        # fork mode's progress lines: "#N: cov: C ft: F corp: K exec/s: E oom/timeout/crash: a/b/c time: Ts job: J dft_time: D"
        local last
        last=$(grep -E '^#[0-9]+: cov:' "$out/$t.log" | tail -1)
        # (fork mode reports no peak RSS: an input over -rss_limit_mb counts as an oom.)
        echo "$t: ${last:-no progress line} | $(grep -c 'CRASH\|==ERROR' "$out/$t.log") crash lines"
    done | tee -a "$out/summary.txt"
    ls "$out/crashes" | head -20
}

case "${1:-}" in
prepare) prepare ;;
run) shift; run "$@" ;;
*) echo "usage: $0 prepare | run SECONDS" >&2; exit 2 ;;
esac
