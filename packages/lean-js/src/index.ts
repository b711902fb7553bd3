/**
 * lean-js: run small LLMs (GGUF) in the browser with lean's WebAssembly engine.
 *
 *     const engine = await createEngine({ model: "qwen2.5-0.5b-instruct-q4_0" });
 *     for await (const { text } of engine.chat([{ role: "user", content: "Hi!" }])) {
 *       output.textContent += text;
 *     }
 *
 * The engine runs in a dedicated Web Worker; this module is its thin, typed client.
 */
import { DEFAULT_CACHE_NAME, deleteCachedFiles, listCachedFiles, type CachedFile } from "./cache.js";
import { catalog, catalogFiles, findModel, type CatalogModel } from "./catalog.js";
import { Engine, type LoadHooks, type WorkerLike } from "./engine.js";
import { ErrorName, leanError } from "./errors.js";
import {
  absoluteUrl,
  defaultModelBaseUrl,
  describeValue,
  draftWireFile,
  isFileInput,
  wireFile,
  type DraftModelSpec,
  type FileInput,
} from "./files.js";
import type { BackendChoice, LoadProgress, TestHooks, WireFile, WireModel } from "./protocol.js";

export { DEFAULT_THREAD_POOL_TIMEOUT_MS, Engine } from "./engine.js";
export type { GenerateOptions, LoadDraftOptions, StartOptions, TokenStream, WorkerLike } from "./engine.js";
export type { DraftModelSpec, FileInput } from "./files.js";
export { ErrorName } from "./errors.js";
export { ChatCompletions } from "./openai.js";
export type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionContentPartText,
  ChatCompletionCreateParams,
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionCreateParamsStreaming,
  ChatCompletionFinishReason,
  ChatCompletionChunkToolCall,
  ChatCompletionMessageParam,
  ChatCompletionMessageToolCall,
  ChatCompletionTool,
  ChatCompletionToolChoiceOption,
  CompletionUsage,
  LeanCompletionExtras,
} from "./openai.js";
export { catalog, findModel } from "./catalog.js";
export type { CatalogFile, CatalogModel } from "./catalog.js";
export { DEFAULT_CACHE_NAME } from "./cache.js";
export type { CachedFile } from "./cache.js";
export { chooseBackend, detectCapabilities } from "./capabilities.js";
export type { BackendDecision, BuildSet, Capabilities, GpuAdapterSummary, WebGpuCapability } from "./capabilities.js";
export { installedBuilds } from "./wasm-manifest.js";
export type {
  Backend,
  BackendChoice,
  CacheInfo,
  MemoryInfo,
  ChatMessage,
  ChatTurn,
  FinishReason,
  GenerateParams,
  GenerationResult,
  GpuNeeds,
  JsonSchema,
  ResponseFormat,
  TestHooks,
  LoadProgress,
  ModelInfo,
  Token,
  Tool,
  ToolCall,
  ToolCallMessage,
  ToolChoice,
} from "./protocol.js";

/**
 * A model given by its files rather than a catalog id: the GGUF alone (its tokenizer and chat
 * template come from its own metadata, `tokenizer.ggml.*` and `tokenizer.chat_template`), or
 * with Hugging Face tokenizer files, which win over the GGUF's.
 */
export interface ModelFiles {
  gguf: FileInput;
  /** tokenizer.json. Without it, the tokenizer is built from the GGUF's metadata. */
  tokenizer?: FileInput;
  /** tokenizer_config.json (special tokens, chat template); its settings win over the GGUF's. */
  tokenizerConfig?: FileInput;
  /** chat_template.jinja: wins over the template of tokenizer_config.json and of the GGUF. */
  chatTemplate?: FileInput;
}

const MODEL_FILE_ROLES = ["gguf", "tokenizer", "tokenizerConfig", "chatTemplate"] as const;
const MODEL_SPEC = "{ gguf, tokenizer?, tokenizerConfig?, chatTemplate? }";

export interface CreateEngineOptions {
  /**
   * A catalog id (see `catalog`) or the model's files: `{ gguf }` alone runs on the tokenizer
   * and chat template in the GGUF's metadata. ArrayBuffers are transferred to the worker (the
   * caller's buffer becomes detached); for large models prefer a URL, File or Blob, which stream
   * into wasm memory without a second copy.
   */
  model: string | ModelFiles;
  /**
   * A draft model for speculative decoding (`speculative: { draft: n }`), loaded after the model
   * (progress as `file: "draft"`): a catalog id or `{ gguf, sha256? }`. It must share the model's
   * vocabulary, else the load fails naming the difference. Later: `engine.loadDraft`.
   */
  draft?: DraftModelSpec;
  /** Default "auto": WebGPU, else threads, else SIMD, by capability. */
  backend?: BackendChoice;
  /** Context window in tokens (capped at the model's). Default: the catalog's, else 4096. */
  contextLength?: number;
  /** Threads of the threads backend. Default: navigator.hardwareConcurrency. */
  threads?: number;
  /** Download/load progress per file. */
  onProgress?: (progress: LoadProgress) => void;
  /** Non-fatal problems (e.g. the cache quota was exceeded). Default: console.warn. */
  onWarning?: (message: string) => void;
  /** Where catalog models marked `local` (lean's test models) are served. Default: "models/" of the page. */
  modelBaseUrl?: string | URL;
  /** Cache Storage name for downloads, or false not to cache. Default: DEFAULT_CACHE_NAME. */
  cache?: string | false;
  /** Aborting stops the download/load (the worker is terminated). */
  signal?: AbortSignal;
  /**
   * How long the threads backend's pool of Web Workers may take to start (default
   * DEFAULT_THREAD_POOL_TIMEOUT_MS). A pool that does not start in time is tried once more on a
   * fresh worker; then backend "auto" falls back to simd (`backendReason` says so) and backend
   * "threads" fails with BackendUnavailableError.
   */
  threadPoolTimeoutMs?: number;
  /** For lean's own tests only: failures to induce. */
  testHooks?: TestHooks;
}

const DEFAULT_CONTEXT_LENGTH = 4096;

/** A file of the spec: null when absent (undefined or null). */
function optionalWireFile(input: FileInput | null | undefined, what: string): WireFile | null {
  return input === undefined || input === null ? null : wireFile(input, what);
}

function resolveModel(
  model: CreateEngineOptions["model"],
  options: CreateEngineOptions,
): { wire: WireModel; entry: CatalogModel | null } {
  if (typeof model === "string") {
    const entry = findModel(model);
    if (!entry) {
      const looksLikeFile = /\.gguf([?#].*)?$/i.test(model) || /^[a-z]+:\/\//i.test(model);
      throw new TypeError(
        `unknown model id '${model}' (known: ${catalog.map((m) => m.id).join(", ")})` +
          (looksLikeFile ? `; for a GGUF file give model: { gguf: "${model}" }` : ""),
      );
    }
    const files = Object.fromEntries(
      catalogFiles(entry, defaultModelBaseUrl(options)).map(({ role, file }) => [
        role,
        { name: file.url, source: { url: file.url }, size: file.size, sha256: file.sha256 } satisfies WireFile,
      ]),
    ) as Record<string, WireFile>;
    return {
      wire: {
        gguf: files.gguf!,
        tokenizer: files.tokenizer ?? null,
        tokenizerConfig: files.tokenizerConfig ?? null,
        chatTemplate: files.chatTemplate ?? null,
      },
      entry,
    };
  }
  if (typeof model !== "object" || model === null || isFileInput(model)) {
    throw new TypeError(
      `model must be a catalog id or ${MODEL_SPEC}: a GGUF alone (a URL, File, Blob, ArrayBuffer or ` +
        `Uint8Array) runs on the tokenizer in its own metadata; got ${describeValue(model)}`,
    );
  }
  const unknown = Object.keys(model).filter((key) => !(MODEL_FILE_ROLES as readonly string[]).includes(key));
  if (unknown.length > 0) {
    throw new TypeError(`unknown model file ${unknown.map((k) => `'${k}'`).join(", ")} (known: ${MODEL_FILE_ROLES.join(", ")})`);
  }
  if (model.gguf === undefined || model.gguf === null || model.gguf === "") {
    throw new TypeError(
      `model.gguf is required: model must be a catalog id or ${MODEL_SPEC} (the tokenizer files are optional)`,
    );
  }
  return {
    wire: {
      gguf: wireFile(model.gguf, "gguf"),
      tokenizer: optionalWireFile(model.tokenizer, "tokenizer"),
      tokenizerConfig: optionalWireFile(model.tokenizerConfig, "tokenizerConfig"),
      chatTemplate: optionalWireFile(model.chatTemplate, "chatTemplate"),
    },
    entry: null,
  };
}

function positiveInteger(value: number | undefined, name: string): void {
  if (value !== undefined && !(Number.isInteger(value) && value > 0)) {
    throw new TypeError(`${name} must be a whole number ≥ 1, got ${String(value)}`);
  }
}

/** Starts a worker, picks the backend and loads the model; resolves when it can generate. */
export async function createEngine(options: CreateEngineOptions): Promise<Engine> {
  const { wire, entry } = resolveModel(options.model, options);
  // A malformed draft spec throws now, before anything downloads.
  if (options.draft !== undefined) draftWireFile(options.draft, options.modelBaseUrl);
  positiveInteger(options.contextLength, "contextLength");
  positiveInteger(options.threads, "threads");
  positiveInteger(options.threadPoolTimeoutMs, "threadPoolTimeoutMs");
  const { signal } = options;
  signal?.throwIfAborted();
  // The load may need more than one worker (see Engine.start): abort ends the current one.
  let worker: WorkerLike | null = null;
  const newWorker = () => {
    worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module", name: "lean" });
    return worker;
  };
  const hooks: LoadHooks = { onProgress: options.onProgress, onWarning: options.onWarning };
  const loaded = Engine.start(
    newWorker,
    {
      model: wire,
      backend: options.backend ?? "auto",
      contextLength: options.contextLength ?? entry?.defaultContextLength ?? DEFAULT_CONTEXT_LENGTH,
      threads: options.threads ?? globalThis.navigator?.hardwareConcurrency ?? 1,
      cacheName: options.cache === false ? null : (options.cache ?? DEFAULT_CACHE_NAME),
      gpuNeeds: entry?.gpu ?? null,
      ...(options.testHooks ? { testHooks: options.testHooks } : {}),
    },
    hooks,
    { threadPoolTimeoutMs: options.threadPoolTimeoutMs },
  );
  const { draft } = options;
  const started =
    draft === undefined
      ? loaded
      : loaded.then(async (engine) => {
          try {
            await engine.loadDraft(draft, { ...hooks, modelBaseUrl: options.modelBaseUrl });
          } catch (e) {
            engine.dispose();
            throw e;
          }
          return engine;
        });
  if (!signal) return started;
  return new Promise<Engine>((resolve, reject) => {
    const onAbort = () => {
      (worker as WorkerLike | null)?.terminate();
      reject(signal.reason ?? leanError(ErrorName.Abort, "loading the model was aborted"));
    };
    signal.addEventListener("abort", onAbort, { once: true });
    started.then(
      (engine) => {
        signal.removeEventListener("abort", onAbort);
        resolve(engine);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

export interface CachedModelFile extends CachedFile {
  /** Catalog ids of the models this file belongs to. */
  models: string[];
}

export interface CacheOptions {
  cacheName?: string;
  /** As in createEngine, to recognise the files of local catalog models. */
  modelBaseUrl?: string | URL;
}

function catalogUrls(options: CacheOptions): Map<string, string[]> {
  const byUrl = new Map<string, string[]>();
  for (const model of catalog) {
    for (const { file } of catalogFiles(model, defaultModelBaseUrl(options))) {
      byUrl.set(file.url, [...(byUrl.get(file.url) ?? []), model.id]);
    }
  }
  return byUrl;
}

/** The model files in Cache Storage (complete, verified downloads only). */
export async function listCached(options: CacheOptions = {}): Promise<CachedModelFile[]> {
  const files = await listCachedFiles(globalThis.caches, options.cacheName ?? DEFAULT_CACHE_NAME);
  const byUrl = catalogUrls(options);
  return files.map((f) => ({ ...f, models: byUrl.get(f.url) ?? [] }));
}

/**
 * Deletes cached files: those of a catalog model (by id), one file (by URL), or all (no
 * argument). A file shared with another cached model (a tokenizer) goes too. Returns how many
 * files were deleted.
 */
export async function deleteCached(target?: string, options: CacheOptions = {}): Promise<number> {
  const cacheName = options.cacheName ?? DEFAULT_CACHE_NAME;
  if (target === undefined) return deleteCachedFiles(globalThis.caches, cacheName, null);
  const entry = findModel(target);
  const urls = entry
    ? catalogFiles(entry, defaultModelBaseUrl(options)).map(({ file }) => file.url)
    : [absoluteUrl(target)];
  return deleteCachedFiles(globalThis.caches, cacheName, urls);
}
