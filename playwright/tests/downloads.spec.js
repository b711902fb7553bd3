// Downloads that survive the network (lean-js's src/cache.ts) against server.js's faults, in each
// browser:
// - the connection is cut mid-stream once: lean-js resumes with a Range request within the load,
//   the server sends each byte once, the model generates exactly the HF greedy ids, and the
//   cached file's sha256 (computed as it streamed) is the file's;
// - cut, and then the network is gone: the load fails with a ModelFileError that says what is
//   kept; after a page reload the next load streams the kept parts (whole 16 MiB parts) from
//   Cache Storage and fetches only the rest;
// - the page is reloaded mid-download (the server stalls after 60 MB, so the reload comes while
//   the fourth part is being stored): the next load resumes after the 3 whole parts stored;
// - a server that lies after the cut (the file changed: new ETag and one byte; a 206 whose total
//   is not the file's): a clear ModelFileError and nothing of the file left in Cache Storage;
//   then a good load works.
// Model: smollm2-135m-instruct-q4_0 (fixtures/hf, case chat_short). Needs lean-js's build and
// $LEAN_MODELS (see lean-js.spec.js).
import { createHash } from "node:crypto";
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
const ggufPath = join(modelsDir, `${modelName}.gguf`);
const gguf = `/models/${modelName}.gguf`;
const modelUrls = {
  gguf,
  tokenizer: `/models/${fixture.tokenizer}/tokenizer.json`,
  tokenizerConfig: `/models/${fixture.tokenizer}/tokenizer_config.json`,
  chatTemplate: `/models/${fixture.tokenizer}/chat_template.jinja`,
};
/** lean-js's PART_BYTES. */
const part = 16 * 1024 * 1024;

let file = null;
/** The GGUF's size and sha256, read once. */
function ggufFile() {
  if (!file) {
    const bytes = readFileSync(ggufPath);
    file = { size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
  }
  return file;
}

const call = (page, method, ...args) =>
  page.evaluate(([method, args]) => window.leanJs[method](...args), [method, args]);

async function openPage(page) {
  await page.goto("/lean-js-page/index.html");
  await page.waitForFunction(() => window.leanJs !== undefined);
}

/** A fresh page with nothing cached and no fault; the server's counts reset. */
async function start(page, request) {
  const missing = [ggufPath, join(repo, "packages/lean-js/dist/index.js")].filter((f) => !existsSync(f));
  if (missing.length > 0) {
    const why = `missing ${missing.join(", ")} (set LEAN_MODELS; run npm run build -w lean-js)`;
    if (process.env.CI) throw new Error(why);
    test.skip(true, why);
  }
  await request.delete("/__faults");
  await openPage(page);
  await call(page, "deleteCached");
  expect(await call(page, "cacheKeys")).toEqual([]);
  await resetCounts(request);
}

const faults = (request, path, fault) => request.post("/__faults", { data: { [path]: fault } });
const resetCounts = (request) => request.delete("/__stats");
/** {requests, bytes} the server answered for the GGUF since the last reset. */
async function served(request) {
  const requests = await (await request.get("/__stats")).json();
  const bytes = await (await request.get("/__bytes")).json();
  return { requests: requests[gguf] ?? 0, bytes: bytes[gguf] ?? 0 };
}

async function expectCachedAndVerified(page) {
  const { size, sha256 } = ggufFile();
  const origin = new URL(page.url()).origin;
  expect(await call(page, "listCachedSha")).toContainEqual({ url: origin + gguf, bytes: size, sha256 });
}

test("a download cut mid-stream resumes with Range: every byte sent once, exact ids, a verified cache entry", async ({ page, request }) => {
  await start(page, request);
  await faults(request, gguf, { cutAt: 40_000_000 });
  const loaded = await call(page, "load", { model: modelUrls, backend: "simd" });
  expect(loaded.warnings).toEqual([]);
  expect(loaded.sources.gguf).toBe("network");
  // The second request asks for the rest only (a browser may drop a few bytes it had before the cut).
  const { requests, bytes } = await served(request);
  expect(requests).toBe(2);
  expect(bytes).toBeGreaterThanOrEqual(ggufFile().size);
  expect(bytes).toBeLessThan(ggufFile().size + 1024 * 1024);
  const run = await call(page, "generate", chatShort.messages, greedy.length);
  expect(run).toEqual({ streamedIds: greedy, error: null, finishReason: "length", tokenIds: greedy });
  await expectCachedAndVerified(page);
  await call(page, "dispose");
});

test("a download whose network is gone keeps its parts: after a reload the next load resumes from them", async ({ page, request }) => {
  await start(page, request);
  await faults(request, gguf, { cutAt: 55_000_000, down: true });
  const failed = await call(page, "loadError", { model: modelUrls, backend: "simd" });
  expect(failed.name).toBe("ModelFileError");
  // (Chromium drops the last few KiB it had before the cut.)
  expect(failed.message).toMatch(/: the transfer failed after 5\d{7} bytes \(/);
  expect(failed.message).toContain(`(${3 * part} bytes are kept in Cache Storage: loading the model again resumes from there)`);
  expect(await call(page, "listCachedSha")).not.toContainEqual(expect.objectContaining({ url: expect.stringContaining(gguf) }));

  await request.delete("/__faults");
  await resetCounts(request);
  await page.reload();
  await page.waitForFunction(() => window.leanJs !== undefined);
  const loaded = await call(page, "load", { model: modelUrls, backend: "simd" });
  expect(loaded.warnings).toEqual([]);
  const { size } = ggufFile();
  expect(await served(request)).toEqual({ requests: 1, bytes: size - 3 * part });
  await expectCachedAndVerified(page);
  const keys = (await call(page, "cacheKeys")).filter((k) => k.includes(gguf));
  expect(keys.length).toBe(1 + Math.ceil(size / part));
  console.log(`${test.info().project.name}: resumed from ${3 * part} kept bytes, fetched ${size - 3 * part} of ${size}`);
  await call(page, "dispose");
});

test("a page reloaded mid-download: the next load resumes after the parts stored", async ({ page, request }) => {
  await start(page, request);
  await faults(request, gguf, { stallAt: 60_000_000 });
  await page.evaluate((model) => {
    window.pendingLoad = window.leanJs.loadError({ model, backend: "simd" });
  }, modelUrls);
  // Until the manifest counts 3 parts (stored while the 4th streams in).
  const partsStored = () =>
    page.evaluate(async (key) => {
      const manifest = await (await caches.open("lean-models-v1")).match(key);
      return manifest ? (await manifest.json()).parts : 0;
    }, `${new URL(page.url()).origin}${gguf}?lean-part=manifest`);
  await expect.poll(partsStored, { timeout: 30_000 }).toBe(3);
  // The server has sent everything up to the stall: the 4th part is being stored.
  await expect.poll(async () => (await served(request)).bytes, { timeout: 30_000 }).toBe(60_000_000);
  await page.reload();
  await page.waitForFunction(() => window.leanJs !== undefined);

  await request.delete("/__faults");
  await resetCounts(request);
  const loaded = await call(page, "load", { model: modelUrls, backend: "simd" });
  expect(loaded.warnings).toEqual([]);
  expect(await served(request)).toEqual({ requests: 1, bytes: ggufFile().size - 3 * part });
  await expectCachedAndVerified(page);
  await call(page, "dispose");
});

test("a server that lies (changed file, wrong total): a clear ModelFileError, nothing cached; then a good load works", async ({ page, request }) => {
  await start(page, request);
  const lies = {
    change: /: the file changed during the download \(ETag "[^"]+" became "[^"]+-changed"\)$/,
    lieTotal: new RegExp(`: the server now says the file has ${ggufFile().size + 1000} bytes, not ${ggufFile().size} `),
  };
  for (const [lie, message] of Object.entries(lies)) {
    await faults(request, gguf, { cutAt: 20_000_000, [lie]: true });
    const failed = await call(page, "loadError", { model: modelUrls, backend: "simd" });
    expect(failed, lie).toMatchObject({ name: "ModelFileError", message: expect.stringMatching(message) });
    expect((await call(page, "cacheKeys")).filter((k) => k.includes(gguf)), lie).toEqual([]);
    await request.delete("/__faults");
  }
  const loaded = await call(page, "load", { model: modelUrls, backend: "simd" });
  expect(loaded.warnings).toEqual([]);
  await expectCachedAndVerified(page);
  await call(page, "dispose");
  await call(page, "deleteCached");
});
