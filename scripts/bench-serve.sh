#!/usr/bin/env bash
# `lean-cli serve` under load: requests/s and time to first token for 1, 2 and 4 concurrent
# clients, with --slots 1 and --slots 4, and the server's resident memory. Each request is a
# fresh conversation (~100 prompt tokens, nothing cached but the template's first tokens),
# streamed, 64 generated tokens (ignore_eos), greedy.
#   scripts/bench-serve.sh [MODEL] [REQUESTS_PER_CLIENT]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-${LEAN_MODELS:-$PWD/models}/smollm2-135m-instruct-q4_0.gguf}
per_client=${2:-8}
cargo build --release --locked -p lean-cli >&2
echo "model $(basename "$model") · $(nproc) cores · $per_client requests per client · 64 tokens each"
echo
echo "| slots | clients | requests/s | TTFT mean | TTFT p90 | tokens/s (all clients) | server RSS |"
echo "|---|---|---|---|---|---|---|"
for slots in 1 4; do
  err=$(mktemp)
  target/release/lean-cli serve -m "$model" --port 0 --slots "$slots" --ctx 1024 2>"$err" &
  pid=$!
  until addr=$(grep -o 'listening on http://.*' "$err" | cut -d/ -f3) && [ -n "$addr" ]; do
    kill -0 "$pid" || { cat "$err" >&2; exit 1; }
    sleep 0.1
  done
  for clients in 1 2 4; do
    python3 - "$addr" "$clients" "$per_client" "$slots" "$pid" <<'PY'
import http.client, json, statistics, sys, threading, time
addr, clients, per_client, slots, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
host, port = addr.split(":")
words = "Please summarise the following notes about the history of the printing press in Europe. " * 6

def one(tag):
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = {"messages": [{"role": "user", "content": f"Request {tag}. {words}"}], "max_tokens": 64,
            "ignore_eos": True, "temperature": 0, "stream": True}
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    first = None
    for line in response:
        if line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line and first is None:
            first = time.perf_counter() - start
    conn.close()
    return first

ttfts = []
def client(c):
    for r in range(per_client):
        ttfts.append(one(f"{c}-{r}-{time.time_ns()}"))
one("warm-up")
t = time.perf_counter()
threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for th in threads: th.start()
for th in threads: th.join()
elapsed = time.perf_counter() - t
n = clients * per_client
rss = next(l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM"))
ttfts.sort()
print(f"| {slots} | {clients} | {n / elapsed:.2f} | {statistics.mean(ttfts) * 1000:.0f} ms "
      f"| {ttfts[int(0.9 * (n - 1))] * 1000:.0f} ms | {n * 64 / elapsed:.0f} | {int(rss) / 1024:.0f} MiB peak |")
PY
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$err"
done
