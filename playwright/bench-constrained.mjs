// Decode with a JSON-schema constraint vs without, in headless Chromium through lean-js (issue
// 24's performance row; the native row is `lean-cli --json-schema`, BENCHMARKS.md). Per backend
// (simd: 1 thread, threads: 2), in one page: SmolLM2-135M Q4_0, the chat "Write a small
// shopping order as JSON." from an empty KV cache, free (end of turn ignored, FREE_TOKENS
// tokens) and under the corpus's order_items schema (at most 120 tokens; it ends when the JSON
// does), interleaved for LEAN_BENCH_ROUNDS rounds (default 3). Also the first constrained call's
// wall time (it builds the engine's constraint vocabulary once) and, per later call, wall time
// minus prefill and decode (the schema's compilation and the worker's round trips).
// A benchmark, not a test; run it on a quiet machine:
//   node playwright/bench-constrained.mjs
// Needs what bench-browser.mjs needs (the wasm builds, lean-js's build, `npm ci` in playwright/)
// and the test models. Env: LEAN_MODELS, LEAN_BENCH_ROUNDS, LEAN_TEST_PORT (default 8790),
// LEAN_CHROMIUM.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "@playwright/test";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..");
const models = resolve(process.env.LEAN_MODELS ?? join(repo, "models"));
const rounds = Number(process.env.LEAN_BENCH_ROUNDS ?? 3);
const port = Number(process.env.LEAN_TEST_PORT ?? 8790);
const FREE_TOKENS = 96;
const file = "smollm2-135m-instruct-q4_0";
const order = JSON.parse(readFileSync(join(repo, "rust/lean-constraint/tests/schemas/order_items.json"), "utf8"));
const messages = [{ role: "user", content: order.prompt }];
const log = (...args) => console.error("bench-constrained:", ...args);
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const server = spawn(process.execPath, [join(here, "server.js"), String(port)], {
  stdio: ["ignore", "pipe", "inherit"],
  env: { ...process.env, LEAN_MODELS: models },
});
await new Promise((ok) => server.stdout.once("data", ok));
const rows = [];
let browser = null;
try {
  browser = await chromium.launch({
    executablePath: process.env.LEAN_CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  for (const [backend, threads] of [["simd", undefined], ["threads", 2]]) {
    const page = await browser.newPage();
    page.on("pageerror", (e) => log(e.message));
    await page.goto(`http://127.0.0.1:${port}/lean-js-page/index.html`);
    await page.waitForFunction(() => window.leanJs !== undefined);
    const info = await page.evaluate((o) => window.leanJs.load(o), {
      model: { gguf: { fetch: `/models/${file}.gguf`, as: "blob" } },
      backend,
      threads,
      cache: false,
    });
    if (info.backend !== backend) throw new Error(`loaded ${info.backend}, not ${backend}`);
    const run = (schema) =>
      page.evaluate((o) => window.leanJs.benchChatDecode(o), { messages, maxTokens: schema ? 120 : FREE_TOKENS, schema });
    await run(null); // warm-up
    const first = await run(order.schema);
    log(`${backend}: first constrained call ${first.wallMs.toFixed(0)} ms (vocabulary + compile + ${first.generated} tokens)`);
    const free = [];
    const constrained = [];
    for (let round = 0; round < rounds; round++) {
      for (const schema of round % 2 ? [order.schema, null] : [null, order.schema]) {
        const r = await run(schema);
        (schema ? constrained : free).push(r);
        log(`${backend} round ${round + 1}: ${schema ? "constrained" : "free"} ${r.generated} tokens, decode ${r.decodeTokensPerSecond.toFixed(1)} tok/s`);
      }
    }
    JSON.parse(constrained[0].text); // the constrained reply is JSON
    const overhead = constrained.map((r) => r.wallMs - r.prefillMs - (r.generated - 1) * (1000 / r.decodeTokensPerSecond));
    rows.push({
      backend,
      free: median(free.map((r) => r.decodeTokensPerSecond)),
      constrained: median(constrained.map((r) => r.decodeTokensPerSecond)),
      tokens: `${free[0].generated} / ${constrained[0].generated}`,
      firstMs: first.wallMs,
      overheadMs: median(overhead),
    });
    await page.close();
  }
  console.log(`Chromium ${await browser.version()}, ${file}, ${rounds} rounds (medians):\n`);
  console.log("| backend | free decode tok/s | constrained decode tok/s | ratio | tokens (free / constrained) | first constrained call | per-call overhead |");
  console.log("|---|---|---|---|---|---|---|");
  for (const r of rows) {
    console.log(
      `| ${r.backend} | ${r.free.toFixed(1)} | ${r.constrained.toFixed(1)} | ${(r.constrained / r.free).toFixed(3)} | ${r.tokens} | ${r.firstMs.toFixed(0)} ms | ${r.overheadMs.toFixed(1)} ms |`,
    );
  }
} finally {
  await browser?.close();
  server.kill();
}
