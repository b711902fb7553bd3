// createEngine's model spec: what it accepts (a catalog id, or { gguf } alone or with tokenizer
// files, each a URL, File, Blob, ArrayBuffer or Uint8Array), the TypeErrors for what it does not,
// and the load request it sends the worker (the wire format). The worker is a fake that records
// the request and answers "loaded".
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { createEngine, type CreateEngineOptions } from "../src/index.js";
import type { LoadRequest, ModelInfo, Reply, Request, WireFile } from "../src/protocol.js";

const info: ModelInfo = {
  architecture: "llama",
  description: "llama · 30 layers",
  session: "cpu",
  contextLength: 2048,
  trainContextLength: 8192,
  vocabSize: 49152,
  fileBytes: 1,
  kvCacheBytes: 2,
  bosToken: null,
  eosToken: "<|im_end|>",
  eosTokenIds: [2],
  hasChatTemplate: true,
  tokenizerFromGguf: true,
  draftModel: null,
  cachedTokens: 0,
};

/** Every worker createEngine made, with the requests and transfer lists it was sent. */
const workers: FakeWorker[] = [];
/** How a fake worker answers a loadDraft. */
let draftReply = (id: number): Reply => ({ type: "draftLoaded", id, draftModel: "draft on cpu" });

class FakeWorker {
  onmessage: ((event: MessageEvent<Reply>) => void) | null = null;
  onerror: ((event: ErrorEvent) => void) | null = null;
  requests: Request[] = [];
  transfers: Transferable[][] = [];
  terminated = false;
  constructor(
    readonly url: URL,
    readonly options: WorkerOptions,
  ) {
    workers.push(this);
  }
  postMessage(message: Request, transfer: Transferable[] = []) {
    this.requests.push(message);
    this.transfers.push(transfer);
    if (message.type === "load") {
      queueMicrotask(() =>
        this.onmessage?.({
          data: { type: "loaded", id: message.id, backend: "simd", backendReason: "test", info },
        } as MessageEvent<Reply>),
      );
    }
    if (message.type === "loadDraft") {
      queueMicrotask(() => this.onmessage?.({ data: draftReply(message.id) } as MessageEvent<Reply>));
    }
  }
  terminate() {
    this.terminated = true;
  }
}

beforeEach(() => {
  workers.length = 0;
  vi.stubGlobal("Worker", FakeWorker);
  // Relative URLs resolve against the page, as in a browser.
  vi.stubGlobal("document", { baseURI: "http://127.0.0.1:5173/app/chat.html" });
});

afterEach(() => {
  vi.unstubAllGlobals();
});

/** The load request createEngine sends for `options`, and the ArrayBuffers it transfers. */
async function loadRequest(options: CreateEngineOptions): Promise<{ load: LoadRequest; transfer: Transferable[] }> {
  const engine = await createEngine({ cache: false, ...options });
  engine.dispose();
  expect(workers).toHaveLength(1);
  const [worker] = workers;
  expect(worker!.requests[0]?.type).toBe("load");
  return { load: worker!.requests[0] as LoadRequest, transfer: worker!.transfers[0]! };
}

const url = (href: string): WireFile => ({ name: href, source: { url: href }, size: null, sha256: null });

describe("createEngine: a GGUF alone", () => {
  it("from a URL (relative to the page): no tokenizer files on the wire", async () => {
    const { load } = await loadRequest({ model: { gguf: "models/m.gguf" } });
    expect(load.model).toEqual({
      gguf: url("http://127.0.0.1:5173/app/models/m.gguf"),
      tokenizer: null,
      tokenizerConfig: null,
      chatTemplate: null,
    });
    // Not a catalog model: the default context, and nothing known of the GPU needs.
    expect(load).toMatchObject({ contextLength: 4096, gpuNeeds: null, cacheName: null });
  });

  it("from a URL object", async () => {
    const { load } = await loadRequest({ model: { gguf: new URL("https://example.com/x/m.gguf") } });
    expect(load.model.gguf).toEqual(url("https://example.com/x/m.gguf"));
  });

  it("from a File (its name) or a Blob, sent as is (streamed by the worker)", async () => {
    const file = new File([new Uint8Array(4)], "picked.gguf");
    const fromFile = await loadRequest({ model: { gguf: file } });
    expect(fromFile.load.model.gguf).toEqual({ name: "picked.gguf", source: { blob: file }, size: null, sha256: null });
    expect(fromFile.transfer).toEqual([]);
    workers.length = 0;
    const blob = new Blob([new Uint8Array(4)]);
    const fromBlob = await loadRequest({ model: { gguf: blob } });
    expect(fromBlob.load.model).toEqual({
      gguf: { name: "gguf (Blob)", source: { blob }, size: null, sha256: null },
      tokenizer: null,
      tokenizerConfig: null,
      chatTemplate: null,
    });
  });

  it("from an ArrayBuffer, transferred to the worker", async () => {
    const bytes = new ArrayBuffer(16);
    const { load, transfer } = await loadRequest({ model: { gguf: bytes } });
    expect(load.model.gguf).toEqual({ name: "gguf (ArrayBuffer)", source: { bytes }, size: null, sha256: null });
    expect(load.model.tokenizer).toBeNull();
    expect(transfer).toEqual([bytes]);
  });

  it("from a Uint8Array: its buffer when it spans all of it, else a copy of its bytes", async () => {
    const whole = new Uint8Array(8);
    const first = await loadRequest({ model: { gguf: whole } });
    expect((first.load.model.gguf.source as { bytes: ArrayBuffer }).bytes).toBe(whole.buffer);
    workers.length = 0;
    const part = new Uint8Array([1, 2, 3, 4, 5]).subarray(1, 3);
    const second = await loadRequest({ model: { gguf: part } });
    const sent = (second.load.model.gguf.source as { bytes: ArrayBuffer }).bytes;
    expect(Array.from(new Uint8Array(sent))).toEqual([2, 3]);
  });

  it("absent and null tokenizer files are the same", async () => {
    const { load } = await loadRequest({
      model: { gguf: "m.gguf", tokenizer: undefined, tokenizerConfig: null as never, chatTemplate: undefined },
    });
    expect(load.model).toMatchObject({ tokenizer: null, tokenizerConfig: null, chatTemplate: null });
  });
});

describe("createEngine: a GGUF with tokenizer files", () => {
  it("sends every file given (the full spec, as before)", async () => {
    const { load } = await loadRequest({
      model: { gguf: "m.gguf", tokenizer: "t/tokenizer.json", tokenizerConfig: "t/tokenizer_config.json", chatTemplate: "t/chat_template.jinja" },
    });
    expect(load.model).toEqual({
      gguf: url("http://127.0.0.1:5173/app/m.gguf"),
      tokenizer: url("http://127.0.0.1:5173/app/t/tokenizer.json"),
      tokenizerConfig: url("http://127.0.0.1:5173/app/t/tokenizer_config.json"),
      chatTemplate: url("http://127.0.0.1:5173/app/t/chat_template.jinja"),
    });
  });

  it("a tokenizer.json without a config, or only a chat template over the GGUF's tokenizer", async () => {
    const { load } = await loadRequest({ model: { gguf: "m.gguf", tokenizer: "tokenizer.json" } });
    expect(load.model).toMatchObject({ tokenizer: url("http://127.0.0.1:5173/app/tokenizer.json"), tokenizerConfig: null, chatTemplate: null });
    workers.length = 0;
    const template = new Blob(["{{ messages }}"]);
    const second = await loadRequest({ model: { gguf: "m.gguf", chatTemplate: template } });
    expect(second.load.model).toMatchObject({
      tokenizer: null,
      tokenizerConfig: null,
      chatTemplate: { name: "chatTemplate (Blob)", source: { blob: template } },
    });
  });

  it("a catalog id sends the catalog's files with their sizes and checksums", async () => {
    const { load } = await loadRequest({ model: "smollm2-135m-instruct-q4_0" });
    expect(load.model.gguf).toMatchObject({
      name: "http://127.0.0.1:5173/app/models/smollm2-135m-instruct-q4_0.gguf",
      size: 77571136,
      sha256: "dc51cbdc90dfb5c74a00a173bbc5ff4609f0df10a2a535040d484246c347da16",
    });
    expect(load.model.tokenizer?.name).toBe("http://127.0.0.1:5173/app/models/smollm2-135m-instruct/tokenizer.json");
    expect(load.model.chatTemplate?.name).toBe("http://127.0.0.1:5173/app/models/smollm2-135m-instruct/chat_template.jinja");
    expect(load.contextLength).toBe(2048);
  });
});

describe("createEngine: TypeErrors for a bad model spec, before any worker starts", () => {
  const rejects = async (model: unknown, message: RegExp) => {
    await expect(createEngine({ model: model as CreateEngineOptions["model"] })).rejects.toThrow(
      expect.objectContaining({ name: "TypeError", message: expect.stringMatching(message) }),
    );
    expect(workers).toHaveLength(0);
  };

  it("no gguf", async () => {
    await rejects({}, /^model\.gguf is required: model must be a catalog id or \{ gguf, tokenizer\?, tokenizerConfig\?, chatTemplate\? \}/);
    await rejects({ tokenizer: "t.json", tokenizerConfig: "c.json" }, /^model\.gguf is required/);
    await rejects({ gguf: "" }, /^model\.gguf is required/);
  });

  it("a file given where the spec object belongs", async () => {
    await rejects(new Blob([]), /^model must be a catalog id or \{ gguf, tokenizer\?, tokenizerConfig\?, chatTemplate\? \}: .*got Blob$/);
    await rejects(new ArrayBuffer(4), /got ArrayBuffer$/);
    await rejects(new URL("https://example.com/m.gguf"), /got URL$/);
    await rejects(null, /got null$/);
    await rejects(42, /got number$/);
  });

  it("a file of the wrong type, naming the file", async () => {
    await rejects({ gguf: 42 }, /^model\.gguf must be a URL \(string or URL\), File, Blob, ArrayBuffer or Uint8Array, got number$/);
    await rejects({ gguf: "m.gguf", tokenizer: { url: "t.json" } }, /^model\.tokenizer must be .*, got Object$/);
    await rejects({ gguf: "m.gguf", chatTemplate: "" }, /^model\.chatTemplate must be .*, got an empty string$/);
  });

  it("an unknown file name (a typo) rather than ignoring it", async () => {
    await rejects({ gguf: "m.gguf", tokenizerJson: "t.json" }, /^unknown model file 'tokenizerJson' \(known: gguf, tokenizer, tokenizerConfig, chatTemplate\)$/);
  });

  it("an unknown catalog id, with a hint when it looks like a file", async () => {
    await rejects("gpt-5", /^unknown model id 'gpt-5' \(known: .*smollm2-135m-instruct-q4_0.*\)$/);
    await rejects("models/m.gguf", /; for a GGUF file give model: \{ gguf: "models\/m\.gguf" \}$/);
  });
});

describe("createEngine: a draft model", () => {
  it("loads it after the model (a catalog id, from modelBaseUrl) and says so in info.draftModel", async () => {
    const engine = await createEngine({ cache: false, model: "smollm2-135m-instruct-q4_0", draft: "smollm2-135m-instruct-q8_0" });
    const [worker] = workers;
    expect(worker!.requests.map((r) => r.type)).toEqual(["load", "loadDraft"]);
    const request = worker!.requests[1] as Extract<Request, { type: "loadDraft" }>;
    expect(request.draft).toMatchObject({
      name: "http://127.0.0.1:5173/app/models/smollm2-135m-instruct-q8_0.gguf",
      size: 144811072,
      sha256: "0c1d3326cd9793cfb7296113c063dd5c24e2bd734b48ec1a3d01b7158eca9387",
    });
    expect(engine.info.draftModel).toBe("draft on cpu");
    engine.dispose();
  });

  it("a refused draft model fails the load and ends the worker", async () => {
    draftReply = (id) => ({ type: "error", id, error: { name: "Error", message: "the draft model's vocabulary has 151936 tokens" }, fatal: false });
    try {
      await expect(createEngine({ cache: false, model: { gguf: "m.gguf" }, draft: { gguf: "d.gguf" } })).rejects.toThrow(
        "the draft model's vocabulary has 151936 tokens",
      );
      expect(workers[0]!.terminated).toBe(true);
    } finally {
      draftReply = (id) => ({ type: "draftLoaded", id, draftModel: "draft on cpu" });
    }
  });

  it("a malformed draft spec is a TypeError before any worker starts", async () => {
    await expect(createEngine({ model: { gguf: "m.gguf" }, draft: "d.gguf" })).rejects.toThrow(
      expect.objectContaining({ name: "TypeError", message: expect.stringMatching(/^unknown draft model id 'd\.gguf'/) }),
    );
    await expect(createEngine({ model: { gguf: "m.gguf" }, draft: { gguf: "d.gguf", sha: "x" } as never })).rejects.toThrow(
      "unknown field 'sha' in draft (known: gguf, sha256)",
    );
    expect(workers).toHaveLength(0);
  });
});
