// lean vs wllama in the browser (`npm run bench:browser`): the same headless Chromium, the same
// GGUF files, the same prompts, 1 and 2 threads. lean runs through lean-js (lean-js-page/),
// wllama through its npm builds (wllama-page/): @wllama/wllama 3.x, whose one build is wasm64
// (memory64), and 2.x (devDependency wllama-v2), the newest with wasm32 single- and multi-thread
// builds. All pages are served by server.js with COOP/COEP (cross-origin isolated). 1 thread:
// lean's simd backend vs wllama's n_threads 1 (no pthreads); 2 threads: lean's threads backend vs
// wllama's n_threads 2. All on the CPU (wllama 3's n_gpu_layers 0). Per file, thread count and
// engine, in a fresh page:
//   load      the GGUF is fetched into a Blob first (not timed); load = createEngine / loadModel
//             on that Blob until the engine is ready (worker, wasm compile, weights; context 1024)
//   warm-up   one completion of the short prompt, 1 token (not timed)
//   prefill   raw completion (no chat template) of a ≈64- and a ≈512-token text
//             (scripts/bench-browser-prompts.json) from an empty KV cache: prompt tokens / (call →
//             first token on the page); tokens counted by each engine's own tokenizer
//   decode    the same completions go on for 64 greedy tokens (temperature 0; lean goes on past
//             end of sequence, wllama bans it: ignore_eos in 3.x, a logit bias on EOS/EOT in 2.x):
//             (64 - 1) / (first → last token on the page), so decode runs after each prompt, at
//             the same depth for every engine
// Engines alternate per row (which goes first turns each round); each cell is the median over
// the rounds. A benchmark, not a test: CI does not run it; run it on a quiet machine.
//   npm run bench:browser        (root; or node playwright/bench-browser.mjs)
// Needs the wasm builds (scripts/build.sh), lean-js's build (npm ci; npm run build -w lean-js)
// and `npm ci` in playwright/, as scripts/test-browser.sh makes them, and the test models.
// Env: LEAN_MODELS (default models/), LEAN_BENCH_FILES (model file stems, comma or space
// separated; default the five below), LEAN_BENCH_ROUNDS (default 2), LEAN_BENCH_THREADS
// (default "1 2"), LEAN_BENCH_ENGINES (default "lean wllama wllama2"), LEAN_BENCH_GEN_TOKENS
// (default 64), LEAN_TEST_PORT (default 8789), LEAN_CHROMIUM (default /usr/bin/chromium).
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "@playwright/test";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..");
const list = (value) => value.split(/[\s,]+/).filter(Boolean);
const files = list(
  process.env.LEAN_BENCH_FILES ??
    "smollm2-135m-instruct-q4_0 smollm2-135m-instruct-q4_1 smollm2-135m-instruct-q8_0 qwen2.5-coder-0.5b-instruct-q4_0 qwen2.5-coder-0.5b-instruct-q4_k_m",
).map((f) => f.replace(/\.gguf$/, ""));
const rounds = Number(process.env.LEAN_BENCH_ROUNDS ?? 2);
const threadCounts = list(process.env.LEAN_BENCH_THREADS ?? "1 2").map(Number);
const genTokens = Number(process.env.LEAN_BENCH_GEN_TOKENS ?? 64);
const contextLength = 1024; // lean-js-page's; holds 512 + 64 and the warm-up
const port = Number(process.env.LEAN_TEST_PORT ?? 8789);
const models = resolve(process.env.LEAN_MODELS ?? join(repo, "models"));
const prompts = JSON.parse(readFileSync(join(repo, "scripts/bench-browser-prompts.json"), "utf8"));
const log = (...args) => console.error("bench-browser:", ...args);

// What the pages load, built beforehand (the benchmark builds nothing itself).
const needed = {
  "rust/lean-wasm/pkg/lean_wasm_bg.wasm": "scripts/build.sh st",
  "rust/lean-wasm/pkg-mt/lean_wasm_bg.wasm": "scripts/build.sh mt",
  "packages/lean-js/dist/index.js": "npm ci && npm run build -w lean-js",
  "playwright/node_modules/@wllama/wllama/esm/index.js": "cd playwright && npm ci",
  "playwright/node_modules/wllama-v2/esm/index.js": "cd playwright && npm ci",
};
for (const [file, fix] of Object.entries(needed)) {
  if (!existsSync(join(repo, file))) throw new Error(`${file} is missing: run ${fix}`);
}
for (const f of files) {
  if (!existsSync(join(models, `${f}.gguf`))) throw new Error(`${models}/${f}.gguf is missing (scripts/fetch-test-models.sh)`);
}
const require = createRequire(import.meta.url);
const engineNames = list(process.env.LEAN_BENCH_ENGINES ?? "lean wllama wllama2");
const engineLabel = {
  lean: "lean",
  wllama: `wllama ${require("@wllama/wllama/package.json").version}`,
  wllama2: `wllama ${require("wllama-v2/package.json").version}`,
};
for (const e of engineNames) if (!(e in engineLabel)) throw new Error(`LEAN_BENCH_ENGINES: unknown engine ${e} (lean, wllama, wllama2)`);

/** Opens `path` in a fresh page (its own context) and waits until it set `window[global]`. */
async function openPage(browser, path, global) {
  const page = await browser.newPage();
  page.on("pageerror", (e) => log(`${path}: ${e.message}`));
  // Failed requests by URL (the console's "Failed to load resource" names none); no favicon.
  page.on("response", (r) => r.status() >= 400 && !r.url().endsWith("/favicon.ico") && log(`${path}: HTTP ${r.status()} ${r.url()}`));
  page.on("console", (m) => m.type() === "error" && !m.text().startsWith("Failed to load resource") && log(`${path}: ${m.text()}`));
  await page.goto(`http://127.0.0.1:${port}${path}`);
  await page.waitForFunction((g) => window[g] !== undefined, global);
  return page;
}

/** One engine's run on one file: load, warm-up, the two prompts. */
const engines = {
  async lean(browser, file, threads) {
    const page = await openPage(browser, "/lean-js-page/index.html", "leanJs");
    try {
      const backend = threads === 1 ? "simd" : "threads";
      const info = await page.evaluate((o) => window.leanJs.load(o), {
        model: { gguf: { fetch: `/models/${file}.gguf`, as: "blob" } },
        backend,
        threads: threads === 1 ? undefined : threads,
        cache: false,
      });
      if (info.backend !== backend || !info.crossOriginIsolated) throw new Error(`lean loaded ${info.backend}, crossOriginIsolated ${info.crossOriginIsolated}`);
      const bench = (prompt, n) => page.evaluate((o) => window.leanJs.benchPrompt(o), { prompt, genTokens: n });
      await bench(prompts.short, 1);
      return { loadMs: info.loadMs, short: await bench(prompts.short, genTokens), long: await bench(prompts.long, genTokens) };
    } finally {
      await page.close();
    }
  },
  wllama: (browser, file, threads) => wllamaRun(browser, file, threads, ""),
  wllama2: (browser, file, threads) => wllamaRun(browser, file, threads, "?v=2"),
};

async function wllamaRun(browser, file, threads, query) {
  const page = await openPage(browser, `/wllama-page/index.html${query}`, "wllama");
  try {
    const info = await page.evaluate((o) => window.wllama.load(o), { url: `/models/${file}.gguf`, threads, contextLength });
    if (info.multithread !== threads > 1 || info.threads !== threads || !info.crossOriginIsolated) {
      throw new Error(`wllama loaded multithread ${info.multithread}, ${info.threads} threads, crossOriginIsolated ${info.crossOriginIsolated}`);
    }
    libllama[query ? "wllama2" : "wllama"] ??= info.version;
    const bench = (prompt, n) => page.evaluate((o) => window.wllama.benchPrompt(o), { prompt, genTokens: n });
    await bench(prompts.short, 1);
    return { loadMs: info.loadMs, short: await bench(prompts.short, genTokens), long: await bench(prompts.long, genTokens) };
  } finally {
    await page.close();
  }
}
/** llama.cpp's version in each wllama build, as it reports it. */
const libllama = {};

/** The figures of one run: load s, prefill tok/s and decode tok/s of each prompt. */
function figures(run) {
  const prefill = (r) => (r.promptTokens * 1000) / r.prefillMs;
  const decode = (r) => ((r.generated - 1) * 1000) / r.decodeMs;
  for (const r of [run.short, run.long]) {
    if (r.cachedTokens) throw new Error(`${r.cachedTokens} prompt tokens came from a cache`);
    if (r.generated !== genTokens) throw new Error(`generated ${r.generated} tokens, not ${genTokens}`);
  }
  return {
    load: run.loadMs / 1000,
    ppShort: prefill(run.short),
    ppLong: prefill(run.long),
    tgShort: decode(run.short),
    tgLong: decode(run.long),
    tokens: [run.short.promptTokens, run.long.promptTokens],
    text: run.short.text,
  };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const server = spawn(process.execPath, [join(here, "server.js"), String(port)], {
  stdio: ["ignore", "pipe", "inherit"],
  env: { ...process.env, LEAN_MODELS: models },
});
await new Promise((ok) => server.stdout.once("data", ok));
/** results[file][threads][engine]: the figures of each round (or the error). */
const results = {};
let browser = null;
try {
  browser = await chromium.launch({
    executablePath: process.env.LEAN_CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  for (let round = 1; round <= rounds; round++) {
    for (const threads of threadCounts) {
      for (const file of files) {
        // Which engine goes first turns each round.
        const shift = (round - 1) % engineNames.length;
        for (const engine of [...engineNames.slice(shift), ...engineNames.slice(0, shift)]) {
          log(`round ${round}/${rounds}: ${file}, ${threads} thread(s), ${engine}`);
          const cell = (((results[file] ??= {})[threads] ??= {})[engine] ??= []);
          try {
            cell.push(figures(await engines[engine](browser, file, threads)));
            const r = cell.at(-1);
            log(`  load ${r.load.toFixed(2)} s, prefill ${r.ppShort.toFixed(1)} / ${r.ppLong.toFixed(1)} tok/s, decode ${r.tgShort.toFixed(1)} / ${r.tgLong.toFixed(1)} tok/s`);
          } catch (e) {
            log(`${engine} failed: ${e.message}`);
            cell.push({ error: e.message.split("\n")[0] });
          }
        }
      }
    }
  }
  print(await browser.version());
} finally {
  await browser?.close();
  server.kill();
}

function print(chromiumVersion) {
  const f = (x, digits = 1) => (Number.isFinite(x) ? x.toFixed(digits) : "–");
  const wllamas = engineNames.filter((e) => e !== "lean");
  const out = [];
  out.push(`lean (lean-js) vs ${wllamas.map((e) => `${engineLabel[e]} (llama.cpp ${libllama[e] ?? "?"})`).join(", ")} in headless Chromium ${chromiumVersion}, ` +
    `${rounds} round(s), median. Prefill: raw completion of the ≈64- and ≈512-token texts from an empty KV cache; ` +
    `decode: ${genTokens} greedy tokens after each of those prompts (the same depth for every engine). ` +
    `1 thread: lean simd vs wllama n_threads 1; 2 threads: lean threads vs wllama n_threads 2. ` +
    `Ratio: lean's speed / wllama's (load: wllama's time / lean's); > 1 = lean faster.`);
  out.push("");
  out.push("| model | threads | engine | load s | prefill ≈64 tok/s | prefill ≈512 tok/s | decode tok/s after ≈64 | decode tok/s after ≈512 |");
  out.push("|---|---|---|---:|---:|---:|---:|---:|");
  const keys = ["load", "ppShort", "ppLong", "tgShort", "tgLong"];
  const notes = [];
  for (const file of files) {
    for (const threads of threadCounts) {
      const cells = results[file]?.[threads] ?? {};
      const ok = (engine) => (cells[engine] ?? []).filter((r) => !r.error);
      const med = (engine, key) => (ok(engine).length ? median(ok(engine).map((r) => r[key])) : NaN);
      const rows = Object.fromEntries(engineNames.map((e) => [e, Object.fromEntries(keys.map((k) => [k, med(e, k)]))]));
      let first = true;
      const line = (label, cells) => {
        out.push(`| ${first ? file : ""} | ${first ? threads : ""} | ${label} | ${cells.join(" | ")} |`);
        first = false;
      };
      for (const e of engineNames) {
        const r = rows[e];
        line(e === "lean" ? `lean ${threads === 1 ? "simd" : "threads"}` : engineLabel[e], [f(r.load, 2), f(r.ppShort), f(r.ppLong), f(r.tgShort), f(r.tgLong)]);
      }
      const lean = rows.lean;
      for (const e of lean ? wllamas : []) {
        const w = rows[e];
        const ratios = [w.load / lean.load, ...keys.slice(1).map((k) => lean[k] / w[k])];
        line(`**lean / ${engineLabel[e]}**`, ratios.map((x) => `**${f(x, 2)}**`));
      }
      for (const e of engineNames) {
        for (const r of cells[e] ?? []) if (r.error) notes.push(`${file}, ${threads} thread(s), ${engineLabel[e]}: ${r.error}`);
      }
      // Each engine's own tokenizer counts the prompts; the greedy texts show they run the same model.
      if (threads === threadCounts[0]) {
        const l = ok("lean")[0];
        const parts = engineNames.filter((e) => ok(e)[0]).map((e) => {
          const r = ok(e)[0];
          let same = 0;
          while (l && same < l.text.length && l.text[same] === r.text[same]) same++;
          return `${engineLabel[e]} ${r.tokens.join(" + ")}` + (l && e !== "lean" ? ` (greedy text after the ≈64 prompt: first ${same} of ${l.text.length} characters as lean's)` : "");
        });
        notes.push(`${file}: prompt tokens ${parts.join(", ")}`);
      }
    }
  }
  if (notes.length) out.push("", ...notes.map((n) => `- ${n}`));
  console.log(out.join("\n"));
}
