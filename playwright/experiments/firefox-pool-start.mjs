// The Firefox thread-pool hang of issue 19, measured: the same page starts the threads build's
// pool of Web Workers `runs` times in fresh workers, in Firefox ESR headless on its own, then in
// Firefox ESR driven by Playwright (WebDriver BiDi), then in Chromium driven by Playwright, and
// prints how many starts hung (no answer within 15 s) in each.
//   node playwright/experiments/firefox-pool-start.mjs [threads=8] [runs=12]
// Needs rust/lean-wasm/pkg-mt (scripts/build.sh mt) and playwright's npm install.
import { spawn } from "node:child_process";
import { createReadStream, mkdtempSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, extname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, firefox } from "@playwright/test";

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, "..", "..");
const [threads = 8, runs = 12] = process.argv.slice(2).map(Number);
const roots = { "/pkg-mt/": join(repo, "rust/lean-wasm/pkg-mt"), "/experiments/": here };
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };
const isolation = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
  "Cross-Origin-Resource-Policy": "same-origin",
  "Cache-Control": "no-store",
};
let onDone = () => {};
const server = createServer((req, res) => {
  if (req.method === "POST") {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const result = JSON.parse(body);
      if (result.done) onDone(result);
      res.writeHead(204, isolation).end();
    });
    return;
  }
  const path = new URL(req.url, "http://x").pathname;
  for (const [prefix, dir] of Object.entries(roots)) {
    if (!path.startsWith(prefix)) continue;
    const file = join(dir, path.slice(prefix.length));
    if (!file.startsWith(dir) || !statSync(file, { throwIfNoEntry: false })?.isFile()) break;
    res.writeHead(200, { ...isolation, "Content-Type": types[extname(file)] ?? "application/octet-stream" });
    return createReadStream(file).pipe(res);
  }
  res.writeHead(404, isolation).end();
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const url = `http://127.0.0.1:${server.address().port}/experiments/pool-start.html?threads=${threads}&runs=${runs}`;
const finished = () => new Promise((resolve) => (onDone = resolve));

const results = {};
{
  const done = finished();
  const profile = mkdtempSync(join(tmpdir(), "lean-ff-"));
  const ff = spawn(process.env.LEAN_FIREFOX ?? "/usr/bin/firefox-esr", ["--headless", "--no-remote", "--profile", profile, url], { stdio: "ignore" });
  results["Firefox ESR, no automation"] = await done;
  ff.kill();
}
for (const [name, type, options] of [
  ["Firefox ESR, Playwright (BiDi)", firefox, { channel: "moz-firefox", executablePath: process.env.LEAN_FIREFOX ?? "/usr/bin/firefox-esr" }],
  ["Firefox ESR, Playwright (BiDi), WebGPU prefs", firefox, { channel: "moz-firefox", executablePath: process.env.LEAN_FIREFOX ?? "/usr/bin/firefox-esr", firefoxUserPrefs: { "dom.webgpu.enabled": true, "gfx.webgpu.ignore-blocklist": true } }],
  ["Chromium, Playwright (CDP)", chromium, { executablePath: process.env.LEAN_CHROMIUM ?? "/usr/bin/chromium", args: ["--no-sandbox"] }],
]) {
  const browser = await type.launch(options);
  const page = await browser.newPage();
  const done = finished();
  await page.goto(url);
  results[name] = await done;
  await browser.close();
}
server.close();
for (const [name, { hung, runs: n }] of Object.entries(results)) {
  console.log(`${name}: ${hung} of ${n} pool starts (${threads} threads) hung`);
}
