// wllama's side of bench-browser.mjs: wllama's npm builds (served from playwright/node_modules)
// driven through `window.wllama`, timed as lean-js-page/page.js's benchPrompt times lean-js.
// index.html runs @wllama/wllama 3.x (/wllama/): one wasm64 (memory64) build, which n_threads 1
// runs without pthreads and n_threads > 1 with them (cross-origin isolated page);
// index.html?v=2 runs 2.x (the devDependency wllama-v2, /wllama-v2/): its single-thread and
// multi-thread wasm32 builds, the newest memory32 wllama.
const v2 = new URLSearchParams(location.search).get("v") === "2";
const base = v2 ? "/wllama-v2" : "/wllama";
const { Wllama } = await import(`${base}/index.js`);
const asset = (path) => new URL(`${base}/${path}`, location.href).href;
const paths = v2
  ? { "single-thread/wllama.wasm": asset("single-thread/wllama.wasm"), "multi-thread/wllama.wasm": asset("multi-thread/wllama.wasm") }
  : { default: asset("wasm/wllama.wasm") };
const quiet = { debug: () => {}, log: () => {}, warn: console.warn, error: console.error };

let wllama = null;

/** 3.x: raw completion through llama-server's code, streamed; EOS banned by ignore_eos. */
async function complete3(prompt, genTokens, onToken) {
  let final = null;
  await wllama.createCompletion({
    prompt,
    max_tokens: genTokens,
    temperature: 0,
    ignore_eos: true,
    cache_prompt: false,
    stream: true,
    onData: (chunk) => {
      if (chunk.choices?.length && chunk.choices[0].finish_reason == null) onToken(chunk.choices[0].text);
      final = chunk;
    },
  });
  return { promptTokens: final?.usage?.prompt_tokens, cachedTokens: final?.timings?.cache_n, generated: final?.usage?.completion_tokens };
}

/** 2.x: its own loop (sample, accept, decode per token); EOS and EOT banned by a logit bias. */
async function complete2(prompt, genTokens, onToken) {
  // createCompletion tokenizes so, adding BOS where the model wants it.
  const ids = await wllama.tokenize(prompt, true);
  const promptTokens = ids.length + (wllama.mustAddBosToken() && ids[0] !== wllama.getBOS() ? 1 : 0);
  const banned = [...new Set([wllama.getEOS(), wllama.getEOT()])].filter((t) => t >= 0);
  let generated = 0;
  let seen = "";
  await wllama.createCompletion(prompt, {
    nPredict: genTokens,
    sampling: { temp: 0, logit_bias: banned.map((token) => ({ token, bias: -1e9 })) },
    useCache: false,
    onNewToken: (_token, _piece, text) => {
      generated += 1;
      onToken(text.slice(seen.length));
      seen = text;
    },
  });
  return { promptTokens, cachedTokens: 0, generated };
}

window.wllama = {
  /** Loads `url`'s GGUF, fetched into a Blob first so that the time is loading only. */
  async load({ url, threads, contextLength }) {
    await wllama?.exit();
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    const blob = await response.blob();
    wllama = new Wllama(paths, { suppressNativeLog: true, logger: quiet });
    const started = performance.now();
    // n_gpu_layers 0 (3.x): the CPU, as lean's simd and threads backends (2.x has no WebGPU).
    await wllama.loadModel([blob], { n_threads: threads, n_ctx: contextLength, ...(v2 ? {} : { n_gpu_layers: 0 }) });
    return {
      loadMs: performance.now() - started,
      multithread: wllama.isMultithread(),
      threads: wllama.getNumThreads(),
      crossOriginIsolated: globalThis.crossOriginIsolated,
      version: Wllama.getLibllamaVersion(),
    };
  },

  /**
   * One greedy raw completion of `prompt` (no chat template, no prompt cache), `genTokens` tokens
   * with end of generation banned: prefill = call → first token, decode = first → last token on
   * the page.
   */
  async benchPrompt({ prompt, genTokens }) {
    let first = 0;
    let last = 0;
    let text = "";
    const started = performance.now();
    const counts = await (v2 ? complete2 : complete3)(prompt, genTokens, (piece) => {
      last = performance.now();
      first ||= last;
      text += piece;
    });
    return { ...counts, text, prefillMs: first - started, decodeMs: last - first };
  },

  async dispose() {
    await wllama?.exit();
    wllama = null;
  },
};
