// The lean-js test page: lean-js's build (packages/lean-js/dist, served at /lean-js/) used as an
// app would use it, unbundled. tests/lean-js.spec.js drives it through `window.leanJs`; every
// call returns plain data (ids, finish reasons, error names), so the test can compare it with
// the fixtures.
import { createEngine, deleteCached, listCached } from "/lean-js/index.js";

let engine = null;
/** `backendchange` events of the engine: {backend, backendReason} after each. */
let backendChanges = [];

/** Workers this page made and has not terminated (lean-js's engine workers). */
const liveWorkers = new Set();
const NativeWorker = window.Worker;
window.Worker = class CountedWorker extends NativeWorker {
  constructor(...args) {
    super(...args);
    liveWorkers.add(this);
  }
  terminate() {
    liveWorkers.delete(this);
    super.terminate();
  }
};

/** The page's JS heap in bytes after a collection (Chromium with --js-flags=--expose-gc), else null. */
function jsHeapBytes() {
  globalThis.gc?.();
  return performance.memory?.usedJSHeapSize ?? null;
}

/** A fixed pseudo-random sequence (xorshift32), the same on every run. */
function randoms(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}

const sameIds = (a, b) => a.length === b.length && a.every((id, i) => id === b[i]);

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

/**
 * The model spec the test sent (plain data), with its GGUF turned into what an app may also pass
 * (tests/lone-gguf.spec.js): `gguf.fetch` (a URL) is fetched here and given `as` a "file",
 * "blob", "arraybuffer" or "uint8array", after replacing the metadata key `renameKey[0]` with
 * `renameKey[1]` (of the same length) when given; `gguf.bytes` (numbers) is given as an ArrayBuffer.
 */
async function materialize(model) {
  const gguf = model?.gguf;
  if (typeof gguf !== "object" || gguf === null || !("fetch" in gguf || "bytes" in gguf)) return model;
  let bytes;
  if ("bytes" in gguf) {
    bytes = new Uint8Array(gguf.bytes);
  } else {
    const response = await fetch(gguf.fetch);
    if (!response.ok) throw new Error(`${gguf.fetch}: HTTP ${response.status}`);
    bytes = new Uint8Array(await response.arrayBuffer());
  }
  if (gguf.renameKey) {
    const [from, to] = gguf.renameKey.map((key) => new TextEncoder().encode(key));
    const at = bytes.findIndex((_, i) => from.every((b, j) => bytes[i + j] === b));
    if (at < 0 || from.length !== to.length) throw new Error(`cannot rename ${gguf.renameKey[0]}`);
    bytes.set(to, at);
  }
  const as = {
    file: () => new File([bytes], gguf.name ?? "model.gguf"),
    blob: () => new Blob([bytes]),
    arraybuffer: () => bytes.buffer,
    uint8array: () => bytes,
  }[gguf.as ?? "arraybuffer"];
  return { ...model, gguf: as() };
}

/** One chat of `messages` from an empty KV cache, read to its end: its result and wall time. */
async function timedChat(messages, options) {
  await engine.resetChat();
  const started = performance.now();
  const stream = engine.chat(messages, options);
  for await (const _ of stream);
  const r = await stream.result;
  return { r, wallMs: performance.now() - started };
}

window.leanJs = {
  /** Creates the engine; reports where each file came from (network or cache). */
  async load({ model, backend, threads, cache, threadPoolTimeoutMs, testHooks }) {
    engine?.dispose();
    model = await materialize(model);
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
    backendChanges = [];
    engine.addEventListener("backendchange", () =>
      backendChanges.push({ backend: engine.backend, backendReason: engine.backendReason }),
    );
    return {
      loadMs: performance.now() - started,
      backend: engine.backend,
      backendReason: engine.backendReason,
      crossOriginIsolated: globalThis.crossOriginIsolated,
      sources,
      warnings,
      tokenizerFromGguf: engine.info.tokenizerFromGguf,
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

  /**
   * A conversation through engine.chat.completions (greedy): `first`, then `second` (the cache
   * of the first turn carried over), then `second` again after resetChat (fresh), then streamed
   * (the whole prompt but its last token cached).
   */
  async conversation({ first, second, maxTokens }) {
    const create = (messages, extra = {}) =>
      engine.chat.completions.create({ messages, max_tokens: maxTokens, temperature: 0, ...extra });
    const pick = ({ choices: [choice], usage }) => ({ content: choice.message.content, finishReason: choice.finish_reason, usage });
    const turn1 = pick(await create(first));
    const turn2 = pick(await create(second));
    const cachedAfterTurn2 = engine.info.cachedTokens;
    await engine.resetChat();
    const fresh = pick(await create(second));
    let streamed = "";
    let streamedUsage = null;
    for await (const chunk of await create(second, { stream: true, stream_options: { include_usage: true } })) {
      streamed += chunk.choices[0]?.delta?.content ?? "";
      streamedUsage = chunk.usage ?? streamedUsage;
    }
    return { turn1, turn2, cachedAfterTurn2, fresh, streamed, streamedUsage };
  },

  /**
   * Structured output (tests/lean-js.spec.js): `messages` under the JSON `schema` (greedy, at most
   * `maxTokens`) through engine.chat; then `badSchema` through chat.completions (its error); then
   * the schema again through chat.completions, streamed and cut at `cutTokens` (finish_reason
   * "length"); `fast` (slow backends) skips these two for one free-text token.
   */
  async constrained({ messages, schema, maxTokens, badSchema, cutTokens, fast = false }) {
    const json_schema = { name: "answer", schema, strict: true };
    const ms = {};
    let t = performance.now();
    const lap = (name) => {
      ms[name] = Math.round(performance.now() - t);
      t = performance.now();
    };
    const stream = engine.chat(messages, { maxTokens, temperature: 0, responseFormat: { type: "json_schema", json_schema } });
    const chat = await read(stream);
    chat.text = (await stream.result).text;
    lap("chat");
    // Speculative decoding under the schema, guessing from its own reply: the same ids.
    const speculative = { lookup: 4, prediction: chat.text };
    const guessedStream = engine.chat(messages, { maxTokens, temperature: 0, responseFormat: { type: "json_schema", json_schema }, speculative });
    const guessed = await read(guessedStream);
    guessed.accepted = (await guessedStream.result).speculation.acceptedTokens;
    lap("speculative");
    const create = (extra) =>
      engine.chat.completions.create({ messages, temperature: 0, max_tokens: maxTokens, response_format: { type: "json_schema", json_schema }, ...extra });
    let badError = null;
    try {
      await create({ response_format: { type: "json_schema", json_schema: { name: "bad", schema: badSchema } } });
    } catch (e) {
      badError = { name: e.name, message: e.message };
    }
    lap("bad");
    let streamed = null;
    if (!fast) {
      streamed = { content: "", finishReason: null };
      for await (const chunk of await create({ stream: true })) {
        streamed.content += chunk.choices[0]?.delta?.content ?? "";
        streamed.finishReason = chunk.choices[0]?.finish_reason ?? streamed.finishReason;
      }
    }
    lap("streamed");
    let cut = null;
    if (!fast) {
      const { choices: [choice] } = await create({ max_tokens: cutTokens });
      cut = { content: choice.message.content, finishReason: choice.finish_reason };
    }
    // The engine goes on after the rejected schema (fast: a free-text token).
    const after = fast ? await read(engine.chat(messages, { maxTokens: 1, temperature: 0 })) : null;
    lap("rest");
    return { chat, guessed, badError, streamed, cut, after, usable: engine.usable, ms };
  },

  /**
   * Tool calls (tests/lean-js.spec.js): `messages` with `tools` and `tool_choice` (greedy, at most
   * `maxTokens`) through chat.completions, whole and (unless `wholeOnly`: slow backends)
   * streamed: the calls (without their ids, which are new each time), the content and the
   * finish reason.
   */
  async toolCall({ messages, tools, toolChoice, maxTokens, wholeOnly = false }) {
    const request = { messages, tools, tool_choice: toolChoice, max_tokens: maxTokens, temperature: 0 };
    const strip = (calls) => calls?.map(({ index, type, function: f }) => ({ ...(index === undefined ? {} : { index }), type, function: f }));
    const ms = {};
    let t = performance.now();
    const { choices: [choice] } = await engine.chat.completions.create(request);
    const whole = { content: choice.message.content, toolCalls: strip(choice.message.tool_calls), finishReason: choice.finish_reason };
    const ids = choice.message.tool_calls?.map((c) => c.id);
    ms.whole = Math.round(performance.now() - t);
    if (wholeOnly) return { whole, ids, streamed: null, ms };
    t = performance.now();
    const streamed = { content: "", toolCalls: [], finishReason: null };
    for await (const chunk of await engine.chat.completions.create({ ...request, stream: true })) {
      const delta = chunk.choices[0]?.delta ?? {};
      streamed.content += delta.content ?? "";
      streamed.toolCalls.push(...(strip(delta.tool_calls) ?? []));
      streamed.finishReason = chunk.choices[0]?.finish_reason ?? streamed.finishReason;
    }
    ms.streamed = Math.round(performance.now() - t);
    return { whole, ids, streamed, ms };
  },

  /**
   * scripts/bench-chat.sh's browser run: a conversation of `questions`, `genTokens` greedy tokens
   * a turn (end of turn ignored); with `reuse` false the cache is reset before each turn. Per
   * turn: prompt and cached tokens, time to first token, decode tok/s.
   */
  async benchChat({ questions, genTokens, reuse }) {
    const messages = [];
    const turns = [];
    for (const content of questions) {
      messages.push({ role: "user", content });
      if (!reuse) await engine.resetChat();
      const started = performance.now();
      let ttftMs = null;
      const stream = engine.chat(messages, { maxTokens: genTokens, temperature: 0, stopTokenIds: [] });
      for await (const token of stream) ttftMs ??= performance.now() - started;
      const result = await stream.result;
      turns.push({ promptTokens: result.promptTokens, cachedTokens: result.cachedTokens, ttftMs, decodeTokensPerSecond: result.decodeTokensPerSecond });
      messages.push({ role: "assistant", content: result.text });
    }
    return turns;
  },

  /**
   * bench-browser.mjs: one greedy raw completion of `prompt` from an empty KV cache, `genTokens`
   * tokens (end of sequence ignored), timed on the page as wllama-page/page.js times wllama:
   * prefill = call → first token, decode = first → last token.
   */
  async benchPrompt({ prompt, genTokens }) {
    await engine.resetChat();
    const started = performance.now();
    const stream = engine.generate(prompt, { maxTokens: genTokens, temperature: 0, stopTokenIds: [] });
    let first = 0;
    let last = 0;
    for await (const _ of stream) {
      last = performance.now();
      first ||= last;
    }
    const r = await stream.result;
    return {
      promptTokens: r.promptTokens,
      cachedTokens: r.cachedTokens,
      generated: r.tokenIds.length,
      text: r.text,
      prefillMs: first - started,
      decodeMs: last - first,
    };
  },

  /**
   * bench-constrained.mjs: one greedy chat of `messages` from an empty KV cache, `maxTokens` at
   * most, free (end of turn ignored) or under the JSON `schema`; wall time of the call included
   * (it holds a constraint's compilation).
   */
  async benchChatDecode({ messages, maxTokens, schema }) {
    const options = schema
      ? { maxTokens, temperature: 0, responseFormat: { type: "json_schema", json_schema: { name: "bench", schema, strict: true } } }
      : { maxTokens, temperature: 0, stopTokenIds: [] };
    const { r, wallMs } = await timedChat(messages, options);
    return {
      wallMs,
      prefillMs: r.prefillMs,
      generated: r.tokenIds.length,
      decodeTokensPerSecond: r.decodeTokensPerSecond,
      finishReason: r.finishReason,
      text: r.text,
    };
  },

  /**
   * bench-spec.mjs: one greedy chat of `messages` from an empty KV cache, `maxTokens` at most
   * (it may end on the end of turn), plain or with `speculative` (e.g. `{ lookup: 8 }`); the
   * ids, to check that speculation gives the same reply, and its guesses kept and refused.
   * With a JSON `schema` (the extract task), both modes follow it.
   */
  async benchChatSpec({ messages, schema, maxTokens, speculative }) {
    const options = {
      maxTokens,
      temperature: 0,
      ...(speculative ? { speculative } : {}),
      ...(schema ? { responseFormat: { type: "json_schema", json_schema: { name: "bench", schema, strict: true } } } : {}),
    };
    const { r, wallMs } = await timedChat(messages, options);
    return {
      wallMs,
      prefillMs: r.prefillMs,
      decodeMs: r.decodeMs,
      tokenIds: r.tokenIds,
      generated: r.tokenIds.length,
      decodeTokensPerSecond: r.decodeTokensPerSecond,
      finishReason: r.finishReason,
      speculation: r.speculation,
    };
  },

  /** A greedy generation's ids and its prompt's length (tests/lone-gguf.spec.js). */
  async run(prompt, maxTokens) {
    const stream = engine.generate(prompt, { maxTokens, temperature: 0, stopTokenIds: [] });
    for await (const _ of stream);
    const { tokenIds, promptTokens, finishReason } = await stream.result;
    return { tokenIds, promptTokens, finishReason };
  },

  tokenize: (text) => engine.tokenize(text),

  /** A whole greedy generation. */
  /** The engine's backend now and its `backendchange` events so far. */
  backendChanges() {
    return { backend: engine.backend, backendReason: engine.backendReason, changes: backendChanges };
  },

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

  /**
   * tests/long-session.spec.js: `generations` greedy generations of `prompt` (each must give
   * `expected`), then `aborts` generations aborted after a random number of tokens below
   * `expectedAfterAbort`'s length, each followed by a whole one that must give `expectedAfterAbort`. Memory (wasm, JS heap) is read
   * after a first generation and at the end; returns the runs that differed.
   */
  async longSession({ prompt, expected, expectedAfterAbort, generations, aborts, seed = 7 }) {
    const options = { maxTokens: expected.length, temperature: 0, stopTokenIds: [] };
    const longer = { ...options, maxTokens: expectedAfterAbort.length };
    const memory = async () => ({ wasm: (await engine.memoryInfo()).wasmMemoryBytes, heap: jsHeapBytes() });
    const started = performance.now();
    const wrong = [];
    const first = await read(engine.generate(prompt, options));
    if (!sameIds(first.tokenIds, expected)) wrong.push({ run: "first", ids: first.tokenIds });
    const start = await memory();
    for (let i = 0; i < generations; i++) {
      const { tokenIds, error } = await read(engine.generate(prompt, options));
      if (error || !sameIds(tokenIds, expected)) wrong.push({ run: `generation ${i}`, ids: tokenIds, error });
    }
    const afterGenerations = await memory();
    const generationsMs = performance.now() - started;
    const random = randoms(seed);
    const abortedAt = [];
    for (let i = 0; i < aborts; i++) {
      const after = 1 + Math.floor(random() * (expectedAfterAbort.length - 1));
      abortedAt.push(after);
      const controller = new AbortController();
      const aborted = await read(engine.generate(prompt, { ...longer, signal: controller.signal }), {
        stopAfter: after,
        stop: () => controller.abort(),
      });
      const prefix = expectedAfterAbort.slice(0, aborted.tokenIds.length);
      // An abort after the last-but-one token may land after the generation already ended
      // (the worker runs ahead of the reader): then it is whole and ends on its length.
      const endedFirst = aborted.finishReason === "length" && sameIds(aborted.tokenIds, expectedAfterAbort);
      const cancelled = aborted.error?.name === "AbortError" && aborted.finishReason === "cancelled" && sameIds(aborted.tokenIds, prefix);
      if (!endedFirst && !cancelled) {
        wrong.push({ run: `abort ${i} after ${after}`, ids: aborted.tokenIds, error: aborted.error, finishReason: aborted.finishReason });
      }
      const whole = await read(engine.generate(prompt, longer));
      if (whole.error || !sameIds(whole.tokenIds, expectedAfterAbort)) wrong.push({ run: `after abort ${i}`, ids: whole.tokenIds, error: whole.error });
    }
    const end = await memory();
    return { wrong, start, afterGenerations, end, abortedAt, generationsMs, ms: performance.now() - started };
  },

  /**
   * tests/long-session.spec.js: `count` times, a new engine (from `model`, cached) makes one
   * greedy token of `prompt`, which must be `expected[0]`, then is disposed. Reports the live
   * workers and the JS heap after the first and the last cycle, and each engine's wasm memory.
   */
  async disposeCycles({ model, backend, threads, prompt, expected, count }) {
    engine?.dispose();
    engine = null;
    const started = performance.now();
    const wrong = [];
    const wasm = new Set();
    const backends = new Set();
    let first = null;
    for (let i = 0; i < count; i++) {
      const cycle = await createEngine({ model, backend, threads, contextLength: 256 });
      backends.add(cycle.backend);
      const { tokenIds } = await read(cycle.generate(prompt, { maxTokens: 1, temperature: 0, stopTokenIds: [] }));
      if (tokenIds[0] !== expected[0]) wrong.push({ cycle: i, ids: tokenIds });
      wasm.add((await cycle.memoryInfo()).wasmMemoryBytes);
      cycle.dispose();
      if (i === 0) first = { liveWorkers: liveWorkers.size, heap: jsHeapBytes() };
    }
    // A disposed engine's worker is terminated at once; give the page a moment to settle.
    await new Promise((resolve) => setTimeout(resolve, 100));
    const end = { liveWorkers: liveWorkers.size, heap: jsHeapBytes() };
    return { wrong, first, end, wasmMemoryBytes: [...wasm], backends: [...backends], ms: performance.now() - started };
  },

  dispose() {
    engine?.dispose();
    engine = null;
  },

  deleteCached: () => deleteCached(),
  listCached: async () => (await listCached()).map(({ url, bytes }) => ({ url, bytes })),
  /** listCached with each file's sha256 (computed as it downloaded, so it tells the bytes stored). */
  listCachedSha: async () => (await listCached()).map(({ url, bytes, sha256 }) => ({ url, bytes, sha256 })),
  /** Every key in lean-js's cache: complete files, partial downloads' manifests and parts. */
  cacheKeys: async () => (await (await caches.open("lean-models-v1")).keys()).map((r) => r.url),
};
