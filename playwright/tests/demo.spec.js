// The demo (packages/demo, built and served by `vite preview`, see playwright.config.js) as a
// person uses it: the chat page loads the default model, answers, and answers the next turn with
// the conversation so far taken from the KV cache; the device page fills its tables and its
// parity self-check matches HF transformers on every backend this browser offers. Screenshots
// of both pages are attached to each test's results.
import { existsSync } from "node:fs";
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
  // Both CPU backends run here (the page is cross-origin isolated); so does WebGPU (software).
  for (const backend of ["webgpu", "threads", "simd"]) {
    await expect(page.locator(`#parity tr:has(th:text-is("${backend}"))`)).toHaveAttribute("data-verdict", "match");
  }
});
