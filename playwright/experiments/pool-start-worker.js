// Starts the threads build's pool (pkg-mt, wasm-bindgen-rayon's own helper) and says how long it took.
self.onmessage = async ({ data: { threads } }) => {
  const wasm = await import("/pkg-mt/lean_wasm.js");
  await wasm.default();
  const started = performance.now();
  await wasm.initThreadPool(threads);
  postMessage({ ok: true, ms: Math.round(performance.now() - started) });
};
