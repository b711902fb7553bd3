// The device-check page: what this browser offers lean, and which backend each request picks.
import { chooseBackend, detectCapabilities, installedBuilds, type BackendChoice } from "lean-js";

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
document.body.dataset.state = "ready";
