// Prints the browser tests' results from Playwright's JSON report: the table of parity tests
// (one row per browser × backend × model: pass/FAIL, and the speeds that a passing test records
// as its "bench" annotation) and one closing line, `browser: N passed, N failed`. Exits
// non-zero when a test failed or no report exists.
//   node playwright/summary.js [test-results/results.json]
import { existsSync, readFileSync } from "node:fs";

const file = process.argv[2] ?? "test-results/results.json";
if (!existsSync(file)) {
  console.log(`no Playwright report at ${file} (did the test server or a browser fail to start?)`);
  console.log("browser: 0 passed, 1 failed");
  process.exit(1);
}
const report = JSON.parse(readFileSync(file, "utf8"));

/** Every test with the titles of the describe blocks around it (the backend, here). */
function* tests(suite, path = []) {
  for (const spec of suite.specs ?? []) {
    for (const t of spec.tests) yield { ...t, title: spec.title, path };
  }
  for (const child of suite.suites ?? []) yield* tests(child, [...path, child.title]);
}

// One row per parity test: its speeds when it passed (the "bench" annotation), else FAIL.
const rows = new Map();
for (const suite of report.suites) {
  for (const t of tests(suite)) {
    const model = t.title.match(/^(\S+): (?:first (?:\d+ )?)?greedy ids/)?.[1];
    if (!model) continue;
    const annotations = [...(t.annotations ?? []), ...t.results.flatMap((r) => r.annotations ?? [])];
    const bench = annotations.find((a) => a.type === "bench");
    const speeds = bench ? JSON.parse(bench.description) : {};
    const backend = t.path.at(-1);
    const parity = { expected: "pass", flaky: "pass (flaky)", skipped: "skipped" }[t.status] ?? "FAIL";
    rows.set(`${t.projectName} ${backend} ${model}`, { browser: t.projectName, backend, model, parity, ...speeds });
  }
}
if (rows.size > 0) {
  console.log("\n| browser | backend | model | parity | load s | prefill tok/s | decode tok/s |");
  console.log("|---|---|---|---|---:|---:|---:|");
  for (const r of rows.values()) {
    const backend = r.threads ? `${r.backend} (${r.threads} thread${r.threads > 1 ? "s" : ""})` : r.backend;
    console.log(
      `| ${r.browser} | ${backend} | ${r.model} | ${r.parity} | ${r.loadS ?? ""} | ` +
        `${r.prefillTokPerS ?? ""} | ${r.decodeTokPerS ?? ""} |`,
    );
  }
}
// Inits that did not finish and were tried again (parity.spec.js, start): listed, not hidden.
const initTimeouts = [];
for (const suite of report.suites) {
  for (const t of tests(suite)) {
    for (const a of t.results.flatMap((r) => r.annotations ?? []).concat(t.annotations ?? [])) {
      if (a.type === "init timeout") initTimeouts.push(`${t.projectName} ${t.path.at(-1)} ${t.title}: ${a.description}`);
    }
  }
}
const uniqueTimeouts = [...new Set(initTimeouts)];
if (uniqueTimeouts.length > 0) {
  console.log(`\n${uniqueTimeouts.length} init timeout(s), each tried again on a fresh page:`);
  for (const line of uniqueTimeouts) console.log(`  ${line}`);
}
const { expected, unexpected, flaky, skipped, duration } = report.stats;
console.log(`\nbrowser tests took ${(duration / 60000).toFixed(1)} min; ${skipped} skipped, ${flaky} flaky`);
console.log(`browser: ${expected + flaky} passed, ${unexpected} failed`);
process.exit(unexpected > 0 ? 1 : 0);
