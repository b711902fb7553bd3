// The demo (packages/demo, built and served by `vite preview`, see playwright.config.js) as a
// person uses it: the chat page loads the default model, answers, and answers the next turn with
// the conversation so far taken from the KV cache; the device page fills its tables and its
// parity self-check matches HF transformers on every backend this browser offers; the reply's
// Markdown is rendered and hostile HTML in it made inert; the system prompt and sampling settings
// reach the engine. Then the static site (`npm run build` → _site/) as a host serves it, through
// scripts/serve-site.mjs: from a sub-path with COOP/COEP, and without them, isolated by the
// opt-in service worker (?coi=1). Screenshots of the pages are attached to each test's results.
import { spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";
import { demoPort } from "../playwright.config.js";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const demo = `http://127.0.0.1:${demoPort}`;

function requireDemo() {
  const built = join(repo, "packages/demo/dist/index.html");
  if (existsSync(built)) return;
  if (process.env.CI) throw new Error(`${built} is missing (npm run build -w lean-demo)`);
  test.skip(true, "the demo is not built (npm run build -w lean-demo)");
}

async function screenshot(page, testInfo, name) {
  const path = testInfo.outputPath(`${name}.png`);
  await page.screenshot({ path, fullPage: true });
  await testInfo.attach(name, { path, contentType: "image/png" });
}

/**
 * Chromium's WebGPU here is SwiftShader: a device-page row on it took 2.5 of CI's minutes, and
 * parity.spec.js runs WebGPU in Chromium already. There the page sees a browser without WebGPU
 * instead (navigator.gpu hidden, in the page and its workers), and its row must say so; Firefox's
 * lavapipe runs. Returns whether it hid WebGPU.
 */
async function hideChromiumWebGpu(page, testInfo) {
  const hide = testInfo.project.name === "chromium";
  if (hide) {
    await page.addInitScript(() => Object.defineProperty(Navigator.prototype, "gpu", { get: () => undefined, configurable: true }));
  }
  return hide;
}

for (const backend of ["simd", "threads"]) {
  test(`chat page (${backend}): answers, and the next turn comes from the cache`, async ({ page }, testInfo) => {
    requireDemo();
    await page.goto(`${demo}/?backend=${backend}&autoload=1`);
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
    await expect(page.locator("body")).toHaveAttribute("data-backend", backend);
    const ask = async (text) => {
      // (fill() on a number input appends to its value in Firefox.)
      await page.locator("#max-tokens").evaluate((input) => (input.value = "24"));
      await page.fill("#prompt", text);
      await page.click("#send");
      await expect(page.locator("body")).toHaveAttribute("data-state", "generating");
      await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
    };
    await ask("What is the capital of France?");
    await expect(page.locator("#messages li.assistant").last()).not.toBeEmpty();
    await expect(page.locator("#stats")).not.toContainText("from the cache");
    await ask("And of Italy?");
    await expect(page.locator("#messages li.assistant")).toHaveCount(2);
    await expect(page.locator("#messages li.assistant").last()).not.toBeEmpty();
    await expect(page.locator("#stats")).toContainText(/prompt \d+ tokens \(\d+ from the cache\)/);
    console.log(`${testInfo.project.name} demo ${backend}: ${await page.locator("#stats").textContent()}`);
    await screenshot(page, testInfo, `chat-${backend}`);
  });
}

test("chat page: Stop ends a reply midway and the chat goes on; another model loads in its place", async ({ page }, testInfo) => {
  requireDemo();
  await page.goto(`${demo}/?backend=simd&autoload=1`);
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
  await page.locator("#max-tokens").evaluate((input) => (input.value = "400"));
  await page.fill("#prompt", "Write a long story about a lighthouse keeper.");
  await page.click("#send");
  await expect(page.locator("#messages li.assistant").last()).not.toBeEmpty();
  // Live speeds while it streams.
  await expect(page.locator("#stats")).toContainText(/prefill [\d.]+ tok\/s · decode [\d.]+ tok\/s/);
  await page.click("#stop");
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 30_000 });
  await expect(page.locator("#stats")).toContainText(/^cancelled · /);
  const stopped = JSON.parse((await page.locator("body").getAttribute("data-last-token-ids")) ?? "[]");
  expect(stopped.length).toBeGreaterThan(0);
  expect(stopped.length).toBeLessThan(400);
  // The conversation goes on after the stop, its stopped reply in the context.
  await page.locator("#max-tokens").evaluate((input) => (input.value = "8"));
  await page.fill("#prompt", "Thanks!");
  await page.click("#send");
  await expect(page.locator("#messages li.assistant")).toHaveCount(2);
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 60_000 });
  await expect(page.locator("#stats")).toContainText("from the cache");

  // Switch to another local model: the chat starts over on it.
  await page.selectOption("#model", "smollm2-135m-instruct-q8_0");
  await page.click("#load");
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
  await expect(page.locator("#engine-status")).toContainText("Q8_0");
  await expect(page.locator("#messages li")).toHaveCount(0);
  await page.fill("#prompt", "Hello!");
  await page.click("#send");
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 60_000 });
  await expect(page.locator("#messages li.assistant")).not.toBeEmpty();
  await screenshot(page, testInfo, "chat-stop-switch");
});

test("device page: capabilities, backend decisions, and the parity self-check matches on every backend", async ({ page }, testInfo) => {
  requireDemo();
  test.setTimeout(15 * 60_000);
  const hideWebGpu = await hideChromiumWebGpu(page, testInfo);
  await page.goto(`${demo}/device.html`);
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready");
  await expect(page.locator("#capabilities tr")).toHaveCount(8);
  await expect(page.locator("#capabilities")).toContainText("Cross-origin isolated (COOP + COEP)yes");
  await expect(page.locator("#decisions tr")).toHaveCount(4);
  await page.click("#self-check");
  await expect(page.locator("body")).toHaveAttribute("data-self-check", /passed|failed/, { timeout: 14 * 60_000 });
  const rows = await page.locator("#parity tr").allTextContents();
  console.log(`${testInfo.project.name} self-check:\n  ${rows.join("\n  ")}`);
  await screenshot(page, testInfo, "device");
  expect(await page.locator("body").getAttribute("data-self-check")).toBe("passed");
  // Both CPU backends run here (the page is cross-origin isolated); so does WebGPU (software),
  // unless hidden.
  for (const backend of hideWebGpu ? ["threads", "simd"] : ["webgpu", "threads", "simd"]) {
    await expect(page.locator(`#parity tr:has(th:text-is("${backend}"))`)).toHaveAttribute("data-verdict", "match");
  }
  if (hideWebGpu) {
    const row = page.locator('#parity tr:has(th:text-is("webgpu"))');
    await expect(row).toHaveAttribute("data-verdict", "not available");
    await expect(row).toContainText("navigator.gpu is missing");
  }
});

test("device page: the one-click benchmark measures load, prefill and decode on every backend", async ({ page }, testInfo) => {
  requireDemo();
  test.setTimeout(10 * 60_000);
  const hideWebGpu = await hideChromiumWebGpu(page, testInfo);
  await page.goto(`${demo}/device.html?benchTokens=8`);
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready");
  await expect(page.locator("#bench-tokens")).toHaveText("8");
  await page.click("#benchmark");
  await expect(page.locator("body")).toHaveAttribute("data-benchmark", /done|failed/, { timeout: 9 * 60_000 });
  const rows = await page.locator("#bench tr").allTextContents();
  console.log(`${testInfo.project.name} benchmark:\n  ${rows.join("\n  ")}`);
  await screenshot(page, testInfo, "device-benchmark");
  expect(await page.locator("body").getAttribute("data-benchmark")).toBe("done");
  for (const backend of hideWebGpu ? ["threads", "simd"] : ["webgpu", "threads", "simd"]) {
    const row = page.locator(`#bench tr:has(th:text-is("${backend}"))`);
    await expect(row).toHaveAttribute("data-outcome", "measured");
    // Every figure is a positive number, the prompt the same on every backend, 8 tokens decoded.
    const text = await row.textContent();
    const match = text.match(/load ([\d.]+) s · prefill ([\d.]+) tok\/s \((\d+) tokens\) · decode ([\d.]+) tok\/s \(8 tokens\) · (\w+)$/);
    expect(match, text).not.toBeNull();
    expect(Number(match[2])).toBeGreaterThan(0);
    expect(Number(match[4])).toBeGreaterThan(0);
    expect(Number(match[3])).toBeGreaterThan(100);
    expect(match[5]).toBe(backend);
  }
  if (hideWebGpu) {
    await expect(page.locator('#bench tr:has(th:text-is("webgpu"))')).toHaveAttribute("data-outcome", "not available");
  }
});

test("chat page: Markdown rendered and sanitized, system prompt and sampling settings sent, backend badge", async ({ page }, testInfo) => {
  requireDemo();
  await page.goto(`${demo}/?backend=simd&autoload=1`);
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
  await expect(page.locator("#backend-badge")).toHaveText("simd");
  expect(await page.locator("#backend-badge").getAttribute("title")).toMatch(/^simd backend: requested/);

  // The page's renderer on hostile model output: Markdown kept, everything active removed.
  const rendered = await page.evaluate(async () => {
    const div = document.createElement("div");
    document.body.append(div);
    globalThis.leanDemo.renderMarkdown(
      div,
      "**bold** and `code`\n\n- one\n- two\n\n<script>window.pwned = 1</script>" +
        '<img src="x" onerror="window.pwned = 2"> [link](javascript:window.pwned=3) <a href="https://example.org" onclick="window.pwned=4">ok</a>' +
        '\n\n<iframe src="javascript:parent.pwned=5"></iframe><form action="https://evil.example"><input name="x"></form>',
    );
    await new Promise((r) => setTimeout(r, 300));
    const out = {
      strong: div.querySelectorAll("strong").length,
      code: div.querySelectorAll("code").length,
      items: div.querySelectorAll("li").length,
      scripts: div.querySelectorAll("script, iframe, form, input").length,
      handlers: [...div.querySelectorAll("*")].filter((e) => [...e.attributes].some((a) => a.name.startsWith("on"))).length,
      javascriptUrls: [...div.querySelectorAll("[href], [src]")].filter((e) => /^\s*javascript:/i.test(e.getAttribute("href") ?? e.getAttribute("src") ?? "")).length,
      safeLink: div.querySelector('a[href="https://example.org"]')?.getAttribute("rel") ?? null,
      pwned: globalThis.pwned ?? null,
    };
    div.remove();
    return out;
  });
  expect(rendered).toEqual({ strong: 1, code: 1, items: 2, scripts: 0, handlers: 0, javascriptUrls: 0, safeLink: "noopener noreferrer nofollow", pwned: null });

  // A system prompt goes first in the conversation; a Markdown list from the model is rendered as one.
  await page.fill("#system-prompt", "You are a helpful assistant. Answer with Markdown lists.");
  await page.locator("#max-tokens").evaluate((input) => (input.value = "48"));
  await page.fill("#prompt", "List three fruits as a bulleted list.");
  await page.click("#send");
  await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
  const sent = JSON.parse((await page.locator("body").getAttribute("data-last-messages")) ?? "[]");
  expect(sent[0]).toEqual({ role: "system", content: "You are a helpful assistant. Answer with Markdown lists." });
  expect(sent.at(-1)).toEqual({ role: "user", content: "List three fruits as a bulleted list." });
  const reply = page.locator("#messages li.assistant .markdown").last();
  console.log(`${testInfo.project.name} markdown reply: ${await reply.innerHTML()}`);
  await expect(reply.locator("li").first()).toBeVisible();
  await expect(page.locator("#stats")).toContainText(/prefill \d+ at [\d.]+ tok\/s · \d+ generated at [\d.]+ tok\/s/);

  // Sampling settings reach the engine: the same seed gives the same sampled reply, twice.
  const sample = async () => {
    await page.click("#clear");
    await page.locator("#temperature").evaluate((input) => (input.value = "1.2"));
    await page.locator("#top-p").evaluate((input) => (input.value = "0.95"));
    await page.locator("#top-k").evaluate((input) => (input.value = "40"));
    await page.locator("#seed").evaluate((input) => (input.value = "1234"));
    await page.locator("#max-tokens").evaluate((input) => (input.value = "12"));
    await page.fill("#prompt", "Say something surprising.");
    await page.click("#send");
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 60_000 });
    return page.locator("body").getAttribute("data-last-token-ids");
  };
  const first = await sample();
  expect(await sample()).toBe(first);
  // No error on the page along the way.
  await expect(page.locator("#page-error")).toBeHidden();
  await expect(page.locator("#load-error")).toBeHidden();
  await screenshot(page, testInfo, "chat-markdown");
});

/** `npm run build`'s static site, served by scripts/serve-site.mjs (port 0: a free one). */
async function serveSite(testInfo, args) {
  const site = join(repo, "_site/index.html");
  if (!existsSync(site)) {
    if (process.env.CI) throw new Error(`${site} is missing (npm run build)`);
    test.skip(true, "the static site is not built (npm run build)");
  }
  const models = process.env.LEAN_MODELS ?? join(repo, "models");
  const server = spawn(process.execPath, [join(repo, "scripts/serve-site.mjs"), "--port", "0", "--models", models, ...args], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise((resolve, reject) => {
    let out = "";
    server.stdout.on("data", (chunk) => {
      out += chunk;
      const match = out.match(/serve-site: (http:\S+)/);
      if (match) resolve(match[1]);
    });
    server.on("exit", (code) => reject(new Error(`serve-site exited (${code}): ${out}`)));
  });
  testInfo.annotations.push({ type: "site", description: `${url} ${args.join(" ")}` });
  return { url, close: () => server.kill() };
}

test("hosting: the static _site from a sub-path with COOP/COEP: isolated, the threads backend answers", async ({ page }, testInfo) => {
  const site = await serveSite(testInfo, ["--base", "/lean/demo/"]);
  try {
    const response = await page.goto(`${site.url}?backend=threads&autoload=1`);
    const headers = response.headers();
    expect(headers["cross-origin-opener-policy"]).toBe("same-origin");
    expect(headers["cross-origin-embedder-policy"]).toBe("require-corp");
    expect(await page.evaluate(() => crossOriginIsolated)).toBe(true);
    // Both wasm builds, relative to the page (the sub-path), as application/wasm (streaming compile).
    for (const name of readdirSync(join(repo, "_site/assets")).filter((n) => n.endsWith(".wasm"))) {
      const wasm = await fetch(new URL(`assets/${name}`, site.url), { method: "HEAD" });
      expect(wasm.status).toBe(200);
      expect(wasm.headers.get("content-type")).toBe("application/wasm");
      expect(wasm.headers.get("cross-origin-resource-policy")).toBe("same-origin");
    }
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
    await expect(page.locator("body")).toHaveAttribute("data-backend", "threads");
    expect(site.url).toMatch(/\/lean\/demo\/$/);
    await page.locator("#max-tokens").evaluate((input) => (input.value = "8"));
    await page.fill("#prompt", "What is the capital of France?");
    await page.click("#send");
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
    await expect(page.locator("#messages li.assistant")).not.toBeEmpty();
    await screenshot(page, testInfo, "site-threads");

    // The cached-model list: the model with its size, and its own Delete.
    const cached = page.locator('#cached li[data-target="smollm2-135m-instruct-q4_0"]');
    await expect(async () => {
      await page.click("#refresh-cache");
      await expect(cached).toContainText(/Q4_0.* — \d+\.\d MB/, { timeout: 1_000 });
    }).toPass({ timeout: 30_000 });
    await cached.locator("button.delete").click();
    await expect(cached).toHaveCount(0);
    // An error is shown in the page with what to do.
    await page.fill("#gguf-url", "models/no-such-model.gguf");
    await page.click("#load-url");
    await expect(page.locator("body")).toHaveAttribute("data-state", "error", { timeout: 60_000 });
    await expect(page.locator("#load-error")).toBeVisible();
    await expect(page.locator("#engine-status")).toContainText("HTTP 404");
    await expect(page.locator("#backend-badge")).toBeHidden();
    await expect(page.locator("#load-error .advice")).toContainText("What to do: Check the URL");
    await screenshot(page, testInfo, "site-error");
    await page.click('nav a[href="device.html"]');
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready");
    await expect(page.locator("#capabilities")).toContainText("Cross-origin isolated (COOP + COEP)yes");
    await expect(page.locator("#decisions tr").first()).toContainText('backend: "auto"');
    await expect(page.locator("#isolation")).toContainText("by the server's COOP/COEP headers");
    await expect(page.locator("#auto-choice")).toContainText('With backend "auto" (the default), lean-js runs');
  } finally {
    site.close();
  }
});

test("hosting: without COOP/COEP, ?coi=1's service worker isolates the page after one reload; threads runs", async ({ page }, testInfo) => {
  const site = await serveSite(testInfo, ["--no-isolation"]);
  try {
    const plain = await page.goto(site.url);
    expect(plain.headers()["cross-origin-embedder-policy"]).toBeUndefined();
    await expect(page.locator("body")).toHaveAttribute("data-state", "idle");
    expect(await page.evaluate(() => [crossOriginIsolated, globalThis.leanCoi.status])).toEqual([false, "off"]);

    await page.goto(`${site.url}?coi=1&backend=threads`);
    await page.waitForFunction(() => crossOriginIsolated, null, { timeout: 30_000 });
    expect(await page.evaluate(() => [globalThis.leanCoi.status, !!navigator.serviceWorker.controller])).toEqual(["service-worker", true]);
    await page.click("#load");
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
    await expect(page.locator("body")).toHaveAttribute("data-backend", "threads");
    await page.locator("#max-tokens").evaluate((input) => (input.value = "8"));
    await page.fill("#prompt", "Hello!");
    await page.click("#send");
    await expect(page.locator("body")).toHaveAttribute("data-state", "ready", { timeout: 120_000 });
    await expect(page.locator("#messages li.assistant")).not.toBeEmpty();
    await screenshot(page, testInfo, "site-coi-service-worker");

    // The opt-in is remembered (the device page is isolated too) until ?coi=0.
    await page.goto(`${site.url}device.html`);
    await expect(page.locator("#capabilities")).toContainText("Cross-origin isolated (COOP + COEP)yes");
    await expect(page.locator("#isolation")).toContainText("by the opt-in service worker");
    await page.goto(`${site.url}device.html?coi=0`);
    await page.waitForFunction(async () => (await navigator.serviceWorker.getRegistrations()).length === 0);
    await page.goto(`${site.url}device.html`);
    await expect(page.locator("#capabilities")).toContainText("Cross-origin isolated (COOP + COEP)no");
    await expect(page.locator("#isolation")).toContainText("Not cross-origin isolated");
  } finally {
    site.close();
  }
});
