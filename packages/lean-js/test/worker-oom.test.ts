// A trap without a Rust panic message (an allocation that failed: wasm32 memory ends at 4 GiB)
// is reported as such, not as an opaque "unreachable".
import { expect, it, vi } from "vitest";
import type { Reply, Request } from "../src/protocol.js";
import type { WasmModule } from "../src/wasm-types.js";

const fakeModule = {
  default: async () => undefined,
  ModelLoader: class {
    received = 0;
    push() {}
    finish(): never {
      throw new WebAssembly.RuntimeError("unreachable");
    }
    free() {}
  },
  backend: () => "simd",
  takePanicMessage: () => undefined,
} as unknown as WasmModule;

vi.mock("../src/wasm-builds.js", () => ({ wasmBuilds: { simd: async () => fakeModule, threads: null } }));
vi.mock("../src/wasm-manifest.js", () => ({ installedBuilds: { simd: true, threads: false, webgpu: false } }));

it("reports a trap without a panic message as most likely out of memory", async () => {
  const replies: Reply[] = [];
  const scope = globalThis as unknown as { postMessage(r: Reply): void; onmessage: ((e: { data: Request }) => void) | null };
  scope.postMessage = (reply) => replies.push(reply);
  await import("../src/worker.js");
  const file = { name: "f", source: { bytes: new ArrayBuffer(4) }, size: null, sha256: null };
  scope.onmessage!({
    data: {
      type: "load",
      id: 0,
      model: { gguf: file, tokenizer: { ...file, source: { bytes: new ArrayBuffer(4) } }, tokenizerConfig: null, chatTemplate: null },
      backend: "simd",
      contextLength: 64,
      threads: 1,
      cacheName: null,
      gpuNeeds: null,
    },
  });
  await vi.waitFor(() => expect(replies.some((r) => r.type === "error")).toBe(true));
  expect(replies.find((r) => r.type === "error")).toEqual({
    type: "error",
    id: 0,
    fatal: true,
    error: {
      name: "LeanPanicError",
      message:
        "the WebAssembly module trapped (unreachable) without a Rust panic: most likely it ran out of memory" +
        " — this engine cannot be used any more: create a new one (or reload the page)",
    },
  });
});
