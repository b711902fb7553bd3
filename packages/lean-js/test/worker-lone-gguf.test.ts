// The worker with a fake wasm module: a GGUF given alone reaches `ModelLoader.finish` without a
// tokenizer.json (so the engine reads the tokenizer from the GGUF), no tokenizer file is opened
// or reported, and the model info says where the tokenizer came from. Given files still go
// through, in order. (worker.test.ts runs the real wasm build.)
import { expect, it, vi } from "vitest";
import type { LoadRequest, Reply, Request, WireFile } from "../src/protocol.js";
import type { WasmModule } from "../src/wasm-types.js";

/** What each `finish` was called with (the GGUF's bytes as received). */
const finishes: { gguf: number[]; tokenizerJson: unknown; tokenizerConfig: unknown; chatTemplate: unknown; contextLength: number }[] = [];

const engineInfo = (fromGguf: boolean) =>
  JSON.stringify({
    architecture: "llama",
    description: "test",
    backend: "cpu",
    context_length: 64,
    train_context_length: 8192,
    vocab_size: 49152,
    file_bytes: 4,
    kv_cache_bytes: 0,
    bos_token: null,
    eos_token: "<|im_end|>",
    eos_token_ids: [2],
    has_chat_template: true,
    tokenizer_from_gguf: fromGguf,
  });

const fakeModule = {
  default: async () => undefined,
  ModelLoader: class {
    bytes: number[] = [];
    push(chunk: Uint8Array) {
      this.bytes.push(...chunk);
    }
    get received() {
      return this.bytes.length;
    }
    finish(tokenizerJson: unknown, tokenizerConfig: unknown, chatTemplate: unknown, contextLength: number) {
      finishes.push({ gguf: this.bytes, tokenizerJson, tokenizerConfig, chatTemplate, contextLength });
      return { info: () => engineInfo(tokenizerJson === null || tokenizerJson === undefined), free() {} };
    }
    free() {}
  },
  backend: () => "simd",
  takePanicMessage: () => undefined,
} as unknown as WasmModule;

vi.mock("../src/wasm-builds.js", () => ({ wasmBuilds: { simd: async () => fakeModule, threads: null } }));
vi.mock("../src/wasm-manifest.js", () => ({ installedBuilds: { simd: true, threads: false, webgpu: false } }));

const bytesFile = (name: string, bytes: number[]): WireFile => ({
  name,
  source: { bytes: new Uint8Array(bytes).buffer },
  size: null,
  sha256: null,
});

/** Loads `model` in a fresh worker module; returns its replies once it answered. */
async function load(model: LoadRequest["model"]): Promise<Reply[]> {
  vi.resetModules();
  const replies: Reply[] = [];
  const scope = globalThis as unknown as { postMessage(r: Reply): void; onmessage: ((e: { data: Request }) => void) | null };
  scope.postMessage = (reply) => replies.push(reply);
  await import("../src/worker.js");
  scope.onmessage!({
    data: { type: "load", id: 0, model, backend: "simd", contextLength: 64, threads: 1, cacheName: null, gpuNeeds: null },
  });
  await vi.waitFor(() => expect(replies.some((r) => r.type === "loaded" || r.type === "error")).toBe(true));
  return replies;
}

it("a GGUF alone: finish gets no tokenizer files, and only the GGUF's progress is reported", async () => {
  finishes.length = 0;
  const replies = await load({ gguf: bytesFile("m.gguf", [71, 71, 85, 70]), tokenizer: null, tokenizerConfig: null, chatTemplate: null });
  expect(replies.find((r) => r.type === "error")).toBeUndefined();
  expect(finishes).toEqual([{ gguf: [71, 71, 85, 70], tokenizerJson: null, tokenizerConfig: null, chatTemplate: null, contextLength: 64 }]);
  const files = new Set(replies.flatMap((r) => (r.type === "progress" ? [r.progress.file] : [])));
  expect([...files]).toEqual(["gguf"]);
  const loaded = replies.find((r) => r.type === "loaded");
  expect(loaded?.type === "loaded" && loaded.info.tokenizerFromGguf).toBe(true);
});

it("a GGUF with a chat template only: the template goes through, still no tokenizer.json", async () => {
  finishes.length = 0;
  const template = [...new TextEncoder().encode("{{ x }}")];
  await load({ gguf: bytesFile("m.gguf", [1, 2]), tokenizer: null, tokenizerConfig: null, chatTemplate: bytesFile("t.jinja", template) });
  expect(finishes).toMatchObject([{ tokenizerJson: null, tokenizerConfig: null, chatTemplate: "{{ x }}" }]);
});

it("tokenizer files given: all of them reach finish, and info says they were used", async () => {
  finishes.length = 0;
  const replies = await load({
    gguf: bytesFile("m.gguf", [1]),
    tokenizer: bytesFile("tokenizer.json", [123, 125]),
    tokenizerConfig: bytesFile("tokenizer_config.json", [123, 32, 125]),
    chatTemplate: null,
  });
  expect(finishes).toHaveLength(1);
  expect(Array.from(finishes[0]!.tokenizerJson as Uint8Array)).toEqual([123, 125]);
  expect(Array.from(finishes[0]!.tokenizerConfig as Uint8Array)).toEqual([123, 32, 125]);
  expect(finishes[0]!.chatTemplate).toBeNull();
  const loaded = replies.find((r) => r.type === "loaded");
  expect(loaded?.type === "loaded" && loaded.info.tokenizerFromGguf).toBe(false);
});
