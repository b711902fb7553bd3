/**
 * The main-thread side: an {@link Engine} is a thin client of the worker's message protocol
 * (protocol.ts). Generations run one at a time in the worker; a second `generate` waits for the
 * first to end (it is queued, not rejected).
 */
import { ErrorName, fromWireError, leanError } from "./errors.js";
import type {
  Backend,
  CacheInfo,
  MemoryInfo,
  ChatMessage,
  ChatTurn,
  GenerateParams,
  GenerationResult,
  LoadProgress,
  LoadRequest,
  ModelInfo,
  Reply,
  Request,
  Token,
  WirePrompt,
} from "./protocol.js";
import { toEngineOptions } from "./protocol.js";
import { draftWireFile, type DraftModelSpec } from "./files.js";
import { ChatCompletions } from "./openai.js";

/** What the engine needs of a Worker (a fake one in tests). */
export interface WorkerLike {
  postMessage(message: Request, transfer?: Transferable[]): void;
  terminate(): void;
  onmessage: ((event: MessageEvent<Reply>) => void) | null;
  onerror: ((event: ErrorEvent) => void) | null;
}

export interface GenerateOptions extends GenerateParams {
  /** Aborting stops the generation within one token; the iterator then throws the reason. */
  signal?: AbortSignal;
}

/**
 * The tokens of one generation, as an async iterator. The generation starts at once (after any
 * generation queued before it), whether or not anyone iterates; tokens not yet read are kept.
 * Breaking out of the `for await` loop stops it; `result` resolves once it ended (finishReason
 * "cancelled" when stopped early), or rejects with its error.
 */
export interface TokenStream extends AsyncIterableIterator<Token> {
  readonly result: Promise<GenerationResult>;
  /** Stops the generation (what `break` in `for await` calls). */
  return(): Promise<IteratorResult<Token>>;
}

/** How long the threads backend's pool of Web Workers may take to start before the load gives up on it. */
export const DEFAULT_THREAD_POOL_TIMEOUT_MS = 20_000;

export interface StartOptions {
  /** Default {@link DEFAULT_THREAD_POOL_TIMEOUT_MS}. */
  threadPoolTimeoutMs?: number;
}

export interface LoadHooks {
  onProgress?: (progress: LoadProgress) => void;
  onWarning?: (message: string) => void;
}

export interface LoadDraftOptions extends LoadHooks {
  /** Where catalog models marked `local` are served, as createEngine's. Default: "models/" of the page. */
  modelBaseUrl?: string | URL;
}

interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(reason: unknown): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (reason: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** What a generation's iterator reads: its tokens, then its end or its error. */
type StreamItem = { token: Token } | { end: true } | { error: unknown };

/** Unbounded FIFO whose `shift` waits for the next item. */
class AsyncQueue<T> {
  #items: T[] = [];
  #waiting: ((item: T) => void)[] = [];

  push(item: T): void {
    const waiter = this.#waiting.shift();
    if (waiter) waiter(item);
    else this.#items.push(item);
  }

  shift(): Promise<T> {
    if (this.#items.length > 0) return Promise.resolve(this.#items.shift() as T);
    return new Promise((resolve) => this.#waiting.push(resolve));
  }
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? leanError(ErrorName.Abort, "the operation was aborted");
}

/** `promise`, or the signal's reason as soon as it aborts. */
function raceAbort<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return promise;
  if (signal.aborted) return Promise.reject(abortReason(signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortReason(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

function toWirePrompt(prompt: string | readonly ChatTurn[]): WirePrompt {
  if (typeof prompt === "string") return { raw: prompt };
  if (!Array.isArray(prompt)) {
    throw new TypeError("the prompt must be a string or an array of {role, content} messages");
  }
  // Only the known fields cross: extra ones would fail the worker's structured clone or JSON.
  return { messages: prompt.map((m: unknown, i) => wireMessage(m, i)) };
}

/** A message as the worker takes it: `{role, content}`, with an assistant's `tool_calls` or a tool result's `tool_call_id`/`name`. */
function wireMessage(m: unknown, i: number): ChatTurn {
  const message = (typeof m === "object" && m !== null ? m : {}) as Record<string, unknown>;
  const { role, content } = message;
  const calls = message.tool_calls;
  if (calls === undefined || calls === null) {
    if (typeof role !== "string" || typeof content !== "string") {
      throw new TypeError(`message ${i} must be {role: string, content: string}`);
    }
    const out: ChatMessage = { role, content };
    for (const key of ["tool_call_id", "name"] as const) {
      const value = message[key];
      if (value === undefined || value === null) continue;
      if (typeof value !== "string") throw new TypeError(`message ${i}: ${key} must be a string`);
      out[key] = value;
    }
    return out;
  }
  if (role !== "assistant" || !Array.isArray(calls)) {
    throw new TypeError(`message ${i}: tool_calls must be an array, on an assistant message`);
  }
  if (content !== undefined && content !== null && typeof content !== "string") {
    throw new TypeError(`message ${i}: content must be a string or null`);
  }
  const toolCalls = calls.map((call: unknown, j) => {
    const c = (typeof call === "object" && call !== null ? call : {}) as Record<string, unknown>;
    const fn = (typeof c.function === "object" && c.function !== null ? c.function : {}) as Record<string, unknown>;
    const args = fn.arguments;
    if (typeof fn.name !== "string" || (args !== undefined && typeof args !== "string" && (typeof args !== "object" || args === null))) {
      throw new TypeError(`message ${i}: tool_calls[${j}] must be { id, type: "function", function: { name, arguments } }`);
    }
    if (c.id !== undefined && c.id !== null && typeof c.id !== "string") throw new TypeError(`message ${i}: tool_calls[${j}].id must be a string`);
    const argumentsText = typeof args === "string" ? args : JSON.stringify(args ?? {});
    return {
      ...(typeof c.id === "string" ? { id: c.id } : {}),
      type: "function" as const,
      function: { name: fn.name, arguments: argumentsText },
    } as ToolCallWire;
  });
  return { role: "assistant", content: (content as string | null | undefined) ?? null, tool_calls: toolCalls };
}

/** A call as it crosses to the worker (an id is optional there). */
type ToolCallWire = Extract<ChatTurn, { tool_calls: unknown }>["tool_calls"][number];

export class Engine extends EventTarget {
  /**
   * The backend that runs the model. It changes once when a WebGPU device is lost: lean-js then
   * goes on on the CPU (simd) with the same tokens, and a `backendchange` event says so.
   */
  get backend(): Backend {
    return this.#backend;
  }
  /**
   * Why this backend (for `auto`: why each faster one was not used, e.g. missing COOP/COEP;
   * after a `backendchange`, that the WebGPU device was lost).
   */
  get backendReason(): string {
    return this.#backendReason;
  }
  #backend: Backend;
  #backendReason: string;
  readonly info: ModelInfo;
  /**
   * `generate` with a conversation, through the model's chat template; and
   * `chat.completions.create`, OpenAI's chat completions on this engine (openai.ts).
   */
  readonly chat: ((messages: readonly ChatTurn[], options?: GenerateOptions) => TokenStream) & {
    completions: ChatCompletions;
  };
  readonly #worker: WorkerLike;
  readonly #handlers = new Map<number, (reply: Reply) => void>();
  /** Request ids; 0 was the load. */
  #nextId = 1;
  #failure: Error | null = null;
  /** Settles when the last queued generation has ended in the worker. */
  #tail: Promise<void> = Promise.resolve();

  /** Use {@link Engine.start} (or `createEngine`). */
  private constructor(worker: WorkerLike, loaded: Extract<Reply, { type: "loaded" }>) {
    super();
    this.#worker = worker;
    this.#backend = loaded.backend;
    this.#backendReason = loaded.backendReason;
    this.info = loaded.info;
    const chat = (messages: readonly ChatTurn[], options: GenerateOptions = {}) => {
      if (!Array.isArray(messages)) throw new TypeError("chat() takes an array of {role, content} messages");
      return this.generate(messages, options);
    };
    this.chat = Object.assign(chat, { completions: new ChatCompletions(this) });
    worker.onmessage = (event) => this.#route(event.data);
    worker.onerror = (event) => {
      event.preventDefault?.();
      this.#fail(leanError(ErrorName.Disposed, `the lean worker failed: ${event.message ?? "unknown error"}`));
    };
  }

  /**
   * Loads a model in a worker; resolves once it is ready. Rejects (and terminates the worker)
   * on failure. The threads backend's pool start is the one step that can hang for good (a
   * worker blocked in it answers nothing): it gets `threadPoolTimeoutMs`, then one more try on
   * a fresh worker, then (for backend "auto") the simd backend, with the reason in
   * `backendReason`. Retrying needs `worker` to be a factory of workers.
   */
  static async start(
    worker: WorkerLike | (() => WorkerLike),
    load: Omit<LoadRequest, "type" | "id">,
    hooks: LoadHooks = {},
    options: StartOptions = {},
  ): Promise<Engine> {
    const timeoutMs = options.threadPoolTimeoutMs ?? DEFAULT_THREAD_POOL_TIMEOUT_MS;
    const newWorker = typeof worker === "function" ? worker : null;
    let given: WorkerLike | null = newWorker ? null : (worker as WorkerLike);
    let request = load;
    /** Pool starts that timed out, and the size of the pool. */
    let stalls = 0;
    let poolSize = 0;
    const stalled = () =>
      `the threads backend's pool of ${poolSize} Web Workers did not start within ${timeoutMs / 1000} s` +
      (stalls > 1 ? `, ${stalls === 2 ? "twice" : `${stalls} times`}` : "");
    for (;;) {
      const target = given ?? newWorker!();
      given = null;
      const outcome = await Engine.#attempt(target, request, hooks, timeoutMs);
      if ("loaded" in outcome) {
        const { loaded } = outcome;
        let backendReason = loaded.backendReason;
        if (stalls > 0 && loaded.backend === "threads") backendReason += ` (${stalled()} once; the next try did)`;
        else if (stalls > 0) backendReason = `${stalled()}, so lean fell back to ${loaded.backend}`;
        return new Engine(target, { ...loaded, backendReason });
      }
      stalls += 1;
      poolSize = outcome.threads;
      const canRetry = newWorker !== null && !hasDetachedBytes(load);
      if (canRetry && stalls === 1) continue; // once more, on a fresh worker
      if (canRetry && load.backend === "auto" && request.backend === "auto") {
        request = { ...load, backend: "simd" };
        continue;
      }
      throw leanError(
        ErrorName.BackendUnavailable,
        stalled() + (canRetry ? ': choose backend "simd" (or "auto", which falls back to it)' : ""),
      );
    }
  }

  /** One load in `worker`: its "loaded" reply, or that its thread pool did not start in time (then the worker is terminated). */
  static #attempt(
    worker: WorkerLike,
    load: Omit<LoadRequest, "type" | "id">,
    hooks: LoadHooks,
    poolTimeoutMs: number,
  ): Promise<{ loaded: Extract<Reply, { type: "loaded" }> } | { poolTimedOut: true; threads: number }> {
    return new Promise((resolve, reject) => {
      let poolTimer: ReturnType<typeof setTimeout> | undefined;
      const fail = (error: Error) => {
        clearTimeout(poolTimer);
        worker.terminate();
        reject(error);
      };
      worker.onmessage = (event) => {
        const reply = event.data;
        switch (reply.type) {
          case "progress":
            hooks.onProgress?.(reply.progress);
            return;
          case "warning":
            (hooks.onWarning ?? console.warn)(reply.message);
            return;
          case "poolStarting":
            poolTimer = setTimeout(() => {
              worker.terminate();
              resolve({ poolTimedOut: true, threads: reply.threads });
            }, poolTimeoutMs);
            return;
          case "poolStarted":
            clearTimeout(poolTimer);
            return;
          case "loaded":
            clearTimeout(poolTimer);
            resolve({ loaded: reply });
            return;
          case "error":
            fail(fromWireError(reply.error));
            return;
        }
      };
      worker.onerror = (event) => {
        event.preventDefault?.();
        fail(leanError(ErrorName.Disposed, `the lean worker failed to start: ${event.message ?? "unknown error"}`));
      };
      worker.postMessage({ type: "load", id: 0, ...load }, transferables(load));
    });
  }

  /** False once the engine was disposed or the WebAssembly module trapped (see `failure`). */
  get usable(): boolean {
    return this.#failure === null;
  }

  /** Why the engine is unusable, or null. */
  get failure(): Error | null {
    return this.#failure;
  }

  /**
   * Generates from a raw prompt (a string, tokenized as is) or a conversation (rendered with the
   * model's chat template). Tokens stream as `{text, tokenId}`.
   */
  generate(prompt: string | readonly ChatTurn[], options: GenerateOptions = {}): TokenStream {
    const { signal, ...params } = options;
    const wirePrompt = toWirePrompt(prompt);
    const engineOptions = toEngineOptions(params); // refuse bad options now, not when the generation's turn comes
    if ("raw" in wirePrompt && engineOptions.tools !== undefined) {
      throw leanError(ErrorName.Tool, "tools apply to a chat (engine.chat, or generate with messages), not to a raw prompt");
    }
    const id = this.#nextId++;
    const items = new AsyncQueue<StreamItem>();
    const result = deferred<GenerationResult>();
    // Callers who only iterate never look at `result`: its rejection must not go unhandled.
    result.promise.catch(() => {});
    // The worker runs one generation at a time: this one starts when the previous one ended there.
    const previous = this.#tail;
    const ended = deferred<void>();
    this.#tail = previous.then(() => ended.promise);
    let state: "queued" | "running" | "ended" = "queued";
    let stopRequested = false;

    const end = (outcome: { result: GenerationResult } | { error: unknown }) => {
      state = "ended";
      this.#handlers.delete(id);
      signal?.removeEventListener("abort", stop);
      if ("result" in outcome) {
        result.resolve(outcome.result);
        items.push({ end: true });
      } else {
        result.reject(outcome.error);
        items.push({ error: outcome.error });
      }
      ended.resolve();
    };
    /** Stops the generation: before it starts, it never will; while it runs, the worker ends it. */
    const stop = () => {
      if (stopRequested || state === "ended") return;
      stopRequested = true;
      if (state === "running" && this.#failure === null) this.#post({ type: "cancel", id });
    };
    signal?.addEventListener("abort", stop, { once: true });

    // Started now rather than on the first next(): `result` settles even if nobody iterates.
    void (async () => {
      try {
        await raceAbort(previous, signal);
        this.#assertUsable();
        if (stopRequested) throw leanError(ErrorName.Abort, "the generation was stopped before it started");
      } catch (e) {
        end({ error: e });
        return;
      }
      state = "running";
      this.#handlers.set(id, (reply) => {
        if (reply.type === "tokens") for (const token of reply.tokens) items.push({ token });
        else if (reply.type === "done") {
          this.info.cachedTokens = reply.cachedTokens;
          end({ result: reply.result });
        }
        else if (reply.type === "error") end({ error: fromWireError(reply.error) });
      });
      this.#post({ type: "generate", id, prompt: wirePrompt, params });
    })();

    let iteratorDone = false;
    const stream: TokenStream = {
      result: result.promise,
      [Symbol.asyncIterator]() {
        return stream;
      },
      async next() {
        if (iteratorDone) return { done: true, value: undefined };
        let item: StreamItem;
        try {
          item = await raceAbort(items.shift(), signal);
        } catch (e) {
          iteratorDone = true;
          throw e;
        }
        if ("token" in item) return { done: false, value: item.token };
        iteratorDone = true;
        if ("error" in item) throw item.error;
        return { done: true, value: undefined };
      },
      // Called by `break` (or a throwing loop body) in `for await`.
      async return() {
        iteratorDone = true;
        stop();
        return { done: true, value: undefined };
      },
    };
    return stream;
  }


  /** The token ids of `text` as `generate(text)` would see them (special tokens included). */
  async tokenize(text: string): Promise<number[]> {
    if (typeof text !== "string") throw new TypeError("tokenize() takes a string");
    const reply = await this.#request({ type: "tokenize", id: this.#nextId++, text });
    if (reply.type !== "tokenized") throw new Error(`unexpected reply ${reply.type} to tokenize`);
    return reply.ids;
  }

  /**
   * The KV cache carried from one generation to the next: how many ids it holds and, given a
   * prompt, how many of the prompt's tokens the next generation would take from it. Waits for
   * the generations queued before it.
   */
  async cacheInfo(prompt?: string | readonly ChatTurn[], tools?: Pick<GenerateParams, "tools" | "toolChoice">): Promise<CacheInfo> {
    const wirePrompt = prompt === undefined ? null : toWirePrompt(prompt);
    const params: GenerateParams = {};
    if (tools?.tools) params.tools = tools.tools;
    if (tools?.toolChoice) params.toolChoice = tools.toolChoice;
    toEngineOptions(params);
    const request: Extract<Request, { type: "cacheInfo" }> = { type: "cacheInfo", id: this.#nextId++, prompt: wirePrompt };
    if (Object.keys(params).length > 0) request.params = params;
    const reply = await this.#afterQueued(request);
    if (reply.type !== "cacheInfo") throw new Error(`unexpected reply ${reply.type} to cacheInfo`);
    this.info.cachedTokens = reply.info.cachedTokens;
    return reply.info;
  }

  /** What the engine holds in memory now (its worker's WebAssembly memory). */
  async memoryInfo(): Promise<MemoryInfo> {
    const reply = await this.#request({ type: "memoryInfo", id: this.#nextId++ });
    if (reply.type !== "memoryInfo") throw new Error(`unexpected reply ${reply.type} to memoryInfo`);
    return reply.info;
  }

  /** Forgets the KV cache: the next generation prefills its whole prompt (a new conversation). */
  async resetChat(): Promise<void> {
    const reply = await this.#afterQueued({ type: "resetCache", id: this.#nextId++ });
    if (reply.type !== "cacheReset") throw new Error(`unexpected reply ${reply.type} to resetCache`);
    this.info.cachedTokens = 0;
  }

  /**
   * Loads a draft model for speculative decoding (`speculative: { draft: n }`): a smaller model
   * with this model's vocabulary that guesses the next tokens greedily, with a KV cache of its
   * own; the model checks each guess, so greedy output stays the same. `draft`: a catalog id or
   * `{ gguf, sha256? }`, read as the model's files are (Cache Storage, the verified download,
   * progress as `file: "draft"`). It runs on the CPU backend the worker has, also beside WebGPU
   * (a warning says so). Replaces an earlier draft model. A model of another vocabulary is refused
   * (the message names the first difference) and the engine keeps what it had. Runs after the
   * generations queued before it; those queued after wait for it. Resolves to
   * `info.draftModel`, the draft model and its session in words.
   */
  async loadDraft(draft: DraftModelSpec, options: LoadDraftOptions = {}): Promise<string> {
    const file = draftWireFile(draft, options.modelBaseUrl);
    const id = this.#nextId++;
    const previous = this.#tail;
    const ended = deferred<void>();
    this.#tail = previous.then(() => ended.promise);
    try {
      await previous;
      this.#assertUsable();
      const draftModel = await new Promise<string>((resolve, reject) => {
        this.#handlers.set(id, (reply) => {
          switch (reply.type) {
            case "progress":
              options.onProgress?.(reply.progress);
              return;
            case "warning":
              (options.onWarning ?? console.warn)(reply.message);
              return;
            case "draftLoaded":
              this.#handlers.delete(id);
              resolve(reply.draftModel);
              return;
            case "error":
              this.#handlers.delete(id);
              reject(fromWireError(reply.error));
              return;
          }
        });
        const transfer = "bytes" in file.source ? [file.source.bytes] : [];
        this.#worker.postMessage({ type: "loadDraft", id, draft: file }, transfer);
      });
      this.info.draftModel = draftModel;
      return draftModel;
    } finally {
      ended.resolve();
    }
  }

  /** Stops the worker and frees the model; later calls fail with EngineDisposedError. */
  dispose(): void {
    if (this.#failure?.name === ErrorName.Disposed) return;
    this.#fail(leanError(ErrorName.Disposed, "the engine was disposed"));
  }

  #post(request: Request): void {
    this.#worker.postMessage(request);
  }

  #route(reply: Reply): void {
    if (reply.type === "backendChange") {
      // The WebGPU device was lost mid-generation; the worker goes on with a CPU engine.
      this.#backend = reply.backend;
      this.#backendReason = reply.backendReason;
      Object.assign(this.info, reply.info);
      this.dispatchEvent(new Event("backendchange"));
      return;
    }
    this.#handlers.get(reply.id)?.(reply);
    if (reply.type === "error" && reply.fatal) this.#fail(fromWireError(reply.error));
  }

  /** Marks the engine unusable, ends the worker, and fails everything pending with `error`. */
  #fail(error: Error): void {
    this.#failure ??= error;
    this.#worker.terminate();
    const pending = [...this.#handlers.entries()];
    this.#handlers.clear();
    const wire = { name: this.#failure.name, message: this.#failure.message };
    for (const [id, handler] of pending) handler({ type: "error", id, error: wire, fatal: true });
  }

  #assertUsable(): void {
    if (this.#failure) throw leanError(this.#failure.name, this.#failure.message);
  }

  /** `request` once the generations queued before it have ended (the worker runs one thing at a time). */
  async #afterQueued(request: Request): Promise<Reply> {
    await this.#tail;
    return this.#request(request);
  }

  /** One request, one reply (tokenize). */
  #request(request: Request): Promise<Reply> {
    this.#assertUsable();
    return new Promise((resolve, reject) => {
      this.#handlers.set(request.id, (reply) => {
        this.#handlers.delete(request.id);
        if (reply.type === "error") reject(fromWireError(reply.error));
        else resolve(reply);
      });
      this.#post(request);
    });
  }
}

/** Whether an ArrayBuffer of the load went to an earlier worker (a retry cannot send it again). */
function hasDetachedBytes(load: Omit<LoadRequest, "type" | "id">): boolean {
  return transferables(load).some((buffer) => (buffer as ArrayBuffer & { detached?: boolean }).detached === true);
}

/** The ArrayBuffers of a load request, moved to the worker instead of copied. */
function transferables(load: Omit<LoadRequest, "type" | "id">): Transferable[] {
  const files = [load.model.gguf, load.model.tokenizer, load.model.tokenizerConfig, load.model.chatTemplate];
  return files.flatMap((f) => (f && "bytes" in f.source ? [f.source.bytes] : []));
}
