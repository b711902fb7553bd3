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

/** The browser's floor under a decode step that reads its token back: a 4-byte copy submitted,
 * then `mapAsync` of its staging buffer, 200 times (after 20 unmeasured): median and 90th
 * percentile in ms, and the same for `onSubmittedWorkDone` alone. */
const roundTripSource = `async function roundTrip(adapter) {
  const device = await adapter.requestDevice();
  const src = device.createBuffer({ size: 4, usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  const staging = device.createBuffer({ size: 4, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ });
  const stats = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return { medianMs: s[s.length >> 1], p90Ms: s[Math.floor(s.length * 0.9)] };
  };
  const mapped = [];
  const done = [];
  for (let i = 0; i < 220; i++) {
    const t0 = performance.now();
    device.queue.writeBuffer(src, 0, new Uint32Array([i]));
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(src, 0, staging, 0, 4);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    staging.unmap();
    const t1 = performance.now();
    device.queue.submit([]);
    await device.queue.onSubmittedWorkDone();
    const t2 = performance.now();
    if (i >= 20) {
      mapped.push(t1 - t0);
      done.push(t2 - t1);
    }
  }
  device.destroy();
  return { mapAsync: stats(mapped), onSubmittedWorkDone: stats(done) };
}`;
const roundTrip = new Function(`return (${roundTripSource})`)();

/** The same round trip measured in a dedicated worker, where lean's engine runs. */
function roundTripInWorker() {
  const source = `${roundTripSource}
    navigator.gpu.requestAdapter({ powerPreference: "high-performance" })
      .then(roundTrip).then((r) => postMessage(r), (e) => postMessage({ error: String(e) }));`;
  const worker = new Worker(URL.createObjectURL(new Blob([source], { type: "text/javascript" })));
  return new Promise((resolve) => {
    worker.onmessage = ({ data }) => {
      worker.terminate();
      resolve(data);
    };
  });
}

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
  if (adapter) {
    out.roundTrip = await roundTrip(adapter);
    out.roundTripInWorker = await roundTripInWorker();
  }
  await post("/progress", {
    adapter: out.adapter,
    features: out.features,
    roundTrip: out.roundTrip,
    roundTripInWorker: out.roundTripInWorker,
  });
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
        stepMs: run.stepMs,
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
