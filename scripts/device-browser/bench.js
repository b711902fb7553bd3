// Browser half of scripts/device-browser.sh: lean's WebGPU backend in the browser that opened this
// page, through the Playwright test page's worker (worker.js: the wasm package, models streamed
// into GPU buffers, begin/step timed apart), on each model of ?models=a.gguf,b.gguf. Posts the
// adapter, then per model its load time and per repetition the prompt's and the decode's time,
// to the server (/progress after each model, /result at the end).
import "./harness.js"; // window.lean(method, args): calls into the worker

const params = new URLSearchParams(location.search);
const models = (params.get("models") ?? "").split(",").filter(Boolean);
const genTokens = Number(params.get("gen") ?? 128);
const reps = Number(params.get("reps") ?? 3);

// About 500 tokens of plain prose for the prefill; each repetition starts with its own number,
// so no prefix of it comes from the KV cache of the run before.
const PARAGRAPH =
  "The river ran past the old mill, where the miller's children counted boats each morning " +
  "and wrote their names in a book kept by the door. In winter the water froze at the edges, " +
  "and the wheel stood still until the thaw came with the first warm wind from the south. ";
const PROMPT = PARAGRAPH.repeat(8) + "Tell the rest of the story.";

const post = (path, body) =>
  fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });

async function main() {
  const out = { userAgent: navigator.userAgent, genTokens, reps, rows: [] };
  const adapter = await navigator.gpu?.requestAdapter({ powerPreference: "high-performance" });
  if (adapter) {
    const { vendor, architecture, device, description } = adapter.info;
    out.adapter = { vendor, architecture, device, description };
    out.features = [...adapter.features].sort();
    out.maxStorageBufferBindingSize = adapter.limits.maxStorageBufferBindingSize;
  } else {
    out.adapter = null;
    out.error = navigator.gpu ? "requestAdapter gave no adapter" : "navigator.gpu is undefined";
  }
  await post("/progress", { adapter: out.adapter, features: out.features });
  if (!adapter || models.length === 0) return post("/result", out);

  out.init = await lean("init", { backend: "webgpu" });
  for (const model of models) {
    const { loadMs, info } = await lean("load", { gguf: `/models/${model}`, contextLength: 2048 });
    const row = { model, loadS: loadMs / 1000, info, runs: [] };
    for (let r = 0; r <= reps; r++) {
      const run = await lean("generate", {
        prompt: { raw: `Run ${r}. ${PROMPT}` },
        options: { max_tokens: genTokens, stop_token_ids: [] },
      });
      row.runs.push({
        warmup: r === 0,
        promptTokens: run.promptIds.length,
        tokens: run.token_ids.length,
        prefillMs: run.prefillMs,
        decodeMs: run.decodeMs,
      });
    }
    const measured = row.runs.filter((r) => !r.warmup);
    const sum = (f) => measured.reduce((s, r) => s + f(r), 0);
    row.prefillTokPerS = sum((r) => r.promptTokens) / (sum((r) => r.prefillMs) / 1000);
    row.decodeTokPerS = sum((r) => r.tokens - 1) / (sum((r) => r.decodeMs) / 1000);
    out.rows.push(row);
    await post("/progress", row);
  }
  await post("/result", out);
}

main().catch((e) => post("/result", { error: String(e?.stack ?? e) }));
