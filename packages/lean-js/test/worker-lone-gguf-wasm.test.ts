// The worker with the real single-thread wasm build, in Node: a GGUF given alone (no tokenizer
// files) runs on the tokenizer and chat template in its own metadata, token-exact against the
// Hugging Face fixture; a GGUF without tokenizer metadata fails with a readable error. Needs
// `npm run build` (src/wasm/) and the test models.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { Engine } from "../src/engine.js";
import type { LoadRequest } from "../src/protocol.js";
import { inProcessWorker, installFileFetch } from "./in-process-worker.js";
import { modelsDir, repo } from "./models.js";

const wasmFile = join(import.meta.dirname, "../src/wasm/simd/lean_wasm_bg.wasm");
const modelId = "smollm2-135m-instruct-q4_0";
const ggufPath = join(modelsDir, `${modelId}.gguf`);
const fixture = JSON.parse(readFileSync(join(repo, "fixtures/hf", `${modelId}.json`), "utf8"));
const testCase = (name: string) => fixture.cases.find((c: { name: string }) => c.name === name);

const missing = [wasmFile, ggufPath].filter((f) => !existsSync(f));
if (missing.length > 0 && process.env.CI) throw new Error(`missing: ${missing.join(", ")} (run npm run build; set LEAN_MODELS)`);

const lone = (gguf: LoadRequest["model"]["gguf"]): Omit<LoadRequest, "type" | "id"> => ({
  model: { gguf, tokenizer: null, tokenizerConfig: null, chatTemplate: null },
  backend: "simd",
  contextLength: 1024,
  threads: 1,
  cacheName: null,
  gpuNeeds: null,
});

/**
 * The GGUF's bytes with its `tokenizer.ggml.model` key renamed (same length, so the file stays
 * valid): a model file that carries no tokenizer lean can build.
 */
export function withoutTokenizerModel(bytes: Uint8Array): Uint8Array {
  const key = new TextEncoder().encode("tokenizer.ggml.model");
  const out = bytes.slice();
  for (let at = 8; at + key.length <= out.length; at++) {
    // A key is a u64 length (little-endian) followed by its bytes.
    if (out[at - 8] !== key.length || out[at] !== key[0]) continue;
    if (key.every((b, i) => out[at + i] === b)) {
      out[at + key.length - 1] = "X".charCodeAt(0);
      return out;
    }
  }
  throw new Error("tokenizer.ggml.model not found in the GGUF");
}

describe.skipIf(missing.length > 0)("a GGUF alone, on the wasm engine", () => {
  beforeAll(() => installFileFetch());

  it("without tokenizer metadata: a readable error that says to give a tokenizer.json", async () => {
    const bytes = withoutTokenizerModel(new Uint8Array(readFileSync(ggufPath)));
    const failed = Engine.start(await inProcessWorker(), lone({ name: "patched.gguf", source: { bytes: bytes.buffer as ArrayBuffer }, size: null, sha256: null }));
    await expect(failed).rejects.toThrow(
      "tokenizer: cannot build the tokenizer from the GGUF's metadata: the file has no tokenizer " +
        "(no tokenizer.ggml.model); give a tokenizer.json",
    );
  }, 120_000);

  it("from its URL: prompt ids and greedy ids equal the HF reference, chat and raw", async () => {
    const url = pathToFileURL(ggufPath).href;
    const engine = await Engine.start(await inProcessWorker(), lone({ name: url, source: { url }, size: null, sha256: null }));
    expect(engine.info).toMatchObject({ tokenizerFromGguf: true, hasChatTemplate: true, eosToken: "<|im_end|>" });
    for (const name of ["chat_short", "raw_short"]) {
      const c = testCase(name);
      const stream = engine.generate(c.messages ?? c.prompt, { maxTokens: 8, stopTokenIds: [] });
      for await (const _ of stream);
      const result = await stream.result;
      expect(await engine.tokenize(c.prompt_text ?? c.prompt), `${name}: prompt ids`).toEqual(c.prompt_ids);
      expect(result.promptTokens, `${name}: prompt length`).toBe(c.prompt_ids.length);
      expect(result.tokenIds, `${name}: greedy ids`).toEqual(c.greedy_ids.slice(0, 8));
    }
    engine.dispose();
  }, 120_000);
});
