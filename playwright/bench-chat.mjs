// The browser half of scripts/bench-chat.sh: lean-js in headless Chromium (the lean-js test page,
// served by server.js) runs the same conversation as `lean-cli bench-chat` on the simd and the
// threads backend, with the KV cache carried across turns and dropped before each, and prints
// each turn's time to first token.
//   node playwright/bench-chat.mjs MODEL_FILE_STEM TOKENIZER_DIR [turns=10] [gen_tokens=64]
// Env: LEAN_MODELS, LEAN_TEST_PORT (default 8788), LEAN_CHROMIUM.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "@playwright/test";

const here = dirname(fileURLToPath(import.meta.url));
const [stem, tokenizerDir, turns = "10", genTokens = "64"] = process.argv.slice(2);
if (!stem || !tokenizerDir) throw new Error("usage: node bench-chat.mjs MODEL_FILE_STEM TOKENIZER_DIR [turns] [gen_tokens]");
const questions = JSON.parse(readFileSync(join(here, "../scripts/bench-chat-questions.json"), "utf8")).slice(0, Number(turns));
const port = Number(process.env.LEAN_TEST_PORT ?? 8788);
const server = spawn(process.execPath, [join(here, "server.js"), String(port)], { stdio: ["ignore", "pipe", "inherit"] });
await new Promise((resolve) => server.stdout.once("data", resolve));
const browser = await chromium.launch({
  executablePath: process.env.LEAN_CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const model = {
  gguf: `/models/${stem}.gguf`,
  tokenizer: `/models/${tokenizerDir}/tokenizer.json`,
  tokenizerConfig: `/models/${tokenizerDir}/tokenizer_config.json`,
  chatTemplate: `/models/${tokenizerDir}/chat_template.jinja`,
};
try {
  for (const backend of ["simd", "threads"]) {
    for (const reuse of [true, false]) {
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${port}/lean-js-page/index.html`);
      await page.waitForFunction(() => window.leanJs !== undefined);
      await page.evaluate((o) => window.leanJs.load(o), { model, backend, threads: 2, cache: false });
      const rows = await page.evaluate((o) => window.leanJs.benchChat(o), { questions, genTokens: Number(genTokens), reuse });
      console.log(`Chromium ${backend} · KV cache ${reuse ? "carried across turns" : "dropped each turn"}`);
      console.log("turn  prompt  cached  ttft ms  decode tok/s");
      rows.forEach((r, i) =>
        console.log(`${String(i + 1).padStart(4)}  ${String(r.promptTokens).padStart(6)}  ${String(r.cachedTokens).padStart(6)}  ${r.ttftMs.toFixed(0).padStart(7)}  ${r.decodeTokensPerSecond.toFixed(1).padStart(12)}`),
      );
      console.log(`last turn's time to first token / first turn's: ${(rows.at(-1).ttftMs / rows[0].ttftMs).toFixed(2)}x`);
      await page.close();
    }
  }
} finally {
  await browser.close();
  server.kill();
}
