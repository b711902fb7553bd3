// The worker's handling of a trapped WebAssembly module, with a fake wasm build whose engine
// traps on demand: the trap becomes a LeanPanicError carrying the Rust panic message, and the
// worker refuses everything after it. The trap comes as it does from wasm-bindgen's async calls:
// thrown inside a microtask, so it reaches the worker's "error" event while the call's Promise
// never settles.
import { beforeAll, describe, expect, it, vi } from "vitest";
import type { Reply, Request } from "../src/protocol.js";
import type { WasmModule } from "../src/wasm-types.js";
import { NodeSha256 } from "./node-sha256.js";

let panicMessage: string | undefined;

/** The worker's global "error" listener (a browser's worker scope dispatches it). */
let onGlobalError: ((event: ErrorEvent) => void) | null = null;
(globalThis as unknown as { addEventListener(type: string, l: (e: ErrorEvent) => void): void }).addEventListener = (
  type,
  listener,
) => {
  if (type === "error") onGlobalError = listener;
};

/** A step whose Promise never settles because the module traps inside a microtask. */
const trap = () =>
  new Promise<string>(() => {
    queueMicrotask(() => {
      const error = new WebAssembly.RuntimeError("unreachable");
      onGlobalError?.({ error, preventDefault() {} } as ErrorEvent);
    });
  });

const fakeEngine = {
  info: () =>
    JSON.stringify({
      architecture: "llama",
      description: "fake",
      backend: "cpu",
      context_length: 64,
      train_context_length: 64,
      vocab_size: 4,
      file_bytes: 3,
      kv_cache_bytes: 0,
      bos_token: null,
      eos_token: null,
      eos_token_ids: [],
      has_chat_template: false,
    }),
  begin: async () => JSON.stringify({ prompt_ids: [1], cached_tokens: 0 }),
  step: trap,
  cancel: () => undefined,
  tokenize: () => new Uint32Array([1]),
  cacheInfo: () => JSON.stringify({ cache_length: 0 }),
  resetCache: () => {},
  deviceLost: () => undefined,
  loseDevice: () => false,
  setDraftModel: () => "fake draft",
  free: () => {},
};

const fakeModule: WasmModule = {
  default: async () => undefined,
  ModelLoader: class {
    received = 0;
    push(chunk: Uint8Array) {
      this.received += chunk.length;
    }
    finish() {
      return fakeEngine;
    }
    free() {}
  },
  GpuModelLoader: {
    open: async () => {
      throw new Error("no WebGPU in this test");
    },
  },
  Sha256: NodeSha256,
  backend: () => "simd",
  takePanicMessage: () => {
    const message = panicMessage;
    panicMessage = undefined;
    return message;
  },
};

vi.mock("../src/wasm-builds.js", () => ({ wasmBuilds: { simd: async () => fakeModule, threads: null } }));
vi.mock("../src/wasm-manifest.js", () => ({ installedBuilds: { simd: true, threads: false, webgpu: false } }));

const replies: Reply[] = [];
const scope = globalThis as unknown as { postMessage(r: Reply): void; onmessage: ((e: { data: Request }) => void) | null };

/** Sends `request` and waits for the reply that ends it. */
async function send(request: Request): Promise<Reply> {
  const before = replies.length;
  scope.onmessage!({ data: request });
  await vi.waitFor(() => {
    if (!replies.slice(before).some((r) => r.id === request.id && r.type !== "progress")) throw new Error("no reply yet");
  });
  return replies.slice(before).find((r) => r.id === request.id && r.type !== "progress")!;
}

const bytes = (n: number) => ({ name: "f", source: { bytes: new ArrayBuffer(n) }, size: null, sha256: null });

beforeAll(async () => {
  scope.postMessage = (reply) => replies.push(reply);
  await import("../src/worker.js");
  const loaded = await send({
    type: "load",
    id: 0,
    model: { gguf: bytes(3), tokenizer: bytes(2), tokenizerConfig: null, chatTemplate: null },
    backend: "auto",
    contextLength: 64,
    threads: 1,
    cacheName: null,
    gpuNeeds: null,
  });
  expect(loaded).toMatchObject({ type: "loaded", backend: "simd" });
});

describe("a trap in the wasm module", () => {
  it("becomes a fatal LeanPanicError with the panic message, and later requests fail with it", async () => {
    const panic = "lean panicked (a bug in lean; reload the module): panicked at src/cpu/mod.rs:10:5: index out of bounds";
    panicMessage = panic;
    const reply = await send({ type: "generate", id: 1, prompt: { raw: "Hi" }, params: {} });
    expect(reply).toEqual({
      type: "error",
      id: 1,
      fatal: true,
      error: {
        name: "LeanPanicError",
        message: `${panic} — this engine cannot be used any more: create a new one (or reload the page)`,
      },
    });
    const later = await send({ type: "tokenize", id: 2, text: "Hi" });
    expect(later).toMatchObject({ type: "error", id: 2, fatal: true, error: { name: "LeanPanicError" } });
    expect((later as Extract<Reply, { type: "error" }>).error.message).toContain("index out of bounds");
  });
});
