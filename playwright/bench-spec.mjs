// Speculative decoding by prompt lookup vs plain decoding, in headless Chromium through lean-js
// (BENCHMARKS.md's speculative decoding table; the native row is lean-cli's --lookup). Per model
// (LEAN_BENCH_FILES) and backend (simd: 1 thread, threads: 2), in one page: each task of
// scripts/bench-spec-tasks.json (code: rename a variable in a function, summary: summarize a
// paragraph, chat: an open question, extract: an order as JSON under a schema, both modes
// constrained) as a greedy chat from an empty KV cache, at most
// MAX_TOKENS tokens (the model may end its turn sooner), plain and with `speculative:
// { lookup: 8 }`: a warm-up of each, then LEAN_BENCH_ROUNDS rounds (default 3), the mode that
// goes first alternating by round. Reports effective decode tok/s (lean-js's
// decodeTokensPerSecond: from the first token to the last, guesses and their checks included),
// medians, the speed-up (median of each round's lookup / plain) and lookup's guesses kept /
// made. Speculation must not change the reply: it exits non-zero when a lookup run's token ids
// differ from the plain run's (or two plain runs differ).
// A benchmark, not a test; run it on a quiet machine:
//   npm run bench:spec        (node playwright/bench-spec.mjs)
// Needs what bench-browser.mjs needs (the wasm builds, lean-js's build, `npm ci` in playwright/)
// and the test models. Env: LEAN_MODELS (default models/), LEAN_BENCH_FILES (model file stems,
// comma or space separated; default the two below), LEAN_BENCH_ROUNDS (default 3),
// LEAN_BENCH_JSON (a file to append one JSON line per model/backend/task to; default: the lines
// go to stdout after the table), LEAN_TEST_PORT (default 8791), LEAN_CHROMIUM.
import { spawn } from "node:child_process";
import { appendFileSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "@playwright/test";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..");
const list = (s) => s.split(/[\s,]+/).filter(Boolean);
const files = list(process.env.LEAN_BENCH_FILES ?? "smollm2-135m-instruct-q4_0 qwen2.5-coder-0.5b-instruct-q4_0");
const models = resolve(process.env.LEAN_MODELS ?? join(repo, "models"));
const rounds = Number(process.env.LEAN_BENCH_ROUNDS ?? 3);
const port = Number(process.env.LEAN_TEST_PORT ?? 8791);
const jsonFile = process.env.LEAN_BENCH_JSON;
const MAX_TOKENS = 128;
const LOOKUP = { lookup: 8 };
const tasks = JSON.parse(readFileSync(join(repo, "scripts/bench-spec-tasks.json"), "utf8"));
const log = (...args) => console.error("bench-spec:", ...args);
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
/** Where two id lists first differ, or -1. */
const firstDifference = (a, b) => {
  for (let i = 0; i < Math.max(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return -1;
};

const started = performance.now();
const server = spawn(process.execPath, [join(here, "server.js"), String(port)], {
  stdio: ["ignore", "pipe", "inherit"],
  env: { ...process.env, LEAN_MODELS: models },
});
await new Promise((ok) => server.stdout.once("data", ok));
const rows = [];
let browser = null;
let failed = null;
try {
  browser = await chromium.launch({
    executablePath: process.env.LEAN_CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  outer: for (const file of files) {
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
      for (const task of tasks) {
        const cellStarted = performance.now();
        const run = (speculative) =>
          page.evaluate((o) => window.leanJs.benchChatSpec(o), { messages: task.messages, schema: task.schema, maxTokens: MAX_TOKENS, speculative });
        const reference = await run(null); // warm-up, and the ids every run must give
        const check = (r, what) => {
          const at = firstDifference(r.tokenIds, reference.tokenIds);
          if (at < 0) return true;
          failed =
            `${file} ${backend} ${task.name}: ${what} differs from the plain reply at token ${at} ` +
            `(${r.tokenIds.length} vs ${reference.tokenIds.length} tokens; ids from there: ` +
            `${JSON.stringify(r.tokenIds.slice(at, at + 8))} vs ${JSON.stringify(reference.tokenIds.slice(at, at + 8))})`;
          return false;
        };
        if (!check(await run(LOOKUP), "the lookup warm-up")) break outer;
        const plain = [];
        const lookup = [];
        for (let round = 0; round < rounds; round++) {
          for (const spec of round % 2 ? [LOOKUP, null] : [null, LOOKUP]) {
            const r = await run(spec);
            if (!check(r, `${spec ? "lookup" : "plain"} round ${round + 1}`)) break outer;
            (spec ? lookup : plain).push(r);
            const s = r.speculation;
            log(
              `${file} ${backend} ${task.name} round ${round + 1}: ${spec ? "lookup" : "plain "} ${r.generated} tokens ` +
                `(${r.finishReason}), decode ${r.decodeTokensPerSecond.toFixed(1)} tok/s` +
                (spec ? `, accepted ${s.acceptedTokens}/${s.draftedTokens} in ${s.verifications} checks, ${s.pausedSteps} steps paused` : ""),
            );
          }
        }
        const row = {
          model: file,
          backend,
          task: task.name,
          rounds,
          maxTokens: MAX_TOKENS,
          speculative: LOOKUP,
          tokens: reference.generated,
          finishReason: reference.finishReason,
          promptPrefillMs: median(plain.map((r) => r.prefillMs)),
          plainTokPerS: median(plain.map((r) => r.decodeTokensPerSecond)),
          lookupTokPerS: median(lookup.map((r) => r.decodeTokensPerSecond)),
          speedup: median(plain.map((p, i) => lookup[i].decodeTokensPerSecond / p.decodeTokensPerSecond)),
          wallSpeedup: median(plain.map((p, i) => p.wallMs / lookup[i].wallMs)),
          acceptedTokens: median(lookup.map((r) => r.speculation.acceptedTokens)),
          draftedTokens: median(lookup.map((r) => r.speculation.draftedTokens)),
          verifications: median(lookup.map((r) => r.speculation.verifications)),
          pausedSteps: median(lookup.map((r) => r.speculation.pausedSteps)),
          plainRuns: plain.map((r) => r.decodeTokensPerSecond),
          lookupRuns: lookup.map((r) => r.decodeTokensPerSecond),
        };
        rows.push(row);
        if (jsonFile) appendFileSync(jsonFile, JSON.stringify({ ...row, chromium: browser.version(), date: new Date().toISOString() }) + "\n");
        log(`${file} ${backend} ${task.name}: ${((performance.now() - cellStarted) / 1000).toFixed(0)} s`);
      }
      await page.close();
    }
  }
  if (failed) {
    console.error(`bench-spec: FAILED: speculation changed the reply: ${failed}`);
    process.exitCode = 1;
  } else {
    console.log(`Chromium ${browser.version()}, greedy chat from an empty KV cache, at most ${MAX_TOKENS} tokens, ` +
      `prompt lookup { lookup: ${LOOKUP.lookup} } vs plain, ${rounds} rounds (medians; token-exact):\n`);
    console.log("| model | backend | task | plain tok/s | lookup tok/s | speed-up | accepted/drafted | tokens |");
    console.log("|---|---|---|---|---|---|---|---|");
    for (const r of rows) {
      const rate = r.draftedTokens ? ` (${((100 * r.acceptedTokens) / r.draftedTokens).toFixed(0)}%)` : "";
      console.log(
        `| ${r.model} | ${r.backend} | ${r.task} | ${r.plainTokPerS.toFixed(1)} | ${r.lookupTokPerS.toFixed(1)} | ` +
          `${r.speedup.toFixed(2)}x | ${r.acceptedTokens}/${r.draftedTokens}${rate} | ${r.tokens}${r.finishReason === "length" ? "" : ` (${r.finishReason})`} |`,
      );
    }
    if (!jsonFile) {
      console.log("");
      for (const r of rows) console.log(JSON.stringify({ ...r, chromium: browser.version() }));
    }
  }
  log(`total ${((performance.now() - started) / 1000).toFixed(0)} s`);
} finally {
  await browser?.close();
  server.kill();
}
