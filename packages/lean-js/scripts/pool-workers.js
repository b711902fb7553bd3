// lean-js's replacement for wasm-bindgen-rayon's workerHelpers.no-bundler.js in the threads
// build (scripts/copy-wasm.mjs copies it over that file). The original starts each pool thread
// from a Blob of its own module, which then imports the glue by URL: once a bundler has merged
// the glue into lean's worker (Vite's default IIFE workers) that import finds no exports, and in
// `vite dev` the Blob cannot resolve Vite's absolute imports; either way the pool never starts
// and the load hangs. Here each pool thread is another instance of lean's worker script, which
// every bundler emits as a file of its own; worker.ts starts the thread on the init message.

/** The first message of `type` (or of "wasm_bindgen_worker_error", which rejects) from `worker`. */
function reply(worker, type) {
  return new Promise((resolve, reject) => {
    const onMessage = ({ data }) => {
      if (data?.type === type) resolve(data);
      else if (data?.type === "wasm_bindgen_worker_error") reject(new Error(`a thread of the pool failed to start: ${data.message}`));
      else return;
      worker.removeEventListener("message", onMessage);
    };
    worker.addEventListener("message", onMessage);
    worker.addEventListener("error", (event) => reject(new Error(`a thread of the pool failed to start: ${event.message}`)), { once: true });
  });
}

// Kept referenced: Firefox collects workers that share a wasm memory but are not rooted
// (https://bugzilla.mozilla.org/show_bug.cgi?id=1702191).
let poolWorkers;

export async function startWorkers(module, memory, builder) {
  if (builder.numThreads() === 0) throw new Error("num_threads must be > 0");
  const init = { type: "wasm_bindgen_worker_init", module, memory, receiver: builder.receiver() };
  poolWorkers = await Promise.all(
    Array.from({ length: builder.numThreads() }, async () => {
      // This runs in lean's worker: its own script is the pool thread's.
      const worker = new Worker(self.location.href, { type: "module", name: "lean-pool" });
      const ready = reply(worker, "wasm_bindgen_worker_ready");
      worker.postMessage(init);
      await ready;
      return worker;
    }),
  );
  builder.build();
}
