/**
 * The part of the wasm-bindgen module (rust/lean-wasm) that the worker uses. Both builds
 * (single-thread SIMD and multi-thread) have this shape and both have the GPU backend
 * (`GpuModelLoader`); the multi-thread one adds `initThreadPool`. JSON strings cross the boundary:
 * see rust/lean-wasm/src/lib.rs.
 */
export interface WasmEngineHandle {
  info(): string;
  /** Promises: a WebGPU engine's results come back through the event loop. */
  begin(promptJson: string, optionsJson: string): Promise<string>;
  step(): Promise<string>;
  cancel(): string | undefined;
  tokenize(text: string): Uint32Array;
  /** `{cache_length, prompt_tokens?, reusable_tokens?}`: the KV cache carried across generations. */
  /** `optionsJson`: as `begin`'s, for a chat's `tools`. */
  cacheInfo(promptJson?: string | null, optionsJson?: string | null): string;
  resetCache(): void;
  /** Why the WebGPU device was lost, once it was (undefined while it runs, or on the CPU). */
  deviceLost(): string | undefined;
  /** Test hook: destroys the WebGPU device now, or before the pass after `passes` more. False on the CPU. */
  loseDevice(passes?: number | null): boolean;
  /**
   * Gives the engine the draft model `loader` received (consumed), on the CPU: `draft` in the
   * options then speculates with it. Throws when its vocabulary differs from the model's. Returns
   * it and its session in words (`info`'s `draft_model`).
   */
  setDraftModel(loader: WasmModelLoader): string;
  free(): void;
}

export interface WasmModelLoader {
  push(chunk: Uint8Array): void;
  readonly received: number;
  /**
   * Builds the engine once every byte arrived. Without `tokenizerJson` the tokenizer and chat
   * template come from the GGUF's metadata (a config or template given still wins).
   */
  finish(
    tokenizerJson: Uint8Array | null | undefined,
    tokenizerConfig: Uint8Array | null | undefined,
    chatTemplate: string | null | undefined,
    contextLength: number,
  ): WasmEngineHandle;
  free(): void;
}

/** The GPU backend's loader: each weight matrix goes to a WebGPU buffer as soon as it arrived. */
export interface WasmGpuModelLoader {
  push(chunk: Uint8Array): void;
  readonly received: number;
  /**
   * Builds the engine once every byte arrived. Without `tokenizerJson` the tokenizer and chat
   * template come from the GGUF's metadata (a config or template given still wins).
   */
  finish(
    tokenizerJson: Uint8Array | null | undefined,
    tokenizerConfig: Uint8Array | null | undefined,
    chatTemplate: string | null | undefined,
    contextLength: number,
  ): Promise<WasmEngineHandle>;
  free(): void;
}

/** A streaming SHA-256 (rust/lean-wasm/src/sha256.rs): cache.ts's Sha256Hasher. */
export interface WasmSha256 {
  update(chunk: Uint8Array): void;
  /** An independent copy of the state. */
  fork(): WasmSha256;
  /** The digest so far as lowercase hex; the hash can go on. */
  hex(): string;
  readonly bytes: number;
  free(): void;
}

export interface WasmModule {
  /**
   * wasm-bindgen's init: fetches and instantiates the .wasm next to the glue, or (a thread of the
   * threads build's pool) instantiates the module it was sent on the shared memory.
   */
  default(init?: { module_or_path: WebAssembly.Module; memory: WebAssembly.Memory }): Promise<unknown>;
  ModelLoader: new (totalBytes: number) => WasmModelLoader;
  /** Opens a WebGPU device and compiles the kernels (both builds have it). */
  GpuModelLoader: { open(totalBytes: number): Promise<WasmGpuModelLoader> };
  Sha256: new () => WasmSha256;
  backend(): string;
  takePanicMessage(): string | undefined;
  /** Multi-thread build only: starts rayon's pool of `threads` Web Workers. */
  initThreadPool?(threads: number): Promise<unknown>;
  /** Multi-thread build only: runs this worker as a thread of the pool (never returns). */
  wbg_rayon_start_worker?(receiver: number): void;
}

/** How to load each build; null when this package was built without it. */
export interface WasmBuildLoaders {
  simd: (() => Promise<WasmModule>) | null;
  threads: (() => Promise<WasmModule>) | null;
  /** The build that runs the GPU backend (the single-thread one: the GPU needs no threads). */
  webgpu: (() => Promise<WasmModule>) | null;
}

/** The JSON of `WasmEngine.step` and `cancel`. */
export interface StepJson {
  tokens: { id: number; text: string }[];
  done: {
    prompt_ids: number[];
    token_ids: number[];
    text: string;
    finish_reason: "stop" | "length" | "context_full" | "cancelled" | "tool_calls";
    /** Prompt ids taken from the KV cache of the previous generation. */
    cached_tokens: number;
    /** Ids the KV cache holds after this generation. */
    cache_length: number;
    /** Speculative decoding's passes and guesses (zeros without it). */
    speculation: {
      verifications: number;
      drafted_tokens: number;
      accepted_tokens: number;
      paused_steps: number;
    };
    /** With tools: the calls the reply made (finish_reason "tool_calls"). */
    tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
  } | null;
}
