// The worker (src/worker.ts) with the real single-thread wasm build, driven through the Engine
// client as a page would, in Node: token-exact against the Hugging Face fixture, cancellation,
// stop strings, queueing. Needs `npm run build` (src/wasm/) and the test models.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { findModel } from "../src/catalog.js";
import { catalogFiles } from "../src/catalog.js";
import { Engine } from "../src/engine.js";
import type { WireFile } from "../src/protocol.js";
import { inProcessWorker, installFileFetch } from "./in-process-worker.js";
import { modelsDir, repo } from "./models.js";

const wasmFile = join(import.meta.dirname, "../src/wasm/simd/lean_wasm_bg.wasm");
const modelId = "smollm2-135m-instruct-q4_0";
const fixture = JSON.parse(readFileSync(join(repo, "fixtures/hf", `${modelId}.json`), "utf8"));
const chatShort = fixture.cases.find((c: { name: string }) => c.name === "chat_short");
/** lean-cli's constrained greedy outputs (scripts/gen_constraint_fixtures.py). */
const constrained = JSON.parse(readFileSync(join(repo, "fixtures/constraint", `${modelId}.json`), "utf8"));
const cityCase = constrained.cases.find((c: { name: string }) => c.name === "city");

const missing = [wasmFile, join(modelsDir, `${modelId}.gguf`)].filter((f) => !existsSync(f));
if (missing.length > 0 && process.env.CI) throw new Error(`missing: ${missing.join(", ")} (run npm run build; set LEAN_MODELS)`);

describe.skipIf(missing.length > 0)("the worker with the wasm engine", () => {
  let engine: Engine;
  const warnings: string[] = [];
  const greedy: number[] = chatShort.greedy_ids;

  beforeAll(async () => {
    installFileFetch();
    const model = findModel(modelId)!;
    const files = Object.fromEntries(
      catalogFiles(model, pathToFileURL(modelsDir + "/")).map(({ role, file }) => [
        role,
        { name: file.url, source: { url: file.url }, size: file.size, sha256: file.sha256 } satisfies WireFile,
      ]),
    );
    engine = await Engine.start(
      await inProcessWorker(),
      {
        model: {
          gguf: files.gguf!,
          tokenizer: files.tokenizer!,
          tokenizerConfig: files.tokenizerConfig!,
          chatTemplate: files.chatTemplate!,
        },
        backend: "auto",
        contextLength: 2048,
        threads: 1,
        cacheName: null,
        gpuNeeds: model.gpu,
      },
      { onWarning: (m) => warnings.push(m) },
    );
  }, 120_000);

  it("loads on the simd backend and says why not threads", () => {
    expect(engine.backend).toBe("simd");
    // Node is never cross-origin isolated: the reason names the headers, or the missing build.
    expect(engine.backendReason).toMatch(
      /threads: (this lean-js build has no multi-thread WebAssembly build|the page is not cross-origin isolated)/,
    );
    expect(engine.info).toMatchObject({
      architecture: "llama",
      contextLength: 2048,
      vocabSize: 49152,
      fileBytes: 77571136,
      eosToken: "<|im_end|>",
      eosTokenIds: [2, 0],
      hasChatTemplate: true,
    });
    expect(warnings).toEqual([]);
  });

  it("chat gives the reference tokens, streamed", async () => {
    const stream = engine.chat(chatShort.messages, { maxTokens: 12 });
    const tokens = [];
    for await (const token of stream) tokens.push(token);
    const result = await stream.result;
    expect(result.tokenIds).toEqual(greedy.slice(0, 12));
    expect(tokens.map((t) => t.tokenId)).toEqual(greedy.slice(0, 12));
    expect(tokens.map((t) => t.text).join("")).toBe(result.text);
    expect(chatShort.greedy_text.startsWith(result.text)).toBe(true);
    expect(result).toMatchObject({ promptTokens: chatShort.prompt_ids.length, finishReason: "length", stopString: null });
    expect(result.decodeTokensPerSecond).toBeGreaterThan(0);
  }, 60_000);

  it("breaking out of the loop stops within a token or two; the next generation is exact", async () => {
    const stream = engine.chat(chatShort.messages, { maxTokens: 40 });
    let seen = 0;
    for await (const _ of stream) if (++seen === 3) break;
    const stopped = await stream.result;
    expect(stopped.finishReason).toBe("cancelled");
    expect(stopped.tokenIds.length).toBeGreaterThanOrEqual(3);
    expect(stopped.tokenIds.length).toBeLessThanOrEqual(6);
    expect(stopped.tokenIds).toEqual(greedy.slice(0, stopped.tokenIds.length));
    const again = engine.chat(chatShort.messages, { maxTokens: 5 });
    for await (const _ of again);
    expect((await again.result).tokenIds).toEqual(greedy.slice(0, 5));
  }, 60_000);

  it("an AbortSignal stops it; a generation queued meanwhile runs after, exactly", async () => {
    const controller = new AbortController();
    const aborted = engine.chat(chatShort.messages, { maxTokens: 40, signal: controller.signal });
    const queued = engine.chat(chatShort.messages, { maxTokens: 4 });
    const queuedIds: number[] = [];
    const queuedRun = (async () => {
      for await (const t of queued) queuedIds.push(t.tokenId);
    })();
    await expect(
      (async () => {
        for await (const _ of aborted) controller.abort();
      })(),
    ).rejects.toMatchObject({ name: "AbortError" });
    await queuedRun;
    expect((await aborted.result).finishReason).toBe("cancelled");
    expect(queuedIds).toEqual(greedy.slice(0, 4));
  }, 60_000);

  it("a stop string ends the generation before it", async () => {
    const stream = engine.chat(chatShort.messages, { maxTokens: 20, stop: [" Paris"] });
    let text = "";
    for await (const t of stream) text += t.text;
    const result = await stream.result;
    expect(text).toBe("The capital of France is");
    expect(result).toMatchObject({ text, finishReason: "stop", stopString: " Paris" });
    expect(result.tokenIds).toEqual(greedy.slice(0, result.tokenIds.length));
  }, 60_000);

  it("a JSON schema constrains the reply to lean-cli's output; a rejected schema is a ConstraintError", async () => {
    const responseFormat = { type: "json_schema", json_schema: { name: "city", schema: cityCase.schema, strict: true } } as const;
    const stream = engine.chat(cityCase.messages, { maxTokens: cityCase.max_tokens, responseFormat });
    let text = "";
    for await (const t of stream) text += t.text;
    const result = await stream.result;
    expect(result).toMatchObject({ tokenIds: cityCase.token_ids, text: cityCase.text, finishReason: cityCase.finish_reason });
    expect(text).toBe(cityCase.text);
    expect(JSON.parse(text)).toMatchObject({ country: "France" });

    const bad = engine.chat(cityCase.messages, {
      maxTokens: 8,
      responseFormat: { type: "json_schema", json_schema: { name: "bad", schema: { type: "strng" } } },
    });
    await expect(bad.result).rejects.toMatchObject({ name: "ConstraintError", message: expect.stringMatching(/^invalid json_schema: .*strng/) });
    await expect(
      engine.chat(cityCase.messages, { maxTokens: 8, responseFormat: { type: "regex", pattern: "(a" } }).result,
    ).rejects.toMatchObject({ name: "ConstraintError", message: expect.stringMatching(/^invalid regex/) });
    expect(engine.usable).toBe(true);

    // Cut short by max_tokens: "length", the same ids so far.
    const cut = engine.chat(cityCase.messages, { maxTokens: 5, responseFormat });
    for await (const _ of cut);
    expect(await cut.result).toMatchObject({ tokenIds: cityCase.token_ids.slice(0, 5), finishReason: "length" });
    // A regex and a grammar; then free text is unconstrained again.
    const digits = engine.generate("The year is", { maxTokens: 8, responseFormat: { type: "regex", pattern: " [0-9]{4}\\." } });
    for await (const _ of digits);
    expect((await digits.result).text).toMatch(/^ [0-9]{4}\.$/);
    const answer = engine.chat(chatShort.messages, { maxTokens: 8, responseFormat: { type: "grammar", lark: 'start: "Yes" | "No"' } });
    for await (const _ of answer);
    expect(["Yes", "No"]).toContain((await answer.result).text);
    const free = engine.chat(chatShort.messages, { maxTokens: 5 });
    for await (const _ of free);
    expect((await free.result).tokenIds).toEqual(greedy.slice(0, 5));
  }, 60_000);

  it("memoryInfo reports the wasm memory, which holds the weights and stays put across generations", async () => {
    await engine.chat(chatShort.messages, { maxTokens: 4, temperature: 0 }).result; // scratch in place
    const before = await engine.memoryInfo();
    expect(before.wasmMemoryBytes).toBeGreaterThan(engine.info.fileBytes);
    expect(before.wasmMemoryBytes % 65536).toBe(0);
    for (let i = 0; i < 3; i++) await engine.chat(chatShort.messages, { maxTokens: 4, temperature: 0 }).result;
    expect(await engine.memoryInfo()).toEqual(before);
  });

  it("tokenize gives a raw prompt's ids", async () => {
    expect(await engine.tokenize(chatShort.prompt_text)).toEqual(chatShort.prompt_ids);
  });

  it("an option the engine refuses is a readable error; the engine stays usable", async () => {
    await expect(engine.generate("Hi", { temperature: -1 }).next()).rejects.toThrow(/temperature must be a finite number ≥ 0/);
    await expect(engine.generate([]).next()).rejects.toThrow(/empty conversation/);
    expect(engine.usable).toBe(true);
    expect(await engine.tokenize("Hi")).toEqual(expect.any(Array));
  });
});
