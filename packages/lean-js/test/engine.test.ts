import { describe, expect, it } from "vitest";
import { Engine, type WorkerLike } from "../src/engine.js";
import { ErrorName, fromWireError, toWireError } from "../src/errors.js";
import type { LoadRequest, ModelInfo, Reply, Request } from "../src/protocol.js";
import { toEngineConstraint, toEngineOptions, toEngineTools } from "../src/protocol.js";

const info: ModelInfo = {
  architecture: "llama",
  description: "llama · 30 layers",
  session: "cpu",
  contextLength: 2048,
  trainContextLength: 8192,
  vocabSize: 49152,
  fileBytes: 1,
  kvCacheBytes: 2,
  bosToken: null,
  eosToken: "<|im_end|>",
  eosTokenIds: [2],
  hasChatTemplate: true,
  tokenizerFromGguf: false,
  draftModel: null,
  cachedTokens: 0,
};

const ggufBytes = new ArrayBuffer(8);
const load: Omit<LoadRequest, "type" | "id"> = {
  model: {
    gguf: { name: "m.gguf", source: { bytes: ggufBytes }, size: null, sha256: null },
    tokenizer: { name: "t.json", source: { url: "https://x/t.json" }, size: null, sha256: null },
    tokenizerConfig: null,
    chatTemplate: null,
  },
  backend: "auto",
  contextLength: 2048,
  threads: 2,
  cacheName: "lean",
  gpuNeeds: null,
};

const flush = () => new Promise((resolve) => setTimeout(resolve, 0));

/** The worker's side of the protocol, scripted by the test: it records requests and replies on demand. */
class FakeWorker implements WorkerLike {
  onmessage: ((event: MessageEvent<Reply>) => void) | null = null;
  onerror: ((event: ErrorEvent) => void) | null = null;
  requests: Request[] = [];
  transfers: Transferable[][] = [];
  terminated = false;

  postMessage(message: Request, transfer: Transferable[] = []) {
    this.requests.push(structuredClone(message));
    this.transfers.push(transfer);
  }
  terminate() {
    this.terminated = true;
  }
  reply(reply: Reply) {
    this.onmessage?.({ data: reply } as MessageEvent<Reply>);
  }
  last<T extends Request["type"]>(type: T): Extract<Request, { type: T }> {
    const found = this.requests.filter((r) => r.type === type).at(-1);
    if (!found) throw new Error(`no ${type} request`);
    return found as Extract<Request, { type: T }>;
  }
  of(type: Request["type"]) {
    return this.requests.filter((r) => r.type === type);
  }
}

async function started(): Promise<{ engine: Engine; worker: FakeWorker }> {
  const worker = new FakeWorker();
  const pending = Engine.start(worker, load);
  worker.reply({ type: "loaded", id: 0, backend: "simd", backendReason: "the fastest backend available", info });
  return { engine: await pending, worker };
}

const result = (finishReason: "stop" | "length" | "cancelled", tokenIds: number[]) => ({
  text: "",
  tokenIds,
  promptTokens: 3,
  cachedTokens: 0,
  finishReason,
  stopString: null,
  prefillMs: 1,
  decodeMs: 1,
  prefillTokensPerSecond: 3000,
  decodeTokensPerSecond: 1000,
  speculation: { verifications: 0, draftedTokens: 0, acceptedTokens: 0, pausedSteps: 0 },
});

describe("Engine.start", () => {
  it("sends the load request, transfers ArrayBuffers, reports progress and warnings", async () => {
    const worker = new FakeWorker();
    const progress: unknown[] = [];
    const warnings: string[] = [];
    const pending = Engine.start(worker, load, {
      onProgress: (p) => progress.push(p),
      onWarning: (m) => warnings.push(m),
    });
    expect(worker.requests).toEqual([{ type: "load", id: 0, ...load }]);
    expect(worker.transfers[0]).toEqual([ggufBytes]);
    const p = { file: "gguf", name: "m.gguf", loaded: 4, total: 8, source: "local" } as const;
    worker.reply({ type: "progress", id: 0, progress: p });
    worker.reply({ type: "warning", id: 0, message: "not cached" });
    worker.reply({ type: "loaded", id: 0, backend: "simd", backendReason: "because", info });
    const engine = await pending;
    expect(progress).toEqual([p]);
    expect(warnings).toEqual(["not cached"]);
    expect(engine).toMatchObject({ backend: "simd", backendReason: "because", info, usable: true });
  });

  it("rejects with the worker's error, by name, and ends the worker", async () => {
    const worker = new FakeWorker();
    const pending = Engine.start(worker, load);
    worker.reply({
      type: "error",
      id: 0,
      error: { name: "BackendUnavailableError", message: "the threads backend cannot run here: ..." },
      fatal: false,
    });
    await expect(pending).rejects.toMatchObject({
      name: "BackendUnavailableError",
      message: "the threads backend cannot run here: ...",
    });
    expect(worker.terminated).toBe(true);
  });

  it("rejects when the worker script fails", async () => {
    const worker = new FakeWorker();
    const pending = Engine.start(worker, load);
    worker.onerror?.({ message: "SyntaxError: bad import", preventDefault() {} } as ErrorEvent);
    await expect(pending).rejects.toThrow("the lean worker failed to start: SyntaxError: bad import");
  });
});

describe("Engine.start: the threads backend's pool start is bounded", () => {
  /** Workers made on demand; each answers the load as `script` says. */
  function factory(script: (worker: FakeWorker, request: Extract<Request, { type: "load" }>) => void) {
    const made: FakeWorker[] = [];
    const make = () => {
      const worker = new FakeWorker();
      const post = worker.postMessage.bind(worker);
      worker.postMessage = (message, transfer) => {
        post(message, transfer);
        if (message.type === "load") queueMicrotask(() => script(worker, message));
      };
      made.push(worker);
      return worker;
    };
    return { make, made };
  }
  const hangs = (worker: FakeWorker) => worker.reply({ type: "poolStarting", id: 0, threads: 2 });

  it("falls back to simd after two pool starts that never finish (backend auto), saying why", async () => {
    const { make, made } = factory((worker, request) => {
      if (request.backend !== "simd") return hangs(worker);
      worker.reply({ type: "loaded", id: 0, backend: "simd", backendReason: "requested", info });
    });
    const engine = await Engine.start(make, load, {}, { threadPoolTimeoutMs: 20 });
    expect(made.map((w) => [w.last("load").backend, w.terminated])).toEqual([
      ["auto", true],
      ["auto", true],
      ["simd", false],
    ]);
    expect(engine.backend).toBe("simd");
    expect(engine.backendReason).toBe(
      "the threads backend's pool of 2 Web Workers did not start within 0.02 s, twice, so lean fell back to simd",
    );
  });

  it("a second try on a fresh worker that starts is used as is", async () => {
    const { make, made } = factory((worker) => {
      worker.reply({ type: "poolStarting", id: 0, threads: 2 });
      if (made.length === 1) return;
      worker.reply({ type: "poolStarted", id: 0 });
      worker.reply({ type: "loaded", id: 0, backend: "threads", backendReason: "cross-origin isolated", info });
    });
    const engine = await Engine.start(make, load, {}, { threadPoolTimeoutMs: 20 });
    expect(made.length).toBe(2);
    expect(engine).toMatchObject({ backend: "threads" });
    expect(engine.backendReason).toBe(
      "cross-origin isolated (the threads backend's pool of 2 Web Workers did not start within 0.02 s once; the next try did)",
    );
  });

  it("fails with BackendUnavailableError when threads was asked for", async () => {
    const { make, made } = factory((worker) => hangs(worker));
    await expect(Engine.start(make, { ...load, backend: "threads" }, {}, { threadPoolTimeoutMs: 20 })).rejects.toMatchObject({
      name: "BackendUnavailableError",
      message:
        "the threads backend's pool of 2 Web Workers did not start within 0.02 s, twice: " +
        'choose backend "simd" (or "auto", which falls back to it)',
    });
    expect(made.map((w) => w.terminated)).toEqual([true, true]);
  });

  it("a pool that starts in time is not timed out", async () => {
    const { make, made } = factory((worker) => {
      worker.reply({ type: "poolStarting", id: 0, threads: 2 });
      worker.reply({ type: "poolStarted", id: 0 });
      setTimeout(() => worker.reply({ type: "loaded", id: 0, backend: "threads", backendReason: "isolated", info }), 60);
    });
    const engine = await Engine.start(make, load, {}, { threadPoolTimeoutMs: 20 });
    expect(made.length).toBe(1);
    expect(engine).toMatchObject({ backend: "threads", backendReason: "isolated" });
  });

  it("with one worker given (no factory) a hung pool start is an error", async () => {
    const worker = new FakeWorker();
    const pending = Engine.start(worker, load, {}, { threadPoolTimeoutMs: 20 });
    hangs(worker);
    await expect(pending).rejects.toMatchObject({ name: "BackendUnavailableError" });
    expect(worker.terminated).toBe(true);
  });
});

describe("Engine.generate", () => {
  it("streams tokens and resolves the result", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hello", { maxTokens: 4, temperature: 0.5, stop: ["\n"] });
    const first = stream.next();
    await flush();
    const request = worker.last("generate");
    expect(request).toEqual({
      type: "generate",
      id: request.id,
      prompt: { raw: "Hello" },
      params: { maxTokens: 4, temperature: 0.5, stop: ["\n"] },
    });
    worker.reply({ type: "tokens", id: request.id, tokens: [{ text: " wor", tokenId: 7 }, { text: "ld", tokenId: 8 }] });
    worker.reply({ type: "done", id: request.id, result: result("length", [7, 8]), cachedTokens: 0 });
    expect(await first).toEqual({ done: false, value: { text: " wor", tokenId: 7 } });
    expect(await stream.next()).toEqual({ done: false, value: { text: "ld", tokenId: 8 } });
    expect(await stream.next()).toEqual({ done: true, value: undefined });
    expect(await stream.result).toEqual(result("length", [7, 8]));
  });

  it("sends chat messages as messages, with only role and content", async () => {
    const { engine, worker } = await started();
    const messages = [{ role: "user", content: "Hi", extra: () => 1 }];
    void engine.chat(messages).next();
    await flush();
    expect(worker.last("generate").prompt).toEqual({ messages: [{ role: "user", content: "Hi" }] });
  });

  it("stops the worker's generation when the loop breaks, and settles the result", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hi");
    const seen: number[] = [];
    const consume = (async () => {
      for await (const token of stream) {
        seen.push(token.tokenId);
        if (seen.length === 2) break;
      }
    })();
    await flush();
    const { id } = worker.last("generate");
    worker.reply({ type: "tokens", id, tokens: [{ text: "a", tokenId: 1 }] });
    worker.reply({ type: "tokens", id, tokens: [{ text: "b", tokenId: 2 }] });
    worker.reply({ type: "tokens", id, tokens: [{ text: "c", tokenId: 3 }] });
    await consume;
    expect(seen).toEqual([1, 2]);
    expect(worker.last("cancel")).toEqual({ type: "cancel", id });
    worker.reply({ type: "done", id, result: result("cancelled", [1, 2, 3]), cachedTokens: 0 });
    expect((await stream.result).finishReason).toBe("cancelled");
  });

  it("aborting throws the signal's reason at once, cancels, and the next generation waits for the worker", async () => {
    const { engine, worker } = await started();
    const controller = new AbortController();
    const first = engine.generate("Hi", { signal: controller.signal });
    const firstToken = first.next();
    await flush();
    const firstId = worker.last("generate").id;
    worker.reply({ type: "tokens", id: firstId, tokens: [{ text: "a", tokenId: 1 }] });
    expect((await firstToken).value).toEqual({ text: "a", tokenId: 1 });

    const second = engine.generate("Again");
    const secondToken = second.next();
    const pendingNext = first.next();
    controller.abort();
    await expect(pendingNext).rejects.toMatchObject({ name: "AbortError" });
    expect(worker.of("cancel")).toEqual([{ type: "cancel", id: firstId }]);
    // Queued behind the first until the worker confirms that it ended.
    await flush();
    expect(worker.of("generate")).toHaveLength(1);
    worker.reply({ type: "done", id: firstId, result: result("cancelled", [1]), cachedTokens: 0 });
    expect((await first.result).finishReason).toBe("cancelled");
    await flush();
    const secondId = worker.last("generate").id;
    expect(secondId).not.toBe(firstId);
    worker.reply({ type: "tokens", id: secondId, tokens: [{ text: "x", tokenId: 9 }] });
    expect((await secondToken).value).toEqual({ text: "x", tokenId: 9 });
  });

  it("a generation aborted while queued never reaches the worker", async () => {
    const { engine, worker } = await started();
    const first = engine.generate("one");
    void first.next();
    await flush();
    const controller = new AbortController();
    const queued = engine.generate("two", { signal: controller.signal });
    const queuedNext = queued.next();
    controller.abort(new Error("user left"));
    await expect(queuedNext).rejects.toThrow("user left");
    await expect(queued.result).rejects.toThrow("user left");
    worker.reply({ type: "done", id: worker.last("generate").id, result: result("stop", [2]), cachedTokens: 0 });
    await flush();
    expect(worker.of("generate")).toHaveLength(1);
    // The engine is still ready.
    const third = engine.generate("three");
    void third.next();
    await flush();
    expect(worker.last("generate").prompt).toEqual({ raw: "three" });
  });

  it("an already-aborted signal throws on the first next()", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hi", { signal: AbortSignal.abort() });
    await expect(stream.next()).rejects.toMatchObject({ name: "AbortError" });
    expect(worker.of("generate")).toEqual([]);
  });

  it("starts without being iterated: result settles and unread tokens are kept", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hi");
    await flush();
    const { id } = worker.last("generate");
    worker.reply({ type: "tokens", id, tokens: [{ text: "a", tokenId: 1 }] });
    worker.reply({ type: "done", id, result: result("length", [1]), cachedTokens: 0 });
    expect((await stream.result).tokenIds).toEqual([1]);
    const tokens = [];
    for await (const token of stream) tokens.push(token);
    expect(tokens).toEqual([{ text: "a", tokenId: 1 }]);
  });

  it("a queued generation whose loop is left never reaches the worker", async () => {
    const { engine, worker } = await started();
    const first = engine.generate("one");
    const queued = engine.generate("two");
    await queued.return();
    await flush();
    worker.reply({ type: "done", id: worker.last("generate").id, result: result("stop", [2]), cachedTokens: 0 });
    await first.result;
    await expect(queued.result).rejects.toMatchObject({
      name: "AbortError",
      message: "the generation was stopped before it started",
    });
    expect(worker.of("generate")).toHaveLength(1);
    expect(worker.last("generate").prompt).toEqual({ raw: "one" });
  });

  it("refuses bad arguments before queueing", async () => {
    const { engine } = await started();
    expect(() => engine.generate("Hi", { max_tokens: 3 } as never)).toThrow(
      /unknown generation option 'max_tokens' \(known: maxTokens, .*signal\)/,
    );
    expect(() => engine.generate("Hi", { maxTokens: -1 })).toThrow("maxTokens must be a whole number ≥ 0, got -1");
    expect(() => engine.generate("Hi", { temperature: Number.NaN })).toThrow(/temperature must be a finite number/);
    expect(() => engine.generate("Hi", { stop: [""] })).toThrow("stop must be an array of non-empty strings");
    expect(() => engine.generate(42 as never)).toThrow(/string or an array of \{role, content\}/);
    expect(() => engine.generate([{ role: "user" }] as never)).toThrow("message 0 must be {role: string, content: string}");
  });

  it("a worker error ends the generation with that error; the engine stays usable", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hi");
    const next = stream.next();
    await flush();
    const { id } = worker.last("generate");
    worker.reply({ type: "error", id, error: { name: "Error", message: "invalid argument: top_p must be in (0, 1], got 2" }, fatal: false });
    await expect(next).rejects.toThrow("top_p must be in (0, 1]");
    await expect(stream.result).rejects.toThrow("top_p must be in (0, 1]");
    expect(engine.usable).toBe(true);
  });
});

describe("Engine failure and disposal", () => {
  it("a panic makes the engine unusable and fails everything pending and later", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hi");
    const next = stream.next();
    const tokenize = engine.tokenize("pending");
    await flush();
    const panic = {
      name: "LeanPanicError",
      message: "lean panicked (a bug in lean; reload the module): panicked at src/x.rs:1:1: boom — this engine cannot be used any more",
    };
    worker.reply({ type: "error", id: worker.last("generate").id, error: panic, fatal: true });
    await expect(next).rejects.toMatchObject(panic);
    await expect(tokenize).rejects.toMatchObject({ name: "LeanPanicError" });
    expect(engine.usable).toBe(false);
    expect(engine.failure).toMatchObject(panic);
    expect(worker.terminated).toBe(true);
    await expect(engine.tokenize("later")).rejects.toMatchObject(panic);
    await expect(engine.generate("later").next()).rejects.toMatchObject(panic);
  });

  it("dispose ends the worker and fails pending and later calls", async () => {
    const { engine, worker } = await started();
    const next = engine.generate("Hi").next();
    await flush();
    engine.dispose();
    await expect(next).rejects.toMatchObject({ name: "EngineDisposedError", message: "the engine was disposed" });
    expect(worker.terminated).toBe(true);
    expect(engine.usable).toBe(false);
    await expect(engine.tokenize("x")).rejects.toMatchObject({ name: "EngineDisposedError" });
  });

  it("tokenize is one request and one reply", async () => {
    const { engine, worker } = await started();
    const ids = engine.tokenize("Hello");
    const request = worker.last("tokenize");
    expect(request).toEqual({ type: "tokenize", id: request.id, text: "Hello" });
    worker.reply({ type: "tokenized", id: request.id, ids: [1, 2] });
    expect(await ids).toEqual([1, 2]);
  });
});

describe("Engine.loadDraft", () => {
  /** An engine of its own `info` (loadDraft writes `info.draftModel`). */
  async function startedAlone(): Promise<{ engine: Engine; worker: FakeWorker }> {
    const worker = new FakeWorker();
    const pending = Engine.start(worker, load);
    worker.reply({ type: "loaded", id: 0, backend: "simd", backendReason: "test", info: { ...info } });
    return { engine: await pending, worker };
  }

  it("sends the catalog's file, passes progress and warnings on, and keeps info.draftModel", async () => {
    const { engine, worker } = await startedAlone();
    const progress: unknown[] = [];
    const warnings: string[] = [];
    const loading = engine.loadDraft("smollm2-135m-instruct-q8_0", {
      modelBaseUrl: "https://example.com/models/",
      onProgress: (p) => progress.push(p),
      onWarning: (m) => warnings.push(m),
    });
    await flush();
    const request = worker.last("loadDraft");
    expect(request.draft).toEqual({
      name: "https://example.com/models/smollm2-135m-instruct-q8_0.gguf",
      source: { url: "https://example.com/models/smollm2-135m-instruct-q8_0.gguf" },
      size: 144811072,
      sha256: "0c1d3326cd9793cfb7296113c063dd5c24e2bd734b48ec1a3d01b7158eca9387",
    });
    const p = { file: "draft", name: request.draft.name, loaded: 4, total: 144811072, source: "network" } as const;
    worker.reply({ type: "progress", id: request.id, progress: p });
    worker.reply({ type: "warning", id: request.id, message: "not cached" });
    expect(engine.info.draftModel).toBeNull();
    worker.reply({ type: "draftLoaded", id: request.id, draftModel: "llama · Q8_0 on cpu" });
    expect(await loading).toBe("llama · Q8_0 on cpu");
    expect(engine.info.draftModel).toBe("llama · Q8_0 on cpu");
    expect(progress).toEqual([p]);
    expect(warnings).toEqual(["not cached"]);
  });

  it("runs after the generations queued before it; those queued after wait for it", async () => {
    const { engine, worker } = await startedAlone();
    const before = engine.generate("a");
    const loading = engine.loadDraft({ gguf: "https://example.com/d.gguf", sha256: "AB".repeat(32) });
    const after = engine.generate("b", { speculative: { draft: 4 } });
    await flush();
    expect(worker.of("loadDraft")).toHaveLength(0);
    const first = worker.last("generate");
    worker.reply({ type: "done", id: first.id, result: result("stop", [1]), cachedTokens: 0 });
    await before.result;
    await flush();
    const request = worker.last("loadDraft");
    expect(request.draft).toEqual({
      name: "https://example.com/d.gguf",
      source: { url: "https://example.com/d.gguf" },
      size: null,
      sha256: "ab".repeat(32),
    });
    expect(worker.of("generate")).toHaveLength(1);
    worker.reply({ type: "draftLoaded", id: request.id, draftModel: "d" });
    await loading;
    await flush();
    expect(worker.last("generate").params).toEqual({ speculative: { draft: 4 } });
    worker.reply({ type: "done", id: worker.last("generate").id, result: result("stop", [2]), cachedTokens: 0 });
    await after.result;
  });

  it("a refused draft model rejects with the worker's error; the engine keeps what it had and stays usable", async () => {
    const { engine, worker } = await startedAlone();
    const bytes = new ArrayBuffer(8);
    const loading = engine.loadDraft({ gguf: bytes });
    await flush();
    const request = worker.last("loadDraft");
    expect(request.draft).toEqual({ name: "draft (ArrayBuffer)", source: { bytes }, size: null, sha256: null });
    expect(worker.transfers.at(-1)).toEqual([bytes]);
    const message = "the draft model draft (ArrayBuffer): invalid argument: the draft model's vocabulary has 151936 tokens, the model's 49152";
    worker.reply({ type: "error", id: request.id, error: { name: "Error", message }, fatal: false });
    await expect(loading).rejects.toThrow(message);
    expect(engine).toMatchObject({ usable: true, info: { draftModel: null } });
    const next = engine.generate("c");
    await flush();
    worker.reply({ type: "done", id: worker.last("generate").id, result: result("stop", [3]), cachedTokens: 0 });
    expect((await next.result).tokenIds).toEqual([3]);
  });

  it("a malformed spec is a TypeError before anything is sent", async () => {
    const { engine, worker } = await startedAlone();
    const refused = (draft: unknown) => engine.loadDraft(draft as never);
    await expect(refused("gpt-5")).rejects.toThrow(/^unknown draft model id 'gpt-5' \(known: .*\)/);
    await expect(refused("d.gguf")).rejects.toThrow(/; for a GGUF file give draft: \{ gguf: "d\.gguf" \}$/);
    await expect(refused(new Blob([]))).rejects.toThrow(new TypeError("draft must be a catalog id or { gguf, sha256? }, got Blob"));
    await expect(refused({})).rejects.toThrow(/^draft\.gguf is required/);
    await expect(refused({ gguf: 3 })).rejects.toThrow(/^draft\.gguf must be a URL \(string or URL\), File, Blob, ArrayBuffer or Uint8Array, got number$/);
    await expect(refused({ gguf: "d.gguf", tokenizer: "t.json" })).rejects.toThrow("unknown field 'tokenizer' in draft (known: gguf, sha256)");
    await expect(refused({ gguf: "d.gguf", sha256: "abc" })).rejects.toThrow('draft.sha256 must be 64 hex digits, got "abc"');
    expect(worker.of("loadDraft")).toHaveLength(0);
  });
});

describe("protocol helpers", () => {
  it("errors keep their name and message across the boundary", () => {
    const error = new RangeError("too far");
    expect(fromWireError(toWireError(error))).toMatchObject({ name: "RangeError", message: "too far" });
    expect(toWireError(new DOMException("stop", "AbortError"))).toEqual({ name: "AbortError", message: "stop" });
    expect(toWireError("plain")).toEqual({ name: "Error", message: "plain" });
  });

  it("maps generation options to the engine's snake_case JSON, leaving out unset ones", () => {
    expect(
      toEngineOptions({
        maxTokens: 8,
        temperature: 0.7,
        topK: 40,
        topP: 0.9,
        minP: 0.05,
        repetitionPenalty: 1.1,
        seed: 42,
        stop: ["x"],
        stopTokenIds: [2],
      }),
    ).toEqual({
      max_tokens: 8,
      temperature: 0.7,
      top_k: 40,
      top_p: 0.9,
      min_p: 0.05,
      repetition_penalty: 1.1,
      seed: 42,
      stop_token_ids: [2],
    });
    expect(toEngineOptions({})).toEqual({});
    expect(() => toEngineOptions({ seed: 2 ** 60 })).toThrow(/seed must be at most/);
  });

  it("maps speculative decoding to the engine's lookup and draft, and refuses malformed ones", () => {
    expect(toEngineOptions({ speculative: { lookup: 6 } })).toEqual({ lookup: 6 });
    expect(() => toEngineOptions({ speculative: { lookup: 0 } })).toThrow(/at least 1/);
    expect(() => toEngineOptions({ speculative: { lookup: 2.5 } })).toThrow(/whole number/);
    expect(toEngineOptions({ speculative: { prediction: "def f():" } })).toEqual({ prediction: "def f():" });
    expect(() => toEngineOptions({ speculative: {} })).toThrow(/lookup\?: n.*\{ draft: n \}/);
    expect(() => toEngineOptions({ speculative: null as never })).toThrow(/lookup\?: n/);
    expect(() => toEngineOptions({ speculative: { drafts: 4 } as never })).toThrow(/lookup\?: n.*\{ draft: n \}/);
    // A draft model's guesses: `draft` in the engine's options, its length a whole number ≥ 1.
    expect(toEngineOptions({ maxTokens: 9, speculative: { draft: 4 } })).toEqual({ max_tokens: 9, draft: 4 });
    const bad = (speculative: unknown) => () => toEngineOptions({ speculative: speculative as never });
    expect(bad({ draft: "x" })).toThrow(new TypeError("speculative.draft must be a finite number, got x"));
    expect(bad({ draft: 2.5 })).toThrow(new TypeError("speculative.draft must be a whole number ≥ 0, got 2.5"));
    expect(bad({ draft: 0 })).toThrow(new TypeError("speculative.draft must be at least 1"));
    expect(bad({ draft: 4, lookup: 4 })).toThrow(/speculative.draft does not combine with lookup or prediction/);
    expect(bad({ draft: 4, prediction: "x" })).toThrow(/speculative.draft does not combine with lookup or prediction/);
    // Under a constraint too: the engine cuts guesses where the format refuses them.
    expect(toEngineOptions({ responseFormat: { type: "json_object" }, speculative: { draft: 4 } })).toEqual({
      constraint: { type: "json_object" },
      draft: 4,
    });
  });
});

describe("responseFormat (constrained decoding)", () => {
  const schema = { type: "object", properties: { a: { type: "integer" } }, required: ["a"] };

  it("maps each format to the engine's constraint JSON", () => {
    expect(toEngineOptions({ responseFormat: { type: "json_object" } })).toEqual({ constraint: { type: "json_object" } });
    expect(
      toEngineOptions({ maxTokens: 9, responseFormat: { type: "json_schema", json_schema: { name: "a", schema, strict: true } } }),
    ).toEqual({ max_tokens: 9, constraint: { type: "json_schema", schema } });
    expect(toEngineOptions({ responseFormat: { type: "json_schema", json_schema: { name: "any", schema: true } } })).toEqual({
      constraint: { type: "json_schema", schema: true },
    });
    // OpenAI's default schema: any object.
    expect(toEngineOptions({ responseFormat: { type: "json_schema", json_schema: { name: "x" } } })).toEqual({
      constraint: { type: "json_object" },
    });
    expect(toEngineOptions({ responseFormat: { type: "regex", pattern: "[0-9]+" } })).toEqual({
      constraint: { type: "regex", pattern: "[0-9]+" },
    });
    expect(toEngineOptions({ responseFormat: { type: "grammar", lark: 'start: "yes" | "no"' } })).toEqual({
      constraint: { type: "grammar", lark: 'start: "yes" | "no"' },
    });
    expect(toEngineOptions({ responseFormat: { type: "text" } })).toEqual({});
    expect(toEngineConstraint(undefined)).toBeNull();
    expect(toEngineConstraint(null)).toBeNull();
  });

  it("refuses a malformed format, naming the field", () => {
    const bad = (format: unknown) => () => toEngineOptions({ responseFormat: format as never });
    expect(bad("json")).toThrow(/responseFormat must be an object with a string 'type' \("text", "json_object", "json_schema", "regex", "grammar"\)/);
    expect(bad({ type: "json" })).toThrow('responseFormat.type must be one of "text", "json_object", "json_schema", "regex", "grammar", got "json"');
    expect(bad({ type: "json_schema" })).toThrow("responseFormat.json_schema must be an object { name, schema, strict? }");
    expect(bad({ type: "json_schema", schema })).toThrow("unknown field 'schema' in responseFormat of type \"json_schema\" (known: type, json_schema)");
    expect(bad({ type: "json_schema", json_schema: { name: 3, schema } })).toThrow("responseFormat.json_schema.name must be a string");
    expect(bad({ type: "json_schema", json_schema: { schema, strict: "yes" } })).toThrow("json_schema.strict must be a boolean");
    expect(bad({ type: "json_schema", json_schema: { schema: "{}" } })).toThrow(/json_schema.schema must be a JSON schema object, got "\{\}"/);
    expect(bad({ type: "json_schema", json_schema: { schema, schemas: 1 } })).toThrow("unknown field 'schemas' in responseFormat.json_schema");
    expect(bad({ type: "regex" })).toThrow("responseFormat.pattern must be a non-empty string");
    expect(bad({ type: "regex", regex: "a" })).toThrow("unknown field 'regex' in responseFormat of type \"regex\" (known: type, pattern)");
    expect(bad({ type: "grammar", lark: "" })).toThrow("responseFormat.lark must be a non-empty string (a Lark grammar)");
  });

  it("generate and chat send it to the worker; a bad one throws before queueing", async () => {
    const { engine, worker } = await started();
    const responseFormat = { type: "json_schema", json_schema: { name: "a", schema } } as const;
    const stream = engine.chat([{ role: "user", content: "Hi" }], { maxTokens: 8, responseFormat });
    await flush();
    expect(worker.last("generate").params).toEqual({ maxTokens: 8, responseFormat });
    worker.reply({ type: "done", id: worker.last("generate").id, result: result("stop", [5]), cachedTokens: 4 });
    await stream.result;
    expect(() => engine.generate("Hi", { responseFormat: { type: "regex" } as never })).toThrow("responseFormat.pattern");
    expect(worker.of("generate")).toHaveLength(1);
  });

  it("a format the library rejects ends the generation with a ConstraintError; the engine stays usable", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("Hi", { responseFormat: { type: "json_schema", json_schema: { name: "x", schema: { type: "strng" } } } });
    await flush();
    const { id } = worker.last("generate");
    const message = 'invalid json_schema: unknown type: "strng"';
    worker.reply({ type: "error", id, error: { name: ErrorName.Constraint, message }, fatal: false });
    await expect(stream.result).rejects.toMatchObject({ name: "ConstraintError", message });
    expect(engine.usable).toBe(true);
  });
});

describe("engine.chat.completions (OpenAI's shape)", () => {
  const messages = [{ role: "user", content: "Hi" }];
  /** Replies to the engine's next generate with `texts` as tokens, then done. */
  async function answer(worker: FakeWorker, texts: string[], finish: "stop" | "length", cachedTokens: number) {
    await flush();
    const request = worker.last("generate");
    worker.reply({ type: "tokens", id: request.id, tokens: texts.map((text, i) => ({ text, tokenId: 10 + i })) });
    const done = { ...result(finish, texts.map((_, i) => 10 + i)), text: texts.join(""), cachedTokens };
    worker.reply({ type: "done", id: request.id, result: done, cachedTokens: 40 });
    return request;
  }

  it("passes a prediction on as speculative decoding's guesses and refuses a malformed one", async () => {
    const { engine, worker } = await started();
    const pending = engine.chat.completions.create({
      messages,
      temperature: 0,
      prediction: { type: "content", content: [{ type: "text", text: "def f" }, { type: "text", text: "():" }] },
    });
    const request = await answer(worker, ["def"], "stop", 0);
    expect(request.params).toMatchObject({ speculative: { prediction: "def f():" } });
    await pending;
    await expect(
      engine.chat.completions.create({ messages, prediction: { type: "text", content: "x" } } as never),
    ).rejects.toThrow(/prediction.type must be "content"/);
  });

  it("passes lean's speculative option on, with a prediction's guesses, and refuses what does not combine", async () => {
    const { engine, worker } = await started();
    const pending = engine.chat.completions.create({ messages, temperature: 0, speculative: { draft: 4 } });
    expect((await answer(worker, ["Hi"], "stop", 0)).params).toMatchObject({ speculative: { draft: 4 } });
    await pending;
    const predicted = engine.chat.completions.create({
      messages,
      temperature: 0,
      speculative: { lookup: 6 },
      prediction: { type: "content", content: "def f():" },
    });
    const request = await answer(worker, ["def"], "stop", 0);
    expect(request.params).toMatchObject({ speculative: { lookup: 6, prediction: "def f():" } });
    await predicted;
    const refused = (params: Record<string, unknown>) => engine.chat.completions.create({ messages, ...params } as never);
    await expect(refused({ speculative: { draft: 4 }, prediction: { type: "content", content: "x" } })).rejects.toThrow(
      /speculative.draft does not combine with lookup or prediction/,
    );
    await expect(refused({ speculative: { lookup: 0 } })).rejects.toThrow(/at least 1/);
    await expect(refused({ speculative: 8 })).rejects.toThrow(/speculative must be \{ lookup: n \} or \{ draft: n \}/);
    // A format or a required call speculates too (the engine cuts guesses where they refuse).
    const tool = { type: "function", function: { name: "f", parameters: { type: "object" } } } as const;
    const formatted = engine.chat.completions.create({
      messages,
      temperature: 0,
      speculative: { lookup: 4 },
      prediction: { type: "content", content: '{"a": 1}' },
      response_format: { type: "json_object" },
    });
    expect((await answer(worker, ['{"a": 1}'], "stop", 0)).params).toMatchObject({
      speculative: { lookup: 4, prediction: '{"a": 1}' },
      responseFormat: { type: "json_object" },
    });
    await formatted;
    const called = engine.chat.completions.create({ messages, temperature: 0, speculative: { lookup: 4 }, tools: [tool], tool_choice: "required" });
    expect((await answer(worker, ["x"], "stop", 0)).params).toMatchObject({ speculative: { lookup: 4 }, toolChoice: "required" });
    await called;
  });

  it("returns a ChatCompletion with OpenAI's fields, usage and cached tokens", async () => {
    const { engine, worker } = await started();
    const pending = engine.chat.completions.create({
      messages: [{ role: "developer", content: [{ type: "text", text: "Be brief." }] }, ...messages],
      model: "smollm2",
      max_tokens: 4,
      temperature: 0,
      stop: "\n\n",
    });
    const request = await answer(worker, ["Hel", "lo"], "stop", 2);
    expect(request.prompt).toEqual({ messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }] });
    expect(request.params).toEqual({ maxTokens: 4, temperature: 0, stop: ["\n\n"] });
    const completion = await pending;
    expect(completion).toMatchObject({
      object: "chat.completion",
      model: "smollm2",
      choices: [{ index: 0, message: { role: "assistant", content: "Hello", refusal: null }, finish_reason: "stop", logprobs: null }],
      usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, prompt_tokens_details: { cached_tokens: 2 } },
      lean: { dropped_messages: 0 },
    });
    expect(completion.id).toMatch(/^chatcmpl-[0-9a-f]{24}$/);
    expect(engine.info.cachedTokens).toBe(40);
  });

  it("streams chunks: the role, the text, the finish reason, then the usage", async () => {
    const { engine, worker } = await started();
    const pending = engine.chat.completions.create({ messages, stream: true, stream_options: { include_usage: true } });
    await answer(worker, ["a", "", "b"], "length", 0);
    const chunks = [];
    for await (const chunk of await pending) chunks.push(chunk);
    expect(worker.last("generate").params).toEqual({ maxTokens: info.contextLength, temperature: 1 });
    expect(chunks.map((c) => [c.choices[0]?.delta, c.choices[0]?.finish_reason, c.usage])).toEqual([
      [{ role: "assistant", content: "" }, null, null],
      [{ content: "a" }, null, null],
      [{ content: "b" }, null, null],
      [{}, "length", null],
      [undefined, undefined, { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6, prompt_tokens_details: { cached_tokens: 0 },
        completion_tokens_details: { accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 } }],
    ]);
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(chunks.every((c) => c.object === "chat.completion.chunk")).toBe(true);
  });

  it("passes response_format on as responseFormat and maps an unfinished constraint to finish_reason length", async () => {
    const { engine, worker } = await started();
    const response_format = {
      type: "json_schema",
      json_schema: { name: "answer", schema: { type: "object", properties: { a: { type: "integer" } } }, strict: true },
    } as const;
    const pending = engine.chat.completions.create({ messages, temperature: 0, max_tokens: 2, response_format });
    const request = await answer(worker, ['{"', "a"], "length", 0);
    expect(request.params).toEqual({ maxTokens: 2, temperature: 0, responseFormat: response_format });
    expect((await pending).choices[0]).toMatchObject({ message: { content: '{"a' }, finish_reason: "length" });

    const streamed = engine.chat.completions.create({ messages, stream: true, response_format: { type: "regex", pattern: "ab?" } });
    const streamedRequest = await answer(worker, ["a", "b"], "stop", 0);
    expect(streamedRequest.params).toMatchObject({ responseFormat: { type: "regex", pattern: "ab?" } });
    const chunks = [];
    for await (const chunk of await streamed) chunks.push(chunk);
    expect(chunks.at(-1)?.choices[0]?.finish_reason).toBe("stop");

    // { type: "text" } is free text: no constraint sent.
    const text = engine.chat.completions.create({ messages, response_format: { type: "text" } });
    expect((await answer(worker, ["x"], "stop", 0)).params).not.toHaveProperty("responseFormat");
    await text;
    await expect(
      engine.chat.completions.create({ messages, response_format: { type: "json_schema", json_schema: { name: "x", schema: [] } } as never }),
    ).rejects.toThrow("response_format.json_schema.schema must be a JSON schema object, got []");
    await expect(engine.chat.completions.create({ messages, response_format: { type: "xml" } as never })).rejects.toThrow(
      'response_format.type must be one of "text", "json_object", "json_schema", "regex", "grammar", got "xml"',
    );
  });

  it("refuses what it would not honour, naming it", async () => {
    const { engine } = await started();
    const create = engine.chat.completions.create.bind(engine.chat.completions);
    await expect(create({ messages, n: 2 })).rejects.toThrow("n must be 1");
    await expect(create({ messages, logprobs: true } as never)).rejects.toThrow("parameter 'logprobs' is not supported");
    await expect(create({ messages, functions: [{ name: "f" }] } as never)).rejects.toThrow("parameter 'functions'");
    await expect(create({ messages, presence_penalty: 0.5 } as never)).rejects.toThrow("parameter 'presence_penalty'");
    await expect(create({ messages: [] })).rejects.toThrow("messages must be a non-empty array");
    await expect(create({ messages, max_tokens: 0 })).rejects.toThrow("max_tokens must be a whole number");
    await expect(
      create({ messages: [{ role: "user", content: [{ type: "image_url" } as never] }] }),
    ).rejects.toThrow("only text parts are supported");
  });

  it("truncation auto drops the oldest whole turns after the system message until the prompt fits", async () => {
    const { engine, worker } = await started();
    const turns = [
      { role: "system", content: "S" },
      { role: "user", content: "u1" },
      { role: "assistant", content: "a1" },
      { role: "user", content: "u2" },
      { role: "assistant", content: "a2" },
      { role: "user", content: "u3" },
    ];
    // The context holds 2048 tokens: each message "costs" 600 here, and 200 are asked for.
    const answerCacheInfo = async () => {
      await flush();
      const request = worker.last("cacheInfo");
      const count = request.prompt && "messages" in request.prompt ? request.prompt.messages.length : 0;
      worker.reply({ type: "cacheInfo", id: request.id, info: { cachedTokens: 0, promptTokens: 600 * count, reusableTokens: 0 } });
    };
    const pending = engine.chat.completions.create({ messages: turns, max_tokens: 200, temperature: 0, truncation: "auto" });
    for (let i = 0; i < 3; i++) await answerCacheInfo(); // 6 messages, then 4, then 2... until 3600 -> 2400 -> 1200
    const request = await answer(worker, ["ok"], "stop", 0);
    expect(request.prompt).toEqual({
      messages: [
        { role: "system", content: "S" },
        { role: "user", content: "u3" },
      ],
    });
    expect((await pending).lean).toEqual({ dropped_messages: 4 });

    const tooLong = engine.chat.completions.create({ messages: [{ role: "user", content: "long" }], max_tokens: 2000, truncation: "auto" });
    await flush();
    const check = worker.last("cacheInfo");
    worker.reply({ type: "cacheInfo", id: check.id, info: { cachedTokens: 0, promptTokens: 600, reusableTokens: 0 } });
    await expect(tooLong).rejects.toThrow("the prompt needs 600 tokens and max_tokens 2000 more, but the context holds 2048");
  });

  it("resetChat and cacheInfo wait for queued generations and keep info.cachedTokens current", async () => {
    const { engine, worker } = await started();
    const stream = engine.generate("x");
    const reset = engine.resetChat();
    await answer(worker, ["y"], "stop", 0);
    await stream.result;
    expect(engine.info.cachedTokens).toBe(40);
    await flush();
    const resetRequest = worker.last("resetCache");
    worker.reply({ type: "cacheReset", id: resetRequest.id });
    await reset;
    expect(engine.info.cachedTokens).toBe(0);
    const pending = engine.cacheInfo(messages);
    await flush();
    const infoRequest = worker.last("cacheInfo");
    expect(infoRequest.prompt).toEqual({ messages });
    worker.reply({ type: "cacheInfo", id: infoRequest.id, info: { cachedTokens: 0, promptTokens: 9, reusableTokens: 0 } });
    expect(await pending).toEqual({ cachedTokens: 0, promptTokens: 9, reusableTokens: 0 });
  });
});

describe("tools (tool calls)", () => {
  const weather = {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  } as const;
  const now = { type: "function", function: { name: "now" } } as const;
  const call = { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } } as const;

  it("maps tools and toolChoice to the engine's options and says when a call is forced", () => {
    expect(toEngineOptions({ tools: [weather], toolChoice: "required" })).toEqual({ tools: [weather], tool_choice: "required" });
    expect(toEngineOptions({ tools: [weather, now] })).toEqual({ tools: [weather, now] });
    expect(toEngineTools([weather], { type: "function", function: { name: "get_weather" } })).toEqual({
      tools: [weather],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      forced: true,
    });
    expect(toEngineTools([weather], "auto")?.forced).toBe(false);
    // "none", or no tools: nothing is sent.
    expect(toEngineOptions({ tools: [weather], toolChoice: "none" })).toEqual({});
    expect(toEngineOptions({ tools: [], toolChoice: "auto" })).toEqual({});
    expect(toEngineTools(undefined, undefined)).toBeNull();
  });

  it("refuses bad tools and tool choices with a ToolError naming the field", () => {
    const cases: [unknown, unknown, string][] = [
      [{ a: 1 }, undefined, "tools must be an array"],
      [[3], undefined, "tools[0] must be an object"],
      [[{ type: "retrieval" }], undefined, 'tools[0] has type "retrieval": lean takes "function" tools only'],
      [[{ type: "function" }], undefined, "tools[0].function must be an object"],
      [[{ type: "function", function: { name: "a b" } }], undefined, "tools[0].function.name must be 1 to 64"],
      [[{ type: "function", function: { name: "f", parameters: 3 } }], undefined, "tools[0].function.parameters must be a JSON schema object"],
      [[now, now], undefined, "tools[1]: the function name 'now' is given twice"],
      [[now], "sometimes", 'toolChoice must be "auto", "none", "required"'],
      [[now], { type: "function", function: { name: "get_weather" } }, "toolChoice names the function 'get_weather', which is not among tools"],
      [[now], { type: "function" }, "toolChoice as an object must be"],
      [[], "required", "toolChoice requires tools"],
    ];
    for (const [tools, toolChoice, message] of cases) {
      let error: unknown;
      try {
        toEngineOptions({ tools, toolChoice } as never);
      } catch (e) {
        error = e;
      }
      expect(error, message).toMatchObject({ name: ErrorName.Tool, message: expect.stringContaining(message) });
    }
    expect(() => toEngineOptions({ tools: [weather], toolChoice: "required", responseFormat: { type: "json_object" } })).toThrow(
      /does not combine with responseFormat/,
    );
    // A forced call speculates too: the engine cuts guesses where the call's grammar refuses them.
    expect(toEngineOptions({ tools: [weather], toolChoice: "required", speculative: { lookup: 4 } })).toMatchObject({
      lookup: 4,
      tool_choice: "required",
    });
    const named = { type: "function", function: { name: "get_weather" } } as const;
    expect(toEngineOptions({ tools: [weather], toolChoice: named, speculative: { draft: 4 } })).toMatchObject({ draft: 4 });
    // A model-chosen call combines with both.
    expect(toEngineOptions({ tools: [weather], speculative: { lookup: 4 } })).toMatchObject({ lookup: 4, tools: [weather] });
    expect(toEngineOptions({ tools: [weather], speculative: { draft: 4 } })).toMatchObject({ draft: 4, tools: [weather] });
  });

  it("sends calls and tool results as messages; tools with a raw prompt are a ToolError", async () => {
    const { engine, worker } = await started();
    const history = [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [call], extra: 1 },
      { role: "tool", content: "22 C", tool_call_id: "call_1" },
      { role: "assistant", content: null, tool_calls: [{ type: "function", function: { name: "now", arguments: {} } }] },
    ];
    void engine.chat(history as never, { tools: [weather, now] }).next();
    await flush();
    const request = worker.last("generate");
    expect(request.prompt).toEqual({
      messages: [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", content: null, tool_calls: [call] },
        { role: "tool", content: "22 C", tool_call_id: "call_1" },
        { role: "assistant", content: null, tool_calls: [{ type: "function", function: { name: "now", arguments: "{}" } }] },
      ],
    });
    expect(request.params).toEqual({ tools: [weather, now] });
    let raw: unknown;
    try {
      engine.generate("Hi", { tools: [weather] });
    } catch (e) {
      raw = e;
    }
    expect(raw).toMatchObject({ name: ErrorName.Tool, message: expect.stringMatching(/^tools apply to a chat/) });
    expect(() => engine.chat([{ role: "user", content: "x", tool_calls: 3 }] as never)).toThrow(/tool_calls must be an array/);
  });

  it("chat.completions: a call is message.tool_calls with content null and finish_reason tool_calls", async () => {
    const { engine, worker } = await started();
    const messages = [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", content: [{ type: "text" as const, text: "22 C" }], tool_call_id: "call_1" },
      { role: "user", content: "And tomorrow?" },
    ];
    const pending = engine.chat.completions.create({ messages, temperature: 0, tools: [weather], tool_choice: "required" });
    await flush();
    const request = worker.last("generate");
    expect(request.prompt).toEqual({
      messages: [messages[0], messages[1], { role: "tool", content: "22 C", tool_call_id: "call_1" }, messages[3]],
    });
    expect(request.params).toEqual({ maxTokens: info.contextLength, temperature: 0, tools: [weather], toolChoice: "required" });
    const done = { ...result("stop", [10, 11]), finishReason: "tool_calls" as const, text: "\n", toolCalls: [call] };
    worker.reply({ type: "done", id: request.id, result: done, cachedTokens: 4 });
    expect((await pending).choices[0]).toEqual({
      index: 0,
      message: { role: "assistant", content: null, refusal: null, tool_calls: [call] },
      finish_reason: "tool_calls",
      logprobs: null,
    });
  });

  it("chat.completions streamed: the text, one delta.tool_calls chunk with indexes, then finish_reason tool_calls", async () => {
    const { engine, worker } = await started();
    const pending = engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], stream: true, tools: [weather, now] });
    await flush();
    const request = worker.last("generate");
    expect(request.params).toMatchObject({ tools: [weather, now] });
    expect(request.params).not.toHaveProperty("toolChoice");
    worker.reply({ type: "tokens", id: request.id, tokens: [{ text: "Let me look.", tokenId: 10 }, { text: "", tokenId: 11 }] });
    const second = { ...call, id: "call_2", function: { name: "now", arguments: "{}" } };
    const done = { ...result("stop", [10, 11]), finishReason: "tool_calls" as const, text: "Let me look.", toolCalls: [call, second] };
    worker.reply({ type: "done", id: request.id, result: done, cachedTokens: 4 });
    const chunks = [];
    for await (const chunk of await pending) chunks.push(chunk);
    expect(chunks.map((c) => [c.choices[0]?.delta, c.choices[0]?.finish_reason])).toEqual([
      [{ role: "assistant", content: "" }, null],
      [{ content: "Let me look." }, null],
      [{ tool_calls: [{ index: 0, ...call }, { index: 1, ...second }] }, null],
      [{}, "tool_calls"],
    ]);
  });

  it("chat.completions: tool_choice none sends no tools; bad tools are a ToolError before anything is queued", async () => {
    const { engine, worker } = await started();
    const messages = [{ role: "user", content: "Hi" }];
    const pending = engine.chat.completions.create({ messages, tools: [weather], tool_choice: "none" });
    await flush();
    const request = worker.last("generate");
    expect(request.params).not.toHaveProperty("tools");
    worker.reply({ type: "done", id: request.id, result: { ...result("stop", [1]), text: "Hello" }, cachedTokens: 1 });
    expect((await pending).choices[0]?.message).toEqual({ role: "assistant", content: "Hello", refusal: null });
    const generates = worker.of("generate").length;
    const create = engine.chat.completions.create.bind(engine.chat.completions);
    await expect(create({ messages, tools: [weather], tool_choice: { type: "function", function: { name: "nope" } } })).rejects.toMatchObject({
      name: ErrorName.Tool,
      message: "tool_choice names the function 'nope', which is not among tools",
    });
    await expect(create({ messages, tools: [{ type: "code_interpreter" }] } as never)).rejects.toMatchObject({ name: ErrorName.Tool });
    await expect(
      create({ messages, tools: [weather], tool_choice: "required", response_format: { type: "json_object" } }),
    ).rejects.toThrow(/does not combine with response_format/);
    await expect(create({ messages: [{ role: "user", content: null }] } as never)).rejects.toThrow(/content must be a string/);
    expect(worker.of("generate").length).toBe(generates);
  });

  it("truncation counts the tools and drops a whole turn with its calls and results", async () => {
    const { engine, worker } = await started();
    const turns = [
      { role: "system", content: "S" },
      { role: "user", content: "u1" },
      { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", content: "r1", tool_call_id: "call_1" },
      { role: "assistant", content: "a1" },
      { role: "user", content: "u2" },
    ];
    const pending = engine.chat.completions.create({ messages: turns, max_tokens: 200, tools: [weather], truncation: "auto" });
    for (const count of [6, 2]) {
      await flush();
      const request = worker.last("cacheInfo");
      expect(request.prompt && "messages" in request.prompt ? request.prompt.messages.length : 0).toBe(count);
      expect(request.params).toEqual({ tools: [weather] });
      worker.reply({ type: "cacheInfo", id: request.id, info: { cachedTokens: 0, promptTokens: 600 * count, reusableTokens: 0 } });
    }
    await flush();
    const request = worker.last("generate");
    expect(request.prompt).toEqual({ messages: [turns[0], turns[5]] });
    worker.reply({ type: "done", id: request.id, result: { ...result("stop", [1]), text: "ok" }, cachedTokens: 1 });
    expect((await pending).lean).toEqual({ dropped_messages: 4 });
  });
});
