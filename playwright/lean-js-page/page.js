// The lean-js test page: lean-js's build (packages/lean-js/dist, served at /lean-js/) used as an
// app would use it, unbundled. tests/lean-js.spec.js drives it through `window.leanJs`; every
// call returns plain data (ids, finish reasons, error names), so the test can compare it with
// the fixtures.
import { createEngine, deleteCached, listCached } from "/lean-js/index.js";

let engine = null;

/** Reads `stream` until it ends, or until `stopAfter` tokens (then `stop` is called once). */
async function read(stream, { stopAfter = Infinity, stop = () => {} } = {}) {
  const ids = [];
  let error = null;
  try {
    for await (const { tokenId } of stream) {
      ids.push(tokenId);
      if (ids.length === stopAfter && stop() === "break") break;
    }
  } catch (e) {
    error = { name: e.name, message: e.message };
  }
  const result = await stream.result;
  return { streamedIds: ids, error, finishReason: result.finishReason, tokenIds: result.tokenIds };
}

window.leanJs = {
  /** Creates the engine; reports where each file came from (network or cache). */
  async load({ model, backend, threads, cache, threadPoolTimeoutMs, testHooks }) {
    engine?.dispose();
    const sources = {};
    const warnings = [];
    const started = performance.now();
    engine = await createEngine({
      model,
      backend,
      threads,
      cache,
      threadPoolTimeoutMs,
      testHooks,
      contextLength: 1024,
      onProgress: ({ file, source }) => {
        sources[file] = source;
      },
      onWarning: (message) => warnings.push(message),
    });
    return {
      loadMs: performance.now() - started,
      backend: engine.backend,
      backendReason: engine.backendReason,
      crossOriginIsolated: globalThis.crossOriginIsolated,
      sources,
      warnings,
    };
  },

  /** `load`'s error as {name, message}, or null when it loaded. */
  async loadError(options) {
    try {
      await this.load(options);
      return null;
    } catch (e) {
      return { name: e.name, message: e.message };
    }
  },

  /** A whole greedy generation. */
  generate(prompt, maxTokens) {
    return read(engine.generate(prompt, { maxTokens, temperature: 0, stopTokenIds: [] }));
  },

  /** A greedy generation stopped after `after` tokens by aborting its AbortSignal. */
  generateAborted(prompt, maxTokens, after) {
    const controller = new AbortController();
    const stream = engine.generate(prompt, { maxTokens, temperature: 0, stopTokenIds: [], signal: controller.signal });
    return read(stream, { stopAfter: after, stop: () => controller.abort() });
  },

  /** A greedy generation stopped after `after` tokens by breaking out of `for await`. */
  generateBroken(prompt, maxTokens, after) {
    const stream = engine.generate(prompt, { maxTokens, temperature: 0, stopTokenIds: [] });
    return read(stream, { stopAfter: after, stop: () => "break" });
  },

  dispose() {
    engine?.dispose();
    engine = null;
  },

  deleteCached: () => deleteCached(),
  listCached: async () => (await listCached()).map(({ url, bytes }) => ({ url, bytes })),
};
