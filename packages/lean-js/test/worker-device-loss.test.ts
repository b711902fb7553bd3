// The worker survives a lost WebGPU device (issue 19 §4), with a fake wasm build whose "model"
// is deterministic (each next id is the last one plus 1): the WebGPU engine's step fails with a
// DeviceLostError after some tokens; the worker reads the model again into a CPU engine, begins it
// on the prompt ids and the tokens streamed so far with the tokens left, and the same request
// streams on: every id once, in order, then one result with all of them; a draft model loaded
// before is read again for the CPU engine, which goes on speculating. The real engines run in
// tests/device-loss.spec.js (Chromium) and lean-gpu's tests/device_loss.rs.
import { beforeAll, describe, expect, it, vi } from "vitest";
import type { Reply, Request } from "../src/protocol.js";
import type { WasmEngineHandle, WasmModule } from "../src/wasm-types.js";

/** Steps the WebGPU engine makes before its device is lost. */
let gpuStepsBeforeLoss = 3;
const begun: { backend: string; prompt: unknown; options: Record<string, unknown> }[] = [];
/** The engines given a draft model, and the bytes it had. */
const drafts: { backend: string; bytes: number }[] = [];

function fakeEngine(backend: "gpu" | "cpu"): WasmEngineHandle {
  let ids: number[] = [];
  let promptLen = 0;
  let max = 0;
  let steps = 0;
  let lost = false;
  let draft: string | null = null;
  return {
    info: () =>
      JSON.stringify({
        architecture: "llama",
        description: "fake",
        backend,
        context_length: 64,
        train_context_length: 64,
        vocab_size: 100,
        file_bytes: 3,
        kv_cache_bytes: 0,
        bos_token: null,
        eos_token: null,
        eos_token_ids: [],
        has_chat_template: false,
        draft_model: draft,
      }),
    begin: async (promptJson, optionsJson) => {
      const prompt = JSON.parse(promptJson) as { raw?: string; ids?: number[] };
      const options = JSON.parse(optionsJson) as Record<string, unknown>;
      begun.push({ backend, prompt, options });
      ids = prompt.ids ? [...prompt.ids] : [1, 2];
      promptLen = ids.length;
      max = (options.max_tokens as number | undefined) ?? 256;
      return JSON.stringify({ prompt_ids: ids, cached_tokens: 0 });
    },
    step: async () => {
      if (backend === "gpu" && (lost || steps++ >= gpuStepsBeforeLoss)) {
        lost = true;
        throw Object.assign(new Error("the WebGPU device was lost: Destroyed"), { name: "DeviceLostError" });
      }
      const id = ids[ids.length - 1] + 1;
      ids.push(id);
      const tokens = [{ id, text: ` t${id}` }];
      const generated = ids.slice(promptLen);
      const done =
        generated.length < max
          ? null
          : {
              prompt_ids: ids.slice(0, promptLen),
              token_ids: generated,
              text: "",
              finish_reason: "length",
              cached_tokens: 0,
              cache_length: ids.length - 1,
              speculation: { verifications: 0, drafted_tokens: 0, accepted_tokens: 0, paused_steps: 0 },
            };
      return JSON.stringify({ tokens, done });
    },
    cancel: () => undefined,
    tokenize: () => new Uint32Array([1]),
    cacheInfo: () => JSON.stringify({ cache_length: 0 }),
    resetCache: () => {},
    deviceLost: () => (lost ? "Destroyed" : undefined),
    loseDevice: () => backend === "gpu",
    setDraftModel: (loader) => {
      drafts.push({ backend, bytes: loader.received });
      draft = `fake draft beside ${backend}`;
      return draft;
    },
    free: () => {},
  };
}

class FakeLoader {
  received = 0;
  constructor(private readonly backend: "gpu" | "cpu") {}
  push(chunk: Uint8Array) {
    this.received += chunk.length;
  }
  finish() {
    return this.backend === "gpu" ? Promise.resolve(fakeEngine("gpu")) : fakeEngine("cpu");
  }
  free() {}
}

const fakeModule = {
  default: async () => undefined,
  ModelLoader: class extends FakeLoader {
    constructor() {
      super("cpu");
    }
  },
  GpuModelLoader: { open: async () => new FakeLoader("gpu") },
  backend: () => "simd",
  takePanicMessage: () => undefined,
} as unknown as WasmModule;

vi.mock("../src/wasm-builds.js", () => ({ wasmBuilds: { simd: async () => fakeModule, webgpu: async () => fakeModule, threads: null } }));
vi.mock("../src/wasm-manifest.js", () => ({ installedBuilds: { simd: true, threads: false, webgpu: true } }));
vi.mock("../src/capabilities.js", () => ({
  detectCapabilities: async () => ({}),
  chooseBackend: () => ({ backend: "webgpu", reason: "forced" }),
}));

const replies: Reply[] = [];
const scope = globalThis as unknown as { postMessage(r: Reply): void; onmessage: ((e: { data: Request }) => void) | null };

/** Sends `request` and waits for the reply that ends it; returns every reply to it. */
async function send(request: Request): Promise<Reply[]> {
  const before = replies.length;
  const ends = (r: Reply) => r.id === request.id && ["loaded", "draftLoaded", "done", "error"].includes(r.type);
  scope.onmessage!({ data: request });
  await vi.waitFor(() => {
    if (!replies.slice(before).some(ends)) throw new Error("no reply yet");
  });
  return replies.slice(before).filter((r) => r.id === request.id && r.type !== "progress");
}

const bytes = (n: number) => ({ name: "f", source: { bytes: new ArrayBuffer(n) }, size: null, sha256: null });

beforeAll(async () => {
  scope.postMessage = (reply) => replies.push(reply);
  await import("../src/worker.js");
  const [loaded] = await send({
    type: "load",
    id: 0,
    model: { gguf: bytes(3), tokenizer: bytes(2), tokenizerConfig: null, chatTemplate: null },
    backend: "webgpu",
    contextLength: 64,
    threads: 1,
    cacheName: null,
    gpuNeeds: null,
  });
  expect(loaded).toMatchObject({ type: "loaded", backend: "webgpu" });
});

describe("a WebGPU device lost mid-generation", () => {
  it("goes on on a CPU engine: every id once, in order, and the backend change is announced", async () => {
    // A draft model, which the CPU engine gets too: the generation goes on speculating.
    const draftReplies = await send({ type: "loadDraft", id: 9, draft: bytes(5) });
    expect(draftReplies.at(-1)).toEqual({ type: "draftLoaded", id: 9, draftModel: "fake draft beside gpu" });
    expect(draftReplies.some((r) => r.type === "warning" && /draft model runs on the CPU/.test(r.message))).toBe(true);
    const params = { maxTokens: 7, speculative: { draft: 4 } };
    const out = await send({ type: "generate", id: 1, prompt: { raw: "Hi" }, params });
    const streamed = out.flatMap((r) => (r.type === "tokens" ? r.tokens.map((t) => t.tokenId) : []));
    expect(streamed).toEqual([3, 4, 5, 6, 7, 8, 9]);
    const change = out.find((r) => r.type === "backendChange");
    expect(change).toMatchObject({ type: "backendChange", backend: "simd" });
    expect((change as Extract<Reply, { type: "backendChange" }>).backendReason).toMatch(/WebGPU device was lost/);
    // The CPU engine began on the prompt and the 3 tokens streamed, for the 4 left.
    expect(begun.at(-1)).toMatchObject({ backend: "cpu", prompt: { ids: [1, 2, 3, 4, 5] }, options: { max_tokens: 4, draft: 4 } });
    expect(drafts).toEqual([
      { backend: "gpu", bytes: 5 },
      { backend: "cpu", bytes: 5 },
    ]);
    expect((change as Extract<Reply, { type: "backendChange" }>).info.draftModel).toBe("fake draft beside cpu");
    const done = out.at(-1) as Extract<Reply, { type: "done" }>;
    expect(done.type).toBe("done");
    expect(done.result.tokenIds).toEqual([3, 4, 5, 6, 7, 8, 9]);
    expect(done.result.promptTokens).toBe(2);
    expect(done.result.text).toBe(" t3 t4 t5 t6 t7 t8 t9");
    expect(done.result.finishReason).toBe("length");
  });

  it("leaves the engine on the CPU for the next generation", async () => {
    const out = await send({ type: "generate", id: 2, prompt: { raw: "Hi" }, params: { maxTokens: 2 } });
    expect(out.some((r) => r.type === "backendChange")).toBe(false);
    expect(begun.at(-1)).toMatchObject({ backend: "cpu" });
    expect((out.at(-1) as Extract<Reply, { type: "done" }>).result.tokenIds).toEqual([3, 4]);
  });
});
