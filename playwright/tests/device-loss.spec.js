// A WebGPU device lost mid-generation is survived with the same tokens (issue 19 §4): lean-js's
// test hook destroys the worker's GPUDevice before a given GPU pass (testHooks.
// loseDeviceAfterPasses), the worker's engine fails with DeviceLostError, and lean-js re-reads
// the model into a CPU engine (simd), prefills the prompt and the tokens already streamed, and
// the same iterator goes on: its ids equal the HF reference's, none repeated or dropped;
// engine.backend becomes "simd", backendReason says why, and a `backendchange` event fires.
// Chromium's WebGPU is SwiftShader here (slow): a few tokens. Model: smollm2-135m-instruct-q4_0,
// case chat_short of fixtures/hf.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");
const modelName = "smollm2-135m-instruct-q4_0";
const fixture = JSON.parse(readFileSync(join(repo, "fixtures", "hf", `${modelName}.json`), "utf8"));
const chatShort = fixture.cases.find((c) => c.name === "chat_short");
const greedy = chatShort.greedy_ids;
const modelUrls = {
  gguf: `/models/${modelName}.gguf`,
  tokenizer: `/models/${fixture.tokenizer}/tokenizer.json`,
  tokenizerConfig: `/models/${fixture.tokenizer}/tokenizer_config.json`,
  chatTemplate: `/models/${fixture.tokenizer}/chat_template.jinja`,
};

const call = (page, method, ...args) =>
  page.evaluate(([method, args]) => window.leanJs[method](...args), [method, args]);

// Pass 0 is the prompt's prefill; then greedy decode passes (queued up to 4 ahead).
for (const passes of [0, 3]) {
  test(`webgpu: a device lost before GPU pass ${passes} continues on the CPU with the reference ids`, async ({ page }) => {
    test.setTimeout(15 * 60_000);
    const files = [join(modelsDir, `${modelName}.gguf`), join(repo, "packages/lean-js/dist/index.js")];
    const missing = files.filter((f) => !existsSync(f));
    if (missing.length > 0) {
      if (process.env.CI) throw new Error(`missing ${missing.join(", ")}`);
      test.skip(true, `missing ${missing.join(", ")}`);
    }
    await page.goto("/lean-js-page/index.html");
    await page.waitForFunction(() => window.leanJs !== undefined);
    const noGpu = await page.evaluate(async () => ((await navigator.gpu?.requestAdapter()) ? null : "no WebGPU adapter"));
    if (noGpu !== null) {
      if (process.env.CI) throw new Error(noGpu);
      test.skip(true, noGpu);
    }
    const loaded = await call(page, "load", {
      model: modelUrls,
      backend: "webgpu",
      cache: false,
      testHooks: { loseDeviceAfterPasses: passes },
    });
    expect(loaded).toMatchObject({ backend: "webgpu", warnings: [] });
    const tokens = 6;
    const run = await call(page, "generate", chatShort.messages, tokens);
    expect(run).toEqual({
      streamedIds: greedy.slice(0, tokens),
      error: null,
      finishReason: "length",
      tokenIds: greedy.slice(0, tokens),
    });
    const after = await call(page, "backendChanges");
    expect(after.backend).toBe("simd");
    expect(after.backendReason).toMatch(/WebGPU device was lost/);
    expect(after.changes).toEqual([{ backend: "simd", backendReason: after.backendReason }]);
    // The engine goes on, on the CPU.
    const again = await call(page, "generate", chatShort.messages, tokens);
    expect(again.tokenIds).toEqual(greedy.slice(0, tokens));
    console.log(`${test.info().project.name}: lost before pass ${passes}: ${after.backendReason}`);
    await call(page, "dispose");
  });
}
