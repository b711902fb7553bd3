/**
 * The part of the wasm-bindgen module (rust/lean-wasm) that the worker uses. Both builds
 * (single-thread SIMD and multi-thread) have this shape; the multi-thread one adds
 * `initThreadPool`. JSON strings cross the boundary: see rust/lean-wasm/src/lib.rs.
 */
export interface WasmEngineHandle {
  info(): string;
  begin(promptJson: string, optionsJson: string): string;
  step(): string;
  cancel(): string | undefined;
  tokenize(text: string): Uint32Array;
  free(): void;
}

export interface WasmModelLoader {
  push(chunk: Uint8Array): void;
  readonly received: number;
  finish(
    tokenizerJson: Uint8Array,
    tokenizerConfig: Uint8Array | null | undefined,
    chatTemplate: string | null | undefined,
    contextLength: number,
  ): WasmEngineHandle;
  free(): void;
}

export interface WasmModule {
  /** wasm-bindgen's init: fetches and instantiates the .wasm next to the glue. */
  default(): Promise<unknown>;
  ModelLoader: new (totalBytes: number) => WasmModelLoader;
  backend(): string;
  takePanicMessage(): string | undefined;
  /** Multi-thread build only: starts rayon's pool of `threads` Web Workers. */
  initThreadPool?(threads: number): Promise<unknown>;
}

/** How to load each build; null when this package was built without it. */
export interface WasmBuildLoaders {
  simd: (() => Promise<WasmModule>) | null;
  threads: (() => Promise<WasmModule>) | null;
}

/** The JSON of `WasmEngine.step` and `cancel`. */
export interface StepJson {
  tokens: { id: number; text: string }[];
  done: {
    prompt_ids: number[];
    token_ids: number[];
    text: string;
    finish_reason: "stop" | "length" | "context_full" | "cancelled";
  } | null;
}
