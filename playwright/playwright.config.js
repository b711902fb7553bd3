// Playwright settings for lean's browser tests (scripts/test-browser.sh). The browsers are the
// system's (apt: chromium, firefox-esr), never Playwright's downloads.
import { defineConfig } from "@playwright/test";

const port = Number(process.env.LEAN_TEST_PORT ?? 8787);
/** The demo's preview server (packages/demo/dist, built by scripts/test-browser.sh): tests/demo.spec.js. */
export const demoPort = Number(process.env.LEAN_DEMO_TEST_PORT ?? 5177);

export default defineConfig({
  testDir: "tests",
  // One test at a time: the threads rows need both cores, and the speeds are measured.
  workers: 1,
  fullyParallel: false,
  // Loading and generating with a 0.5B model on one core takes tens of seconds.
  timeout: 10 * 60_000,
  // One retry: the Firefox threads build's init has at times hung (parity.spec.js, start, also
  // tries it again itself); a test that passes only on its retry is reported as flaky in the
  // summary, and every init that timed out is listed there, not hidden.
  retries: 1,
  reporter: [["list"], ["json", { outputFile: "test-results/results.json" }]],
  use: { baseURL: `http://127.0.0.1:${port}` },
  webServer: [
    {
      command: `node server.js ${port}`,
      url: `http://127.0.0.1:${port}/page/index.html`,
      reuseExistingServer: false,
      stdout: "pipe",
    },
    {
      command: `npm run preview -w lean-demo -- --host 127.0.0.1 --port ${demoPort} --strictPort`,
      cwd: "..",
      url: `http://127.0.0.1:${demoPort}/device.html`,
      reuseExistingServer: false,
      stdout: "ignore",
    },
  ],
  projects: [
    {
      name: "chromium",
      use: {
        browserName: "chromium",
        launchOptions: {
          executablePath: process.env.LEAN_CHROMIUM ?? "/usr/bin/chromium",
          args: [
            "--no-sandbox",
            "--enable-unsafe-webgpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // window.gc(): tests/long-session.spec.js reads the JS heap after a collection.
            "--js-flags=--expose-gc",
          ],
        },
      },
    },
    {
      name: "firefox",
      use: {
        browserName: "firefox",
        // Stock Firefox ESR, driven over WebDriver BiDi.
        channel: "moz-firefox",
        launchOptions: {
          executablePath: process.env.LEAN_FIREFOX ?? "/usr/bin/firefox-esr",
          firefoxUserPrefs: { "dom.webgpu.enabled": true, "gfx.webgpu.ignore-blocklist": true },
        },
      },
    },
  ],
});
