// The lean-js test page: lean-js's build (packages/lean-js/dist, served at /lean-js/) used as an
// app would use it, unbundled. tests/lean-js.spec.js drives it through `window.leanJs`; every
// call returns plain data (ids, finish reasons, error names), so the test can compare it with
// the fixtures.
import { createEngine, deleteCached, listCached } from "/lean-js/index.js";

let engine = null;
/** `backendchange` events of the engine: {backend, backendReason} after each. */
let backendChanges = [];

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
    return { chat, badError, streamed, cut, after, usable: engine.usable, ms };
  },

  /**
   * Tool calls (tests/lean-js.spec.js): `messages` with `tools` and `tool_choice` (greedy, at most
   * `maxTokens`) through chat.completions, whole and streamed: the calls (without their ids,
   * which are new each time), the content and the finish reason; and the ids through engine.chat.
   */
  async toolCall({ messages, tools, toolChoice, maxTokens }) {
    const request = { messages, tools, tool_choice: toolChoice, max_tokens: maxTokens, temperature: 0 };
    const strip = (calls) => calls?.map(({ index, type, function: f }) => ({ ...(index === undefined ? {} : { index }), type, function: f }));
    const ms = {};
    let t = performance.now();
    const { choices: [choice] } = await engine.chat.completions.create(request);
    const whole = { content: choice.message.content, toolCalls: strip(choice.message.tool_calls), finishReason: choice.finish_reason };
    const ids = choice.message.tool_calls?.map((c) => c.id);
    ms.whole = Math.round(performance.now() - t);
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

  dispose() {
    engine?.dispose();
    engine = null;
  },

  deleteCached: () => deleteCached(),
  listCached: async () => (await listCached()).map(({ url, bytes }) => ({ url, bytes })),
};
