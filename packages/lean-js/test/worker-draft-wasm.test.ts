// Speculative decoding by a draft model (`engine.loadDraft`, `speculative: { draft: n }`) through
// the worker with the real single-thread wasm build, in Node: SmolLM2-135M Q8_0 drafting for its
// Q4_0 gives the Q4_0's greedy ids exactly (the Hugging Face reference, and the engine's own plain
// greedy ids) with guesses accepted; a draft model of another vocabulary is refused, naming the
// difference, and the engine goes on with what it had. Needs `npm run build` (src/wasm/) and the
// test models.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { findModel } from "../src/catalog.js";
import { Engine } from "../src/engine.js";
import type { ChatTurn, GenerateParams, GenerationResult, LoadProgress } from "../src/protocol.js";
import { inProcessWorker, installFileFetch } from "./in-process-worker.js";
import { modelsDir, repo, wireModel } from "./models.js";

const wasmFile = join(import.meta.dirname, "../src/wasm/simd/lean_wasm_bg.wasm");
const target = "smollm2-135m-instruct-q4_0";
const draft = "smollm2-135m-instruct-q8_0";
const otherVocabulary = "qwen2.5-coder-0.5b-instruct-q4_0";
const fixture = JSON.parse(readFileSync(join(repo, "fixtures/hf", `${target}.json`), "utf8"));
const testCase = (name: string) => fixture.cases.find((c: { name: string }) => c.name === name);
const modelBaseUrl = pathToFileURL(modelsDir + "/");

const missing = [wasmFile, ...[target, draft, otherVocabulary].map((m) => join(modelsDir, `${m}.gguf`))].filter((f) => !existsSync(f));
if (missing.length > 0 && process.env.CI) throw new Error(`missing: ${missing.join(", ")} (run npm run build; set LEAN_MODELS)`);

describe.skipIf(missing.length > 0)("a draft model on the wasm engine", () => {
  let engine: Engine;

  beforeAll(async () => {
    installFileFetch();
    const model = findModel(target)!;
    engine = await Engine.start(await inProcessWorker(), {
      model: wireModel(model, modelBaseUrl),
      backend: "simd",
      contextLength: 1024,
      threads: 1,
      cacheName: null,
      gpuNeeds: null,
    });
  }, 120_000);

  async function run(prompt: string | ChatTurn[], params: GenerateParams): Promise<GenerationResult> {
    const stream = engine.generate(prompt, params);
    const streamed: number[] = [];
    for await (const token of stream) streamed.push(token.tokenId);
    const result = await stream.result;
    // Accepted guesses come out one token at a time, as plain steps do.
    expect(streamed).toEqual(result.tokenIds);
    return result;
  }

  it("speculative.draft without a draft model is a readable error; the engine stays usable", async () => {
    expect(engine.info.draftModel).toBeNull();
    const c = testCase("chat_short");
    await expect(run(c.messages, { maxTokens: 4, speculative: { draft: 4 } })).rejects.toThrow(
      "speculative.draft needs a draft model: load one first (engine.loadDraft, or createEngine's draft option)",
    );
    expect(engine.usable).toBe(true);
    expect((await run(c.messages, { maxTokens: 4, stopTokenIds: [] })).tokenIds).toEqual(c.greedy_ids.slice(0, 4));
  }, 60_000);

  it("drafted by SmolLM2 Q8_0: the Q4_0's greedy ids exactly, with guesses accepted", async () => {
    const progress: LoadProgress[] = [];
    const loaded = await engine.loadDraft(draft, { modelBaseUrl, onProgress: (p) => progress.push(p) });
    expect(loaded).toMatch(/^llama.* on cpu \(simd128, 1 thread\)$/);
    expect(engine.info.draftModel).toBe(loaded);
    expect(progress.at(-1)).toMatchObject({ file: "draft", loaded: 144811072, total: 144811072 });
    expect(progress.every((p) => p.file === "draft" && p.name.endsWith(`${draft}.gguf`))).toBe(true);

    for (const name of ["chat_short", "chat_system", "raw_code"]) {
      const c = testCase(name);
      const prompt = c.messages ?? c.prompt;
      const params = { maxTokens: c.greedy_ids.length, stopTokenIds: [] };
      await engine.resetChat();
      const plain = await run(prompt, params);
      expect(plain.tokenIds, `${name}: plain greedy ids`).toEqual(c.greedy_ids);
      expect(plain.speculation).toEqual({ verifications: 0, draftedTokens: 0, acceptedTokens: 0, pausedSteps: 0 });
      await engine.resetChat();
      const drafted = await run(prompt, { ...params, speculative: { draft: 4 } });
      expect(drafted.tokenIds, `${name}: greedy ids with the draft model`).toEqual(c.greedy_ids);
      expect(drafted.text).toBe(plain.text);
      const { verifications, draftedTokens, acceptedTokens } = drafted.speculation;
      expect(verifications, name).toBeGreaterThan(0);
      expect(acceptedTokens, name).toBeGreaterThan(0);
      expect(draftedTokens, name).toBeGreaterThanOrEqual(acceptedTokens);
      // Each pass checks at most 4 guesses.
      expect(draftedTokens, name).toBeLessThanOrEqual(4 * verifications);
    }
  }, 300_000);

  it("a draft model of another vocabulary is refused, naming the difference; the engine keeps its draft model", async () => {
    const before = engine.info.draftModel;
    expect(before).not.toBeNull();
    await expect(engine.loadDraft(otherVocabulary, { modelBaseUrl })).rejects.toThrow(
      new RegExp(
        `^the draft model .*${otherVocabulary}\\.gguf: invalid argument: the draft model's vocabulary has \\d+ tokens, ` +
          "the model's 49152: a draft model must share the model's tokenizer$",
      ),
    );
    expect(engine.usable).toBe(true);
    expect(engine.info.draftModel).toBe(before);
    // Still speculating with the earlier draft model, and still exact (the cache of the last run kept).
    const c = testCase("chat_short");
    const again = await run(c.messages, { maxTokens: c.greedy_ids.length, stopTokenIds: [], speculative: { draft: 6 } });
    expect(again.tokenIds).toEqual(c.greedy_ids);
    expect(again.speculation.acceptedTokens).toBeGreaterThan(0);
  }, 300_000);
});
