// An app made with `npm create vite` that installed the packed lean-js tarball and was built with
// `vite build` (scripts/test-vite-app.sh makes it; server.js serves its dist/ under /app/ when
// $LEAN_VITE_APP names it): opened with ?backend=…, it loads smollm2-135m-instruct-q4_0 from
// /models/ and generates greedily; the ids it streamed must equal the HF reference (case
// chat_short of the fixture). Without $LEAN_VITE_APP the tests skip: plain `playwright test`
// does not build the app.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");
const modelName = "smollm2-135m-instruct-q4_0";
const fixture = JSON.parse(readFileSync(join(repo, "fixtures", "hf", `${modelName}.json`), "utf8"));
const chatShort = fixture.cases.find((c) => c.name === "chat_short");

/** Skips without an app to test; fails when the app was meant to be built but is missing. */
function requireApp() {
  const app = process.env.LEAN_VITE_APP;
  test.skip(!app, "no Vite app to test: run scripts/test-vite-app.sh");
  if (!existsSync(join(app, "index.html"))) {
    throw new Error(`${app}/index.html is missing: building the Vite app failed (see scripts/test-vite-app.sh's output)`);
  }
  const gguf = join(modelsDir, `${modelName}.gguf`);
  if (existsSync(gguf)) return;
  if (process.env.CI) throw new Error(`test model missing: ${gguf} (set LEAN_MODELS)`);
  test.skip(true, `${gguf} not found (set LEAN_MODELS)`);
}

// "auto" on this cross-origin isolated page picks threads, or WebGPU where the build has it.
for (const backend of ["simd", "threads", "auto"]) {
  test(`vite app, ${backend}: greedy ids equal the HF reference`, async ({ page }) => {
    requireApp();
    const errors = [];
    const workers = [];
    page.on("pageerror", (e) => errors.push(e.message));
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
    page.on("worker", (w) => workers.push(w.url()));
    await page.goto(`/app/index.html?backend=${backend}`);
    // The app writes its outcome on <body>: data-result (JSON) or data-error. Loading and
    // generating take seconds; a thread pool that never starts hangs instead.
    const ended = await page
      .waitForFunction(() => document.body.dataset.result ?? document.body.dataset.error, null, { timeout: 60_000 })
      .then(() => true, () => false);
    const hint = `page errors: [${errors.join(" | ")}], workers started: [${workers.join(", ")}]`;
    expect(ended, `the app neither generated nor failed within a minute; ${hint}`).toBe(true);
    const { result, error } = await page.evaluate(() => ({ ...document.body.dataset }));
    expect(error, `the app failed; ${hint}`).toBeUndefined();
    const { backend: used, ids, text, crossOriginIsolated } = JSON.parse(result);
    expect(crossOriginIsolated).toBe(true);
    if (backend === "auto") expect(["threads", "webgpu"]).toContain(used);
    else expect(used).toBe(backend);
    expect(ids).toEqual(chatShort.greedy_ids);
    expect(text).not.toBe("");
    expect(chatShort.greedy_text.startsWith(text)).toBe(true);
  });
}
