// Worker half of the test page: drives the raw wasm-bindgen packages (pkg/ = simd, and webgpu
// through its GpuModelLoader; pkg-mt/ = threads) the way an app would, and times each phase. Requests: {id, method, args}; replies:
// {id, result} or {id, error: {name, message}}.
let wasm; // the package's module once `init` ran
let engine; // the WasmEngine of the last `load`
let gpu = false; // whether `init` chose the webgpu backend
let initStage = "not started"; // where `init` is, for a test whose init never finishes

/** Streams `url` chunk by chunk (no second copy of the file in JS) into a ModelLoader, or for
 * webgpu a GpuModelLoader (each matrix straight into a GPU buffer). */
async function streamGguf(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const size = Number(response.headers.get("Content-Length"));
  const loader = gpu ? await wasm.GpuModelLoader.open(size) : new wasm.ModelLoader(size);
  for await (const chunk of response.body) loader.push(chunk);
  return loader;
}

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/** The first `bytes` bytes of `url`, without downloading the rest. */
async function fetchHead(url, bytes) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const head = new Uint8Array(bytes);
  let filled = 0;
  for await (const chunk of response.body) {
    const take = Math.min(chunk.length, bytes - filled);
    head.set(chunk.subarray(0, take), filled);
    filled += take;
    if (filled === bytes) break; // leaving the loop cancels the download
  }
  return head.subarray(0, filled);
}

/** The loader's engine from the tokenizer files in `tokenizerDir` (a URL ending in "/"), or,
 * without one, from the tokenizer and chat template in the GGUF's own metadata. */
async function finish(loader, tokenizerDir, contextLength) {
  if (!tokenizerDir) return await loader.finish(null, null, null, contextLength);
  const [tokenizerJson, tokenizerConfig, chatTemplate] = await Promise.all([
    fetchBytes(`${tokenizerDir}tokenizer.json`),
    fetchBytes(`${tokenizerDir}tokenizer_config.json`),
    fetchBytes(`${tokenizerDir}chat_template.jinja`).then((b) => new TextDecoder().decode(b)),
  ]);
  return await loader.finish(tokenizerJson, tokenizerConfig, chatTemplate, contextLength);
}

const methods = {
  /** Where `init` is (answered while it is still waiting). */
  initStage() {
    return initStage;
  },

  /** Instantiates the package of `backend` ("simd", "webgpu" or "threads", the latter with
   * `threads` pool threads). */
  async init({ backend, threads }) {
    initStage = "importing the package";
    wasm = await import(backend === "threads" ? "/pkg-mt/lean_wasm.js" : "/pkg/lean_wasm.js");
    initStage = "instantiating the module";
    await wasm.default();
    initStage = "starting the thread pool";
    if (backend === "threads") await wasm.initThreadPool(threads);
    initStage = "done";
    gpu = backend === "webgpu";
    return {
      backend: gpu ? "webgpu" : wasm.backend(),
      threads: backend === "threads" ? wasm.threadCount() : 1,
      crossOriginIsolated: self.crossOriginIsolated,
    };
  },

  /** Loads a model; returns the time it took (download from 127.0.0.1 included). */
  async load({ gguf, tokenizerDir, contextLength }) {
    const started = performance.now();
    engine?.free();
    engine = undefined;
    engine = await finish(await streamGguf(gguf), tokenizerDir, contextLength);
    return { loadMs: performance.now() - started, info: JSON.parse(engine.info()) };
  },

  /** Generates step by step so that prefill and decode are timed apart: `prefillMs` is the
   * prompt's forward pass, `decodeMs` spans the tokens after the first. */
  async generate({ prompt, options }) {
    const started = performance.now();
    const begun = await engine.begin(JSON.stringify(prompt), JSON.stringify(options));
    const { prompt_ids } = JSON.parse(begun);
    const prefillMs = performance.now() - started;
    let firstTokenAt;
    const steps = []; // each step's time after the first, for its spread
    for (;;) {
      const stepStarted = performance.now();
      const { done } = JSON.parse(await engine.step());
      if (firstTokenAt) steps.push(performance.now() - stepStarted);
      firstTokenAt ??= performance.now();
      if (done) {
        steps.sort((a, b) => a - b);
        const at = (q) => steps[Math.min(steps.length - 1, Math.floor(steps.length * q))];
        const stepMs = steps.length ? { p10: at(0.1), median: at(0.5), p90: at(0.9), max: at(1) } : null;
        return { promptIds: prompt_ids, ...done, prefillMs, decodeMs: performance.now() - firstTokenAt, stepMs };
      }
    }
  },

  /** Loads the first `bytes` bytes of a GGUF: the error it gives, or null when it loads. */
  async loadTruncated({ gguf, bytes, tokenizerDir }) {
    const head = await fetchHead(gguf, bytes);
    try {
      const loader = gpu ? await wasm.GpuModelLoader.open(head.length) : new wasm.ModelLoader(head.length);
      loader.push(head);
      (await finish(loader, tokenizerDir, 256)).free();
      return null;
    } catch (e) {
      return { name: e.name, message: e.message, panic: wasm.takePanicMessage() ?? null };
    }
  },
};

self.onmessage = async ({ data: { id, method, args } }) => {
  try {
    postMessage({ id, result: await methods[method](args) });
  } catch (e) {
    postMessage({ id, error: { name: e?.name ?? "Error", message: e?.message ?? String(e) } });
  }
};
