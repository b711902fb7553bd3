// One file per model in the browser: lean-js loads a GGUF alone (`model: { gguf }`, no tokenizer
// files) and runs on the tokenizer and chat template in the GGUF's own metadata, token-exact:
// - from its URL on the simd and the threads backend (and on WebGPU in Firefox, whose lavapipe
//   is fast enough; Chromium's SwiftShader takes minutes and runs it in parity.spec.js's way only
//   with tokenizer files), the prompt ids and the first 8 greedy ids of the HF fixture's
//   chat_short (the GGUF's chat template) and raw_short cases;
// - from a File, a Blob, an ArrayBuffer and a Uint8Array (fetched in the page, then passed);
// - a GGUF without tokenizer metadata (tokenizer.ggml.model renamed), and a GGUF that is no
//   model at all, fail with readable errors, not traps;
// - the demo's chat page takes a GGUF by file picker, by drop and by URL, without tokenizer files.
// Model: smollm2-135m-instruct-q4_0 (fixtures/hf). Needs `npm run build -w lean-js` (and
// `-w lean-demo` for the demo) and $LEAN_MODELS (default models/); a missing model skips, or
// fails when $CI is set.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";
import { demoPort } from "../playwright.config.js";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");
const modelName = "smollm2-135m-instruct-q4_0";
const ggufPath = join(modelsDir, `${modelName}.gguf`);
const ggufUrl = `/models/${modelName}.gguf`;
const fixture = JSON.parse(readFileSync(join(repo, "fixtures", "hf", `${modelName}.json`), "utf8"));
const testCase = (name) => fixture.cases.find((c) => c.name === name);
const greedyTokens = 8;
const threads = 2;
const demo = `http://127.0.0.1:${demoPort}`;

/** Skips the test when the model or a build is missing, unless $CI is set. */
function requireFiles(...builds) {
  const files = [ggufPath, join(repo, "packages/lean-js/dist/index.js"), ...builds.map((b) => join(repo, b))];
  const missing = files.filter((f) => !existsSync(f));
  if (missing.length === 0) return;
  const why = `missing ${missing.join(", ")} (set LEAN_MODELS; run npm run build -w lean-js, -w lean-demo)`;
  if (process.env.CI) throw new Error(why);
  test.skip(true, why);
}

async function openPage(page) {
  await page.goto("/lean-js-page/index.html");
  await page.waitForFunction(() => window.leanJs !== undefined);
}

const call = (page, method, ...args) =>
  page.evaluate(([method, args]) => window.leanJs[method](...args), [method, args]);

/**
 * Loads `gguf` alone and checks the fixture's cases: the prompt ids (a raw prompt's tokenized
 * ids; a chat prompt's rendered text tokenized, and the prompt length of the chat itself, which
 * the GGUF's template renders) and the first greedy ids.
 */
async function expectReference(page, { gguf, backend, cases = ["chat_short", "raw_short"], tokens = greedyTokens }) {
  const loaded = await call(page, "load", { model: { gguf }, backend, threads, cache: false });
  expect(loaded).toMatchObject({ backend, tokenizerFromGguf: true, warnings: [] });
  for (const name of cases) {
    const c = testCase(name);
    expect(await call(page, "tokenize", c.prompt_text), `${name}: prompt ids`).toEqual(c.prompt_ids);
    const run = await call(page, "run", c.messages ?? c.prompt, tokens);
    expect(run.promptTokens, `${name}: prompt length`).toBe(c.prompt_ids.length);
    expect(run.tokenIds, `${name}: greedy ids`).toEqual(c.greedy_ids.slice(0, tokens));
  }
  return loaded;
}

for (const backend of ["simd", "threads"]) {
  test(`${backend}: a GGUF alone from its URL gives the HF reference ids`, async ({ page }) => {
    requireFiles();
    await openPage(page);
    const loaded = await expectReference(page, { gguf: ggufUrl, backend });
    expect(loaded.sources).toEqual({ gguf: "network" });
    console.log(`${test.info().project.name} ${backend}: a lone GGUF loaded in ${(loaded.loadMs / 1000).toFixed(2)} s`);
    await call(page, "dispose");
  });
}

for (const as of ["file", "blob", "arraybuffer", "uint8array"]) {
  test(`simd: a GGUF alone as a ${as} gives the HF reference ids`, async ({ page }) => {
    requireFiles();
    await openPage(page);
    const loaded = await expectReference(page, {
      gguf: { fetch: ggufUrl, as, name: `${modelName}.gguf` },
      backend: "simd",
      cases: ["chat_short"],
    });
    expect(loaded.sources).toEqual({ gguf: "local" });
    await call(page, "dispose");
  });
}

test("webgpu: a GGUF alone streamed to the GPU gives the HF reference ids", async ({ page }, testInfo) => {
  test.skip(
    testInfo.project.name === "chromium",
    "SwiftShader takes minutes for 8 tokens: WebGPU runs here in Firefox (lavapipe), as in parity.spec.js",
  );
  test.setTimeout(15 * 60_000);
  requireFiles();
  await openPage(page);
  const missing = await page.evaluate(async () => {
    if (!navigator.gpu) return "navigator.gpu is missing";
    try {
      return (await navigator.gpu.requestAdapter()) ? null : "no WebGPU adapter";
    } catch (e) {
      return `requestAdapter failed: ${e.message}`;
    }
  });
  if (missing !== null) {
    if (process.env.CI) throw new Error(`WebGPU unavailable: ${missing}`);
    test.skip(true, `WebGPU unavailable in this browser: ${missing}`);
  }
  await expectReference(page, { gguf: ggufUrl, backend: "webgpu", cases: ["raw_short"] });
  await call(page, "dispose");
});

/** A GGUF v3 with no tensors and the one metadata key general.architecture = "llama". */
function tinyGguf() {
  const parts = [];
  const u32 = (n) => parts.push(...new Uint8Array(new Uint32Array([n]).buffer));
  const u64 = (n) => parts.push(...new Uint8Array(new BigUint64Array([BigInt(n)]).buffer));
  const str = (s) => {
    const bytes = new TextEncoder().encode(s);
    u64(bytes.length);
    parts.push(...bytes);
  };
  parts.push(..."GGUF".split("").map((c) => c.charCodeAt(0)));
  u32(3); // version
  u64(0); // tensors
  u64(1); // metadata keys
  str("general.architecture");
  u32(8); // string
  str("llama");
  return parts;
}

test("a GGUF without tokenizer metadata, or no model at all, fails with a readable error", async ({ page }) => {
  requireFiles();
  await openPage(page);
  // The real model with its tokenizer.ggml.model key renamed: it loads, but has no tokenizer.
  const noTokenizer = await call(page, "loadError", {
    model: { gguf: { fetch: ggufUrl, as: "blob", renameKey: ["tokenizer.ggml.model", "tokenizer.ggml.modeX"] } },
    backend: "simd",
    cache: false,
  });
  expect(noTokenizer).toEqual({
    name: "Error",
    message:
      "tokenizer: cannot build the tokenizer from the GGUF's metadata: the file has no tokenizer " +
      "(no tokenizer.ggml.model); give a tokenizer.json",
  });
  // The engine is fine afterwards: the same page loads the model and generates.
  await expectReference(page, { gguf: ggufUrl, backend: "simd", cases: ["raw_short"], tokens: 2 });
  await call(page, "dispose");

  const tiny = await call(page, "loadError", { model: { gguf: { bytes: tinyGguf() } }, backend: "simd", cache: false });
  expect(tiny).not.toBeNull();
  expect(tiny.name).toBe("Error");
  expect(tiny.message).toMatch(/^invalid GGUF file: metadata key 'llama\.[a-z_.]+' is missing$/);
  expect(tiny.message).not.toMatch(/unreachable|panicked/);
  console.log(`${test.info().project.name}: a GGUF that is no model: ${tiny.message}`);

  const notGguf = await call(page, "loadError", { model: { gguf: { bytes: [1, 2, 3, 4, 5, 6, 7, 8] } }, backend: "simd", cache: false });
  expect(notGguf.message).toMatch(/invalid GGUF file/);
});

test("lean-js refuses a bad model spec with a TypeError that names the fix", async ({ page }) => {
  requireFiles();
  await openPage(page);
  expect(await call(page, "loadError", { model: {}, backend: "simd" })).toEqual({
    name: "TypeError",
    message: "model.gguf is required: model must be a catalog id or { gguf, tokenizer?, tokenizerConfig?, chatTemplate? } (the tokenizer files are optional)",
  });
  expect(await call(page, "loadError", { model: ggufUrl, backend: "simd" })).toMatchObject({
    name: "TypeError",
    message: expect.stringContaining(`for a GGUF file give model: { gguf: "${ggufUrl}" }`),
  });
});

// The demo's chat page (built and served by vite preview, see playwright.config.js).
function requireDemo() {
  requireFiles("packages/demo/dist/index.html");
}

/** Asks the demo the fixture's chat_short question: its reply is the reference's first ids. */
async function expectDemoReply(page) {
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
  await expect(page.locator("body")).toHaveAttribute("data-tokenizer", "gguf");
  await expect(page.locator("#engine-status")).toContainText("tokenizer and chat template from the GGUF's metadata");
  // (fill() on a number input appends to its value in Firefox.)
  await page.locator("#max-tokens").evaluate((input, n) => (input.value = String(n)), greedyTokens);
  const c = testCase("chat_short");
  await page.fill("#prompt", c.messages[0].content);
  await page.click("#send");
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
  const ids = JSON.parse((await page.locator("body").getAttribute("data-last-token-ids")) ?? "[]");
  expect(ids).toEqual(c.greedy_ids.slice(0, greedyTokens));
  await expect(page.locator("#messages li.assistant")).toHaveText(/^The capital of France is Paris/);
}

test("demo: a GGUF from the file picker loads alone and chats exactly", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name !== "chromium", "the demo's GGUF inputs are checked in Chromium");
  requireDemo();
  await page.goto(`${demo}/?backend=simd`);
  await expect(page.locator("body")).toHaveAttribute("data-state", "idle");
  await page.setInputFiles("#gguf-file", ggufPath);
  await expectDemoReply(page);
  await expect(page.locator("#engine-status")).toContainText(`${modelName}.gguf: simd backend`);
  const path = testInfo.outputPath("demo-gguf-file.png");
  await page.screenshot({ path, fullPage: true });
  await testInfo.attach("demo-gguf-file", { path, contentType: "image/png" });
});

test("demo: a GGUF by drop and by URL loads alone; a bad URL is a readable error", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name !== "chromium", "the demo's GGUF inputs are checked in Chromium");
  requireDemo();
  await page.goto(`${demo}/?backend=simd`);
  await expect(page.locator("body")).toHaveAttribute("data-state", "idle");

  // A drop of a File onto the page (as a file manager's drag would deliver it).
  await page.evaluate(async (url) => {
    const bytes = await (await fetch(url)).blob();
    const data = new DataTransfer();
    data.items.add(new File([bytes], "dropped.gguf"));
    document.body.dispatchEvent(new DragEvent("dragenter", { dataTransfer: data, bubbles: true, cancelable: true }));
    document.body.dispatchEvent(new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true }));
  }, ggufUrl);
  await expectDemoReply(page);
  await expect(page.locator("#engine-status")).toContainText("dropped.gguf: simd backend");
  await expect(page.locator("#drop-overlay")).toBeHidden();

  // A URL that answers 404: the error says which file and why, and the page can go on.
  await page.fill("#gguf-url", "/models/no-such-model.gguf");
  await page.click("#load-url");
  await expect(page.locator("body")).toHaveAttribute("data-state", "error", { timeout: 60_000 });
  await expect(page.locator("#engine-status")).toHaveText(
    /^Could not load \/models\/no-such-model\.gguf: ModelFileError: .*no-such-model\.gguf answered HTTP 404/,
  );

  await page.fill("#gguf-url", ggufUrl);
  await page.click("#load-url");
  await expectDemoReply(page);
  await expect(page.locator("#engine-status")).not.toHaveClass(/error/);
});
