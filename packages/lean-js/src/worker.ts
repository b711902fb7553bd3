/**
 * The Web Worker that runs lean: it picks the backend, loads the WebAssembly build, streams the
 * model files into wasm memory (and from there, for WebGPU, into GPU buffers), and generates token
 * by token. Between tokens it returns to its event loop, which is how a `cancel` message gets in,
 * and how a WebGPU step's result comes back.
 */
import { openModelFile, type OpenedFile } from "./cache.js";
import { chooseBackend, detectCapabilities } from "./capabilities.js";
import { ErrorName, leanError, toWireError } from "./errors.js";
import type {
  Backend,
  GenerationResult,
  LoadRequest,
  ModelFileRole,
  ModelInfo,
  Reply,
  Request,
  Token,
  WireFile,
  WirePrompt,
  GenerateParams,
} from "./protocol.js";
import { toEngineOptions } from "./protocol.js";
import { StopMatcher } from "./stop.js";
import { wasmBuilds } from "./wasm-builds.js";
import { installedBuilds } from "./wasm-manifest.js";
import type { StepJson, WasmEngineHandle, WasmModule } from "./wasm-types.js";

interface WorkerScope {
  postMessage(message: Reply): void;
  onmessage: ((event: MessageEvent<Request>) => void) | null;
  addEventListener?(type: "error", listener: (event: ErrorEvent) => void): void;
}
const scope = globalThis as unknown as WorkerScope;

/** Largest piece handed to wasm at once: wasm-bindgen copies each through a temporary buffer. */
const MAX_PUSH_BYTES = 8 * 1024 * 1024;
/** Progress messages at most this often (plus the last one). */
const PROGRESS_INTERVAL_MS = 100;

let wasm: WasmModule | null = null;
let engine: WasmEngineHandle | null = null;
/** The loaded build's memory (shared with the pool in the threads build). */
let wasmMemory: WebAssembly.Memory | null = null;
/** Set once the module trapped: every later request fails with it. */
let broken: Error | null = null;
/** The generation in progress and whether a cancel arrived for it. */
let active: { id: number; cancelled: boolean } | null = null;
/**
 * The load request and the draft model's file, kept to read them again for a CPU engine when the
 * GPU device is lost.
 */
let loaded: { request: LoadRequest; backend: Backend; draft: WireFile | null } | null = null;

const post = (reply: Reply) => scope.postMessage(reply);

/** Rejects the wasm call in progress (see `untilTrapped`). */
let rejectPending: ((e: unknown) => void) | null = null;

/**
 * The wasm module's async calls (`begin`, `step`, `finishGpu`) run in microtasks queued by
 * wasm-bindgen-futures: a trap (a Rust panic, with panic=abort) there never rejects the call's
 * Promise, it reaches the worker's "error" event instead. This hands it to the pending call.
 */
scope.addEventListener?.("error", (event) => {
  if (event.error instanceof WebAssembly.RuntimeError && rejectPending) {
    event.preventDefault();
    rejectPending(event.error);
  }
});

/** `call`'s result, or a rejection with the trap that ended it inside a microtask. */
function untilTrapped<T>(call: Promise<T>): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    rejectPending = reject;
    call.then(resolve, reject);
  }).finally(() => {
    rejectPending = null;
  });
}

/**
 * What the threads build's startWorkers (scripts/pool-workers.js) sends to make a new instance of
 * this worker a thread of its pool; the thread answers "wasm_bindgen_worker_ready", or
 * "wasm_bindgen_worker_error" when it cannot start.
 */
interface PoolThreadInit {
  type: "wasm_bindgen_worker_init";
  module: WebAssembly.Module;
  memory: WebAssembly.Memory;
  receiver: number;
}

scope.onmessage = (event) => {
  const request = event.data as Request | PoolThreadInit;
  if (request.type === "wasm_bindgen_worker_init") {
    startPoolThread(request).catch((e: unknown) => {
      (scope as unknown as Worker).postMessage({ type: "wasm_bindgen_worker_error", message: String(e) });
    });
    return;
  }
  if (request.type === "cancel") {
    if (active?.id === request.id) active.cancelled = true;
    return;
  }
  handle(request).catch((e: unknown) => reportError(request.id, e));
};

async function handle(request: Exclude<Request, { type: "cancel" }>): Promise<void> {
  if (broken) throw broken;
  switch (request.type) {
    case "load":
      return load(request);
    case "generate":
      return generate(request.id, request.prompt, request.params);
    case "tokenize":
      post({ type: "tokenized", id: request.id, ids: Array.from(loadedEngine().tokenize(request.text)) });
      return;
    case "cacheInfo": {
      if (active) throw new Error(`generation ${active.id} is still running`);
      const options = request.params ? JSON.stringify(toEngineOptions(request.params)) : null;
      const json = loadedEngine().cacheInfo(request.prompt ? JSON.stringify(request.prompt) : null, options);
      const info = JSON.parse(json) as { cache_length: number; prompt_tokens?: number; reusable_tokens?: number };
      post({
        type: "cacheInfo",
        id: request.id,
        info: {
          cachedTokens: info.cache_length,
          ...(info.prompt_tokens === undefined ? {} : { promptTokens: info.prompt_tokens, reusableTokens: info.reusable_tokens }),
        },
      });
      return;
    }
    case "memoryInfo":
      post({ type: "memoryInfo", id: request.id, info: { wasmMemoryBytes: wasmMemory?.buffer.byteLength ?? 0 } });
      return;
    case "resetCache":
      if (active) throw new Error(`generation ${active.id} is still running`);
      loadedEngine().resetCache();
      post({ type: "cacheReset", id: request.id });
      return;
    case "loadDraft": {
      if (active) throw new Error(`generation ${active.id} is still running`);
      if (!loaded) throw new Error("no model is loaded");
      const draftModel = await addDraft(loadedEngine(), request.draft, loaded.request.cacheName, request.id);
      loaded = { ...loaded, draft: request.draft };
      if (loaded.backend === "webgpu") {
        post({
          type: "warning",
          id: request.id,
          message:
            "the draft model runs on the CPU (simd) beside WebGPU: lean asks it for its guesses synchronously, " +
            "and WebGPU answers only through the event loop; on a fast GPU speculation by it may be slower than without",
        });
      }
      post({ type: "draftLoaded", id: request.id, draftModel });
      return;
    }
  }
}

function loadedEngine(): WasmEngineHandle {
  if (!engine) throw new Error("no model is loaded");
  return engine;
}

/**
 * A trap (`RuntimeError`) leaves the module's memory in an unknown state: the worker refuses
 * everything after it. A Rust panic left its message with the panic hook; a trap without one is
 * most likely an allocation that failed (wasm32 memory is at most 4 GiB).
 */
function reportError(id: number, e: unknown): void {
  if (e instanceof WebAssembly.RuntimeError) {
    const panic = wasm?.takePanicMessage();
    broken = leanError(
      ErrorName.Panic,
      `${panic ?? `the WebAssembly module trapped (${e.message}) without a Rust panic: most likely it ran out of memory`}` +
        " — this engine cannot be used any more: create a new one (or reload the page)",
    );
    post({ type: "error", id, error: toWireError(broken), fatal: true });
    return;
  }
  post({ type: "error", id, error: toWireError(e), fatal: broken !== null });
}

async function load(request: LoadRequest): Promise<void> {
  if (engine) throw new Error("this worker already has a model");
  const caps = await detectCapabilities({ webgpu: installedBuilds.webgpu });
  const decision = chooseBackend(request.backend, caps, installedBuilds, request.gpuNeeds);
  const loadBuild = wasmBuilds[decision.backend];
  if (!loadBuild) throw leanError(ErrorName.BackendUnavailable, `no ${decision.backend} build is installed`);
  wasm = await loadBuild();
  wasmMemory = ((await wasm.default()) as { memory?: WebAssembly.Memory } | undefined)?.memory ?? null;
  if (decision.backend === "threads") {
    if (!wasm.initThreadPool) throw new Error("the threads build has no initThreadPool");
    // The main thread times this step: a pool that never starts leaves this worker blocked for
    // good (seen in Firefox under automation), and only terminating it gets out.
    post({ type: "poolStarting", id: request.id, threads: request.threads });
    if (request.testHooks?.blockThreadPoolStart) blockForGood();
    await wasm.initThreadPool(request.threads);
    post({ type: "poolStarted", id: request.id });
  }

  engine = await makeEngine(request, decision.backend);
  loaded = { request, backend: decision.backend, draft: null };
  if (decision.backend === "webgpu" && request.testHooks?.loseDeviceAfterPasses !== undefined) {
    engine.loseDevice(request.testHooks.loseDeviceAfterPasses);
  }
  post({
    type: "loaded",
    id: request.id,
    backend: decision.backend,
    backendReason: decision.reason,
    info: modelInfo(engine.info()),
  });
}

/** Opens a model file: from Cache Storage, the network, or the Blob or bytes given. */
function openFile(module: WasmModule, file: WireFile, cacheName: string | null, id: number): Promise<OpenedFile> {
  const deps = {
    fetch: globalThis.fetch.bind(globalThis),
    caches: globalThis.caches as CacheStorage | undefined,
    // Downloads are verified with the module's SHA-256 (RustCrypto's sha2).
    sha256: () => new module.Sha256(),
  };
  return openModelFile(file, deps, { cacheName, warn: (message: string) => post({ type: "warning", id, message }) });
}

/** Reads the model files of `request` (from Cache Storage, the network, the Blob or bytes given) into an engine on `backend`. */
async function makeEngine(request: LoadRequest, backend: Backend): Promise<WasmEngineHandle> {
  const module = wasm;
  if (!module) throw new Error("no wasm module is loaded");
  const open = (file: WireFile) => openFile(module, file, request.cacheName, request.id);
  const { model } = request;
  // The small files first: a wrong tokenizer URL fails before a long download. Without a
  // tokenizer.json the engine builds the tokenizer from the GGUF's metadata.
  const tokenizer = model.tokenizer
    ? await readAll("tokenizer", model.tokenizer, await open(model.tokenizer), request.id)
    : null;
  const config = model.tokenizerConfig
    ? await readAll("tokenizerConfig", model.tokenizerConfig, await open(model.tokenizerConfig), request.id)
    : null;
  const template = model.chatTemplate
    ? new TextDecoder().decode(
        await readAll("chatTemplate", model.chatTemplate, await open(model.chatTemplate), request.id),
      )
    : null;
  const gguf = await open(model.gguf);
  if (backend === "webgpu") {
    const loader = await streamInto(
      (size) => untilTrapped(module.GpuModelLoader.open(size)),
      model.gguf,
      gguf,
      request.id,
    );
    return await untilTrapped(loader.finish(tokenizer, config, template, request.contextLength));
  }
  const loader = await streamInto(async (size) => new module.ModelLoader(size), model.gguf, gguf, request.id);
  return loader.finish(tokenizer, config, template, request.contextLength);
}

/**
 * Streams the draft model's GGUF into wasm memory and gives it to `wasmEngine`, on the CPU (the
 * engine's draft model guesses synchronously); returns it and its session in words. A model of
 * another vocabulary is refused (the engine names the first difference), the file named.
 */
async function addDraft(wasmEngine: WasmEngineHandle, file: WireFile, cacheName: string | null, id: number): Promise<string> {
  const module = wasm;
  if (!module) throw new Error("no wasm module is loaded");
  const opened = await openFile(module, file, cacheName, id);
  const loader = await streamInto(async (size) => new module.ModelLoader(size), file, opened, id, "draft");
  try {
    return wasmEngine.setDraftModel(loader);
  } catch (e) {
    if (e instanceof WebAssembly.RuntimeError || !(e instanceof Error)) throw e;
    throw leanError(e.name, `the draft model ${file.name}: ${e.message}`);
  }
}

/**
 * Whether `e`, thrown by a WebGPU engine's call, means its device is lost: the engine says so
 * (`DeviceLostError`), or a GPU failure came before the browser resolved `GPUDevice.lost` and the
 * engine knows of the loss once the event loop ran.
 */
async function isDeviceLoss(wasmEngine: WasmEngineHandle, e: unknown): Promise<string | null> {
  if (loaded?.backend !== "webgpu" || e instanceof WebAssembly.RuntimeError) return null;
  if (e instanceof Error && e.name === ErrorName.DeviceLost) return e.message;
  for (let i = 0; i < 5; i++) {
    const lost = wasmEngine.deviceLost();
    if (lost) return `the WebGPU device was lost: ${lost}`;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return null;
}

/**
 * Replaces the lost WebGPU engine with one on the CPU (simd: the single-thread build the WebGPU
 * backend runs on, already loaded), reading the model again, and says so to the main thread.
 */
async function fallBackToCpu(id: number, why: string): Promise<WasmEngineHandle> {
  if (!loaded) throw new Error("no model is loaded");
  const lost = engine;
  engine = null;
  lost?.free();
  const backend: Backend = "simd";
  const cpu = await makeEngine(loaded.request, backend);
  engine = cpu;
  loaded = { ...loaded, backend };
  if (loaded.draft) {
    try {
      await addDraft(cpu, loaded.draft, loaded.request.cacheName, id);
    } catch (e) {
      // The generation goes on without it: the same tokens, only no guesses.
      loaded = { ...loaded, draft: null };
      post({ type: "warning", id, message: `the draft model could not be read again for the CPU engine: ${e instanceof Error ? e.message : String(e)}` });
    }
  }
  post({
    type: "backendChange",
    id,
    backend,
    backendReason: `${why}; lean continued on the CPU (simd), with the same tokens`,
    info: modelInfo(cpu.info()),
  });
  return cpu;
}

function progressReporter(role: ModelFileRole, file: WireFile, opened: OpenedFile, id: number) {
  let lastPost = -Infinity;
  let lastLoaded = -1;
  return (loaded: number, final = false) => {
    const now = performance.now();
    if (final ? loaded === lastLoaded : now - lastPost < PROGRESS_INTERVAL_MS) return;
    lastPost = now;
    lastLoaded = loaded;
    post({
      type: "progress",
      id,
      progress: { file: role, name: file.name, loaded, total: opened.size, source: opened.source },
    });
  };
}

async function readAll(role: ModelFileRole, file: WireFile, opened: OpenedFile, id: number): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let length = 0;
  const progress = progressReporter(role, file, opened, id);
  await opened.read((chunk) => {
    chunks.push(chunk);
    length += chunk.length;
  }, progress);
  progress(length, true);
  const bytes = new Uint8Array(length);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return bytes;
}

/** What the GGUF streams into: wasm memory (ModelLoader) or GPU buffers (GpuModelLoader). */
interface ChunkSink {
  push(chunk: Uint8Array): void;
  readonly received: number;
  free(): void;
}

/**
 * Streams the GGUF into a loader made by `create(size)`: a ModelLoader then holds the only full
 * copy; a GpuModelLoader passes each matrix on to the GPU. Without a known size (no
 * Content-Length) the chunks must be gathered first, which costs a second copy for a while.
 */
async function streamInto<Loader extends ChunkSink>(
  create: (size: number) => Promise<Loader>,
  file: WireFile,
  opened: OpenedFile,
  id: number,
  role: ModelFileRole = "gguf",
): Promise<Loader> {
  const push = (loader: Loader, chunk: Uint8Array) => {
    for (let at = 0; at < chunk.length; at += MAX_PUSH_BYTES) {
      loader.push(chunk.subarray(at, at + MAX_PUSH_BYTES));
    }
  };
  if (opened.size === null) {
    post({
      type: "warning",
      id,
      message: `${file.name}: the server sends no Content-Length, so the model is held twice while it loads`,
    });
    const bytes = await readAll(role, file, opened, id);
    const loader = await create(bytes.length);
    push(loader, bytes);
    return loader;
  }
  const loader = await create(opened.size);
  const progress = progressReporter(role, file, opened, id);
  try {
    await opened.read((chunk) => push(loader, chunk), progress);
  } catch (e) {
    loader.free();
    throw e;
  }
  progress(loader.received, true);
  return loader;
}

function modelInfo(json: string): ModelInfo {
  const i = JSON.parse(json) as Record<string, unknown>;
  return {
    architecture: i.architecture as string,
    description: i.description as string,
    session: i.backend as string,
    contextLength: i.context_length as number,
    trainContextLength: i.train_context_length as number,
    vocabSize: i.vocab_size as number,
    fileBytes: i.file_bytes as number,
    kvCacheBytes: i.kv_cache_bytes as number,
    bosToken: (i.bos_token as string | null) ?? null,
    eosToken: (i.eos_token as string | null) ?? null,
    eosTokenIds: i.eos_token_ids as number[],
    hasChatTemplate: i.has_chat_template as boolean,
    tokenizerFromGguf: i.tokenizer_from_gguf === true,
    draftModel: (i.draft_model as string | null | undefined) ?? null,
    cachedTokens: 0,
  };
}

/** Resolves after the event loop ran the tasks queued before it (messages included). */
const yieldToEventLoop = (() => {
  const channel = new MessageChannel();
  const waiting: (() => void)[] = [];
  channel.port1.onmessage = () => waiting.shift()?.();
  return () =>
    new Promise<void>((resolve) => {
      waiting.push(resolve);
      channel.port2.postMessage(null);
    });
})();

async function generate(id: number, prompt: WirePrompt, params: GenerateParams): Promise<void> {
  let wasmEngine = loadedEngine();
  if (active) throw new Error(`generation ${active.id} is still running`);
  const stop = new StopMatcher(params.stop ?? []);
  const engineOptions = toEngineOptions(params);
  if (engineOptions.draft !== undefined && !loaded?.draft) {
    throw new Error("speculative.draft needs a draft model: load one first (engine.loadDraft, or createEngine's draft option)");
  }
  const options = JSON.stringify(engineOptions);
  const state = { id, cancelled: false };
  active = state;
  // A generation lean-js can continue on the CPU when the WebGPU device is lost: the prompt ids
  // and the tokens so far prefill a CPU engine, which goes on with the same tokens. With a
  // constraint or tools the engine's state is more than the ids: those fail (DeviceLostError).
  const resumable = engineOptions.constraint === undefined && engineOptions.tools === undefined;
  const generatedIds: number[] = [];
  const maxTokens = (engineOptions.max_tokens as number | undefined) ?? 256;
  /** After a loss: a CPU engine, begun on the prompt and the tokens so far. */
  const resume = async (e: unknown, promptIds: number[] | null) => {
    const why = await isDeviceLoss(wasmEngine, e);
    if (why === null) throw e;
    wasmEngine = await fallBackToCpu(id, why);
    if (!resumable) throw leanError(ErrorName.DeviceLost, `${why}: the engine runs on the CPU now; generate again`);
    const resumed = promptIds === null ? JSON.stringify(prompt) : JSON.stringify({ ids: [...promptIds, ...generatedIds] });
    // Without the draft model (it could not be read again) plain decoding gives the same tokens.
    const onCpu = loaded?.draft ? engineOptions : { ...engineOptions, draft: undefined };
    const rest = JSON.stringify(promptIds === null ? onCpu : { ...onCpu, max_tokens: maxTokens - generatedIds.length });
    return JSON.parse(await untilTrapped(wasmEngine.begin(resumed, rest))) as {
      prompt_ids: number[];
      cached_tokens: number;
    };
  };
  try {
    const started = performance.now();
    let begun: { prompt_ids: number[]; cached_tokens: number };
    try {
      begun = JSON.parse(await untilTrapped(wasmEngine.begin(JSON.stringify(prompt), options))) as typeof begun;
    } catch (e) {
      begun = await resume(e, null);
    }
    const { prompt_ids: promptIds, cached_tokens: cachedTokens } = begun;
    const prefillMs = performance.now() - started;
    let text = "";
    let stopString: string | null = null;
    let firstTokenAt = 0;
    let lastTokenAt = 0;
    let done: NonNullable<StepJson["done"]> | null = null;
    while (done === null) {
      if (state.cancelled) {
        done = (JSON.parse(wasmEngine.cancel() ?? "null") as StepJson | null)?.done ?? null;
        if (done === null) throw new Error("the wasm engine lost the generation it was cancelling");
        break;
      }
      let step: StepJson;
      try {
        step = JSON.parse(await untilTrapped(wasmEngine.step())) as StepJson;
      } catch (e) {
        await resume(e, promptIds);
        continue;
      }
      const now = performance.now();
      if (step.tokens.length > 0) {
        if (firstTokenAt === 0) firstTokenAt = now;
        lastTokenAt = now;
      }
      const tokens: Token[] = [];
      for (const t of step.tokens) {
        generatedIds.push(t.id);
        const out = stop.push(t.text);
        tokens.push({ text: out.text, tokenId: t.id });
        if (out.stopped !== null) {
          stopString = out.stopped;
          break;
        }
      }
      done = step.done;
      if (stopString !== null) {
        done = done ?? (JSON.parse(wasmEngine.cancel() ?? "null") as StepJson | null)?.done ?? null;
        if (done === null) throw new Error("the wasm engine lost the generation it was stopping");
      } else if (done !== null) {
        const held = stop.flush();
        if (held) tokens.push({ text: held, tokenId: done.token_ids.at(-1) ?? 0 });
      }
      for (const t of tokens) text += t.text;
      if (tokens.length > 0) post({ type: "tokens", id, tokens });
      if (done === null) await yieldToEventLoop();
    }
    // After a fallback the last engine's ids start after the prompt it was given (the prompt and
    // the tokens before the loss).
    const ended = done.prompt_ids.length - promptIds.length;
    const tokenIds = ended > 0 ? [...done.prompt_ids.slice(promptIds.length), ...done.token_ids] : done.token_ids;
    const decodeMs = lastTokenAt - firstTokenAt;
    const generated = tokenIds.length;
    const result: GenerationResult = {
      text,
      tokenIds,
      promptTokens: promptIds.length,
      cachedTokens,
      finishReason: stopString !== null ? "stop" : done.finish_reason,
      stopString,
      prefillMs,
      decodeMs,
      prefillTokensPerSecond: prefillMs > 0 ? ((promptIds.length - cachedTokens) * 1000) / prefillMs : 0,
      decodeTokensPerSecond: decodeMs > 0 ? ((generated - 1) * 1000) / decodeMs : 0,
      speculation: {
        verifications: done.speculation.verifications,
        draftedTokens: done.speculation.drafted_tokens,
        acceptedTokens: done.speculation.accepted_tokens,
        pausedSteps: done.speculation.paused_steps,
      },
    };
    // A stop string cut the reply before any call it held back.
    if (done.tool_calls && stopString === null) {
      result.toolCalls = done.tool_calls.map((call) => ({ ...call, id: newCallId() }));
    }
    post({ type: "done", id, result, cachedTokens: done.cache_length });
  } finally {
    active = null;
  }
}

/**
 * A call id as OpenAI's: `call_` and 24 letters and digits. Random here: lean's own ids count up
 * from the same start in every fresh module (wasm32 has no clock in std), and a conversation
 * saved in one page load may go on in another.
 */
function newCallId(): string {
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  // 248 = 4 × 62: bytes below it map uniformly.
  let id = "call_";
  while (id.length < 29) {
    for (const byte of crypto.getRandomValues(new Uint8Array(32))) {
      if (byte < 248 && id.length < 29) id += alphabet[byte % 62];
    }
  }
  return id;
}

/** What a hung pool start looks like from outside: this worker blocks and answers nothing. */
function blockForGood(): never {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
  throw new Error("unreachable: Atomics.wait on a value nobody changes returned");
}

/** Runs this worker as a thread of the threads build's pool, on the module and memory it was sent. */
async function startPoolThread({ module, memory, receiver }: PoolThreadInit): Promise<void> {
  const threads = await wasmBuilds.threads?.();
  if (!threads?.wbg_rayon_start_worker) throw new Error("this lean-js has no threads build");
  await threads.default({ module_or_path: module, memory });
  (scope as unknown as Worker).postMessage({ type: "wasm_bindgen_worker_ready" });
  threads.wbg_rayon_start_worker(receiver);
}
