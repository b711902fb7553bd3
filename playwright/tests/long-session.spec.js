// Long sessions in one page (issue 19 §5), on the CPU backends:
// - 500 greedy generations of one chat (4 tokens each), every one equal to the HF reference ids, with the
//   worker's WebAssembly memory flat (it never shrinks, so any leak shows as growth) and, in
//   Chromium, the page's JS heap flat after a collection;
// - 100 generations aborted after a random number of tokens (1–15), each followed by a whole
//   one (16 tokens) that still gives the reference ids;
// - 100 times a new engine, one token, dispose(): no worker left alive, the same wasm memory in
//   every engine, the page's heap flat.
// These counts run on the simd backend in both browsers; the threads backend runs a fifth of
// them (the same code paths, a pool start per engine), and its dispose cycles in Chromium only:
// Firefox under automation freezes some pool starts (README, Reliability), which the bounded
// start turns into 20 s fallbacks. LEAN_LONG_SESSION_SCALE (default 1) scales the counts. Model: smollm2-135m-instruct-q4_0, case
// chat_short of fixtures/hf. Needs lean-js's build and $LEAN_MODELS (see lean-js.spec.js).
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");
const modelName = "smollm2-135m-instruct-q4_0";
const fixture = JSON.parse(readFileSync(join(repo, "fixtures", "hf", `${modelName}.json`), "utf8"));
const chatShort = fixture.cases.find((c) => c.name === "chat_short");
const scale = Number(process.env.LEAN_LONG_SESSION_SCALE ?? 1);
const backendScale = { simd: 1, threads: 0.2 };
const counter = (backend) => (n) => Math.max(1, Math.round(n * scale * backendScale[backend]));
const modelUrls = {
  gguf: `/models/${modelName}.gguf`,
  tokenizer: `/models/${fixture.tokenizer}/tokenizer.json`,
  tokenizerConfig: `/models/${fixture.tokenizer}/tokenizer_config.json`,
  chatTemplate: `/models/${fixture.tokenizer}/chat_template.jinja`,
};
const MiB = 1024 * 1024;

function requireFiles() {
  const files = [join(modelsDir, `${modelName}.gguf`), join(repo, "packages/lean-js/dist/index.js")];
  const missing = files.filter((f) => !existsSync(f));
  if (missing.length === 0) return;
  const why = `missing ${missing.join(", ")} (set LEAN_MODELS; run npm run build -w lean-js)`;
  if (process.env.CI) throw new Error(why);
  test.skip(true, why);
}

async function openPage(page) {
  await page.goto("/lean-js-page/index.html");
  await page.waitForFunction(() => window.leanJs !== undefined);
}

const call = (page, method, ...args) =>
  page.evaluate(([method, args]) => window.leanJs[method](...args), [method, args]);

for (const backend of ["simd", "threads"]) {
  test(`${backend}: 500 generations and 100 aborts in one page stay exact, memory flat (threads: a fifth)`, async ({ page }) => {
    requireFiles();
    await openPage(page);
    const loaded = await call(page, "load", { model: modelUrls, backend, threads: 2, cache: false });
    expect(loaded.backend).toBe(backend);
    const count = counter(backend);
    const run = await call(page, "longSession", {
      prompt: chatShort.messages,
      expected: chatShort.greedy_ids.slice(0, 4),
      // 16 tokens after each abort: room for aborts at 1..15 tokens.
      expectedAfterAbort: chatShort.greedy_ids.slice(0, 16),
      generations: count(500),
      aborts: count(100),
    });
    const mb = (bytes) => (bytes === null ? "n/a" : `${(bytes / MiB).toFixed(1)} MiB`);
    console.log(
      `${test.info().project.name} ${backend}: ${count(500)} generations in ${(run.generationsMs / 1000).toFixed(1)} s, ` +
        `${count(100)} aborts (after ${Math.min(...run.abortedAt)}–${Math.max(...run.abortedAt)} tokens), ` +
        `${(run.ms / 1000).toFixed(1)} s in all; wasm ${mb(run.start.wasm)} → ${mb(run.afterGenerations.wasm)} → ${mb(run.end.wasm)}, ` +
        `JS heap ${mb(run.start.heap)} → ${mb(run.end.heap)}`,
    );
    expect(run.wrong).toEqual([]);
    expect(run.end.wasm).toBe(run.start.wasm);
    if (run.start.heap !== null) expect(run.end.heap - run.start.heap).toBeLessThan(4 * MiB);
    await call(page, "dispose");
  });
}

for (const backend of ["simd", "threads"]) {
  test(`${backend}: 100 engines created and disposed leave no worker and no memory behind (threads: a fifth)`, async ({ page, browserName }) => {
    test.skip(backend === "threads" && browserName === "firefox", "Firefox under automation freezes some pool starts");
    requireFiles();
    await openPage(page);
    const count = counter(backend);
    await call(page, "deleteCached");
    const run = await call(page, "disposeCycles", {
      model: modelUrls,
      backend,
      threads: 2,
      prompt: chatShort.messages,
      expected: chatShort.greedy_ids,
      count: count(100),
    });
    const mb = (bytes) => (bytes === null ? "n/a" : `${(bytes / MiB).toFixed(1)} MiB`);
    console.log(
      `${test.info().project.name} ${backend}: ${count(100)} engines in ${(run.ms / 1000).toFixed(1)} s; ` +
        `wasm memory ${run.wasmMemoryBytes.map(mb).join(", ")}; live workers ${run.first.liveWorkers} → ${run.end.liveWorkers}; ` +
        `JS heap ${mb(run.first.heap)} → ${mb(run.end.heap)}`,
    );
    expect(run.wrong).toEqual([]);
    expect(run.backends).toEqual([backend]);
    expect(run.first.liveWorkers).toBe(0);
    expect(run.end.liveWorkers).toBe(0);
    expect(run.wasmMemoryBytes).toHaveLength(1);
    if (run.first.heap !== null) expect(run.end.heap - run.first.heap).toBeLessThan(4 * MiB);
    await call(page, "deleteCached");
  });
}
