/**
 * Errors of lean-js. Every error it throws is an `Error` whose `name` is one of {@link ErrorName}
 * (or the name of the underlying error, e.g. `TypeError`), so callers can tell them apart with
 * `e.name` even though they cross from the Web Worker as plain `{name, message}`.
 */
export const ErrorName = {
  /** The requested backend cannot run here (the message says why). */
  BackendUnavailable: "BackendUnavailableError",
  /** The WebAssembly module trapped (a Rust panic or out of memory): the engine is unusable. */
  Panic: "LeanPanicError",
  /**
   * The WebGPU device was lost (driver reset, the browser reclaimed it). lean-js continues a
   * plain generation on the CPU by itself (`engine.backend` changes, a `backendchange` event);
   * one it cannot continue (structured output, tools) rejects with this, and the engine goes on
   * on the CPU.
   */
  DeviceLost: "DeviceLostError",
  /** The engine was disposed, or its worker died. */
  Disposed: "EngineDisposedError",
  /** A model file could not be fetched, or failed its size/sha256 check. */
  ModelFile: "ModelFileError",
  /** The operation was aborted through its AbortSignal (the signal's reason, when it is one). */
  Abort: "AbortError",
  /**
   * The constraint library rejected a `responseFormat` (a JSON schema feature it does not
   * support, a regex or grammar syntax error): the message names the problem. Nothing was
   * generated and the engine stays usable.
   */
  Constraint: "ConstraintError",
  /**
   * `tools`/`toolChoice` (or a chat's tool messages) that cannot be used: not a function tool, a
   * bad name, a `toolChoice` naming no tool, a function's parameters schema the constraint
   * library rejects. The message names the field. Nothing was generated and the engine stays
   * usable.
   */
  Tool: "ToolError",
} as const;

/** How an error crosses the worker boundary. */
export interface WireError {
  name: string;
  message: string;
}

export function leanError(name: string, message: string): Error {
  const error = new Error(message);
  error.name = name;
  return error;
}

export function toWireError(e: unknown): WireError {
  if (e instanceof Error) return { name: e.name, message: e.message };
  // DOMException is an Error in browsers but not in every runtime; anything else is stringified.
  if (typeof e === "object" && e !== null && "name" in e && "message" in e) {
    return { name: String(e.name), message: String(e.message) };
  }
  return { name: "Error", message: String(e) };
}

export function fromWireError(wire: WireError): Error {
  return leanError(wire.name, wire.message);
}
