// The device-check page: what this browser offers lean, and which backend each request picks.
import { chooseBackend, createEngine, detectCapabilities, installedBuilds, type Backend, type BackendChoice } from "lean-js";

const table = (id: string, rows: [string, string][]) => {
  const element = document.getElementById(id) as HTMLTableElement;
  element.replaceChildren(
    ...rows.map(([key, value]) => {
      const row = document.createElement("tr");
      const th = document.createElement("th");
      const td = document.createElement("td");
      th.textContent = key;
      td.textContent = value;
      row.append(th, td);
      return row;
    }),
  );
};
const yesNo = (value: boolean) => (value ? "yes" : "no");

const caps = await detectCapabilities();

table(
  "decisions",
  (["auto", "webgpu", "threads", "simd"] as BackendChoice[]).map((requested) => {
    try {
      const decision = chooseBackend(requested, caps, installedBuilds);
      return [`backend: "${requested}"`, `${decision.backend} — ${decision.reason}`];
    } catch (e) {
      return [`backend: "${requested}"`, e instanceof Error ? `${e.name}: ${e.message}` : String(e)];
    }
  }),
);

// What `auto` (lean-js's default) runs here, and how the page got (or did not get) isolation.
try {
  const auto = chooseBackend("auto", caps, installedBuilds);
  const choice = document.getElementById("auto-choice")!;
  const strong = document.createElement("strong");
  strong.textContent = auto.backend;
  choice.replaceChildren("With backend \"auto\" (the default), lean-js runs ", strong, ` here: ${auto.reason}.`);
  document.body.dataset.autoBackend = auto.backend;
} catch (e) {
  document.getElementById("auto-choice")!.textContent = `No backend can run here: ${e instanceof Error ? e.message : String(e)}`;
}
const coi = (globalThis as { leanCoi?: { status: string; reason: string } }).leanCoi;
document.getElementById("isolation")!.textContent = caps.crossOriginIsolated
  ? coi?.status === "service-worker"
    ? "Cross-origin isolated by the opt-in service worker (coi-sw.js, ?coi=1; ?coi=0 removes it)."
    : "Cross-origin isolated by the server's COOP/COEP headers."
  : "Not cross-origin isolated, so no threads backend: serve the page with Cross-Origin-Opener-Policy: same-origin and " +
    "Cross-Origin-Embedder-Policy: require-corp (scripts/serve-site.mjs does), or open it with ?coi=1 to isolate it " +
    `through a service worker${coi?.status === "failed" ? ` (tried here, and failed: ${coi.reason})` : ""}.`;

table("capabilities", [
  ["Secure context", yesNo(caps.secureContext)],
  ["Cross-origin isolated (COOP + COEP)", yesNo(caps.crossOriginIsolated)],
  ["SharedArrayBuffer", yesNo(caps.sharedArrayBuffer)],
  ["WebAssembly SIMD", yesNo(caps.wasmSimd)],
  ["WebAssembly threads", yesNo(caps.wasmThreads)],
  ["Logical cores", String(caps.hardwareConcurrency)],
  ["WebGPU", caps.webgpu.available ? "adapter found" : `no — ${caps.webgpu.reason}`],
  [
    "Installed lean builds",
    Object.entries(installedBuilds)
      .filter(([, present]) => present)
      .map(([name]) => name)
      .join(", "),
  ],
]);

const webgpu = document.getElementById("webgpu")!;
if (caps.webgpu.available) {
  const { adapter, limits, features } = caps.webgpu;
  const summary = document.createElement("p");
  summary.textContent =
    [adapter.vendor, adapter.architecture, adapter.device, adapter.description].filter(Boolean).join(" · ") +
    (adapter.isFallbackAdapter ? " (software fallback adapter)" : "");
  const limitsTable = document.createElement("table");
  limitsTable.id = "limits";
  const featureList = document.createElement("p");
  featureList.textContent = `Features: ${features.join(", ") || "none"}`;
  webgpu.replaceChildren(summary, featureList, limitsTable);
  table(
    "limits",
    Object.entries(limits).map(([name, value]) => [name, value.toLocaleString("en")]),
  );
} else {
  webgpu.textContent = caps.webgpu.reason;
}
/** The self-check's model and case: short, so that software WebGPU finishes too. */
const CHECK_MODEL = "smollm2-135m-instruct-q4_0";
const CHECK_CASE = "raw_code";
const CHECK_TOKENS = 8;

interface FixtureCase {
  name: string;
  prompt: string;
  prompt_ids: number[];
  greedy_ids: number[];
}

/** Loads the model on `backend`, runs the fixture's prompt greedily, and says whether the ids match. */
async function checkBackend(backend: Backend, reference: FixtureCase): Promise<[string, string]> {
  const started = performance.now();
  const engine = await createEngine({ model: CHECK_MODEL, backend, contextLength: 256, cache: false });
  try {
    const promptIds = await engine.tokenize(reference.prompt);
    const stream = engine.generate(reference.prompt, { maxTokens: CHECK_TOKENS, temperature: 0, stopTokenIds: [] });
    const result = await stream.result;
    const want = reference.greedy_ids.slice(0, CHECK_TOKENS);
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const speed = `prefill ${result.prefillTokensPerSecond.toPrecision(3)} tok/s, decode ${result.decodeTokensPerSecond.toPrecision(3)} tok/s, ${seconds} s in all`;
    if (JSON.stringify(promptIds) !== JSON.stringify(reference.prompt_ids)) {
      return ["mismatch", `prompt ids differ: ${JSON.stringify(promptIds)} vs ${JSON.stringify(reference.prompt_ids)}`];
    }
    const at = want.findIndex((id, i) => result.tokenIds[i] !== id);
    if (at >= 0 || result.tokenIds.length !== want.length) {
      return ["mismatch", `greedy token ${at}: ${result.tokenIds[at]} vs the reference's ${want[at]} (${speed})`];
    }
    return ["match", `${reference.prompt_ids.length} prompt ids and ${CHECK_TOKENS} greedy ids equal transformers' (${speed})`];
  } finally {
    engine.dispose();
  }
}

/**
 * Runs `run` on each backend this page knows, in turn, into table `id`: a row a backend, saying
 * "outcome — detail", with the outcome also on its <tr> as `data-<attribute>` (the table is
 * redrawn as rows come). A backend this browser cannot run is "not available", a throw "error".
 * Returns the outcomes.
 */
async function eachBackend(id: string, attribute: string, run: (backend: Backend) => Promise<[string, string]>): Promise<string[]> {
  const rows: [string, string][] = [];
  const outcomes: string[] = [];
  const render = () => {
    table(id, rows);
    const rendered = (document.getElementById(id) as HTMLTableElement).rows;
    outcomes.forEach((outcome, i) => (rendered[i]!.dataset[attribute] = outcome));
  };
  for (const backend of ["webgpu", "threads", "simd"] as Backend[]) {
    rows.push([backend, "running…"]);
    render();
    let outcome: [string, string];
    try {
      chooseBackend(backend, caps, installedBuilds);
      outcome = await run(backend);
    } catch (e) {
      outcome = e instanceof Error && e.name === "BackendUnavailableError" ? ["not available", e.message] : ["error", String(e)];
    }
    rows[rows.length - 1] = [backend, `${outcome[0]} — ${outcome[1]}`];
    outcomes[rows.length - 1] = outcome[0];
    render();
  }
  return outcomes;
}

async function selfCheck(): Promise<void> {
  const button = document.getElementById("self-check") as HTMLButtonElement;
  button.disabled = true;
  document.body.dataset.selfCheck = "running";
  try {
    const fixture = (await (await fetch(`fixtures/${CHECK_MODEL}.json`)).json()) as { cases: FixtureCase[] };
    const reference = fixture.cases.find((c) => c.name === CHECK_CASE)!;
    const verdicts = await eachBackend("parity", "verdict", (backend) => checkBackend(backend, reference));
    document.body.dataset.selfCheck = verdicts.some((v) => v === "mismatch" || v === "error") ? "failed" : "passed";
  } catch (e) {
    table("parity", [["self-check", e instanceof Error ? `${e.name}: ${e.message}` : String(e)]]);
    document.body.dataset.selfCheck = "failed";
  } finally {
    button.disabled = false;
  }
}
(document.getElementById("self-check") as HTMLButtonElement).onclick = () => void selfCheck();

/**
 * The benchmark's prompt: plain prose, 132 tokens for SmolLM2's tokenizer, run raw (no chat
 * template) so that every backend prefills exactly the same ids.
 */
const BENCH_PROMPT =
  "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lamp, a " +
  "notebook and a thermos of tea. From the gallery he could see the whole bay: the fishing boats " +
  "coming home, the ferry crossing to the island, the gulls settling on the breakwater. He wrote " +
  "down the wind, the state of the sea and the ships that passed, as his father had done before " +
  "him. One night in November a storm rolled in from the west, and the radio crackled with a " +
  "call from a small sailing boat that had lost its mast. The keeper turned the great lens " +
  "toward the rocks and began to signal, slowly and patiently, until";
/** Decoded tokens per backend: `?benchTokens=N` (1–512) shortens or lengthens the run. */
const BENCH_TOKENS = (() => {
  const n = Number(new URLSearchParams(location.search).get("benchTokens"));
  return Number.isInteger(n) && n >= 1 && n <= 512 ? n : 64;
})();
document.getElementById("bench-tokens")!.textContent = String(BENCH_TOKENS);

/** One backend's row: load, prefill and decode, each timed on its own. */
async function benchBackend(backend: Backend): Promise<string> {
  const started = performance.now();
  const engine = await createEngine({ model: CHECK_MODEL, backend, contextLength: 512, cache: false });
  try {
    const loadSeconds = (performance.now() - started) / 1000;
    const result = await engine.generate(BENCH_PROMPT, {
      maxTokens: BENCH_TOKENS,
      temperature: 0,
      stopTokenIds: [],
    }).result;
    const decode =
      result.tokenIds.length > 1 ? `decode ${result.decodeTokensPerSecond.toPrecision(3)} tok/s` : "decode: one token only";
    return (
      `load ${loadSeconds.toFixed(2)} s · prefill ${result.prefillTokensPerSecond.toPrecision(3)} tok/s ` +
      `(${result.promptTokens} tokens) · ${decode} (${result.tokenIds.length} tokens) · ${engine.backend}`
    );
  } finally {
    engine.dispose();
  }
}

async function benchmark(): Promise<void> {
  const button = document.getElementById("benchmark") as HTMLButtonElement;
  button.disabled = true;
  document.body.dataset.benchmark = "running";
  try {
    const outcomes = await eachBackend("bench", "outcome", async (backend) => ["measured", await benchBackend(backend)]);
    document.body.dataset.benchmark = outcomes.includes("error") ? "failed" : "done";
  } finally {
    button.disabled = false;
  }
}
(document.getElementById("benchmark") as HTMLButtonElement).onclick = () => void benchmark();

document.body.dataset.state = "ready";
