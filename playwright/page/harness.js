// Main-thread half of the test page: forwards calls to a dedicated Web Worker (worker.js), where
// the engine runs (the threads build's pool may only start from a worker). The Playwright tests
// call `lean(method, args)` through page.evaluate; a worker error rejects with its message.
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
const pending = new Map();
let nextId = 0;

worker.onmessage = ({ data }) => {
  const call = pending.get(data.id);
  pending.delete(data.id);
  if (data.error) call.reject(new Error(`${data.error.name}: ${data.error.message}`));
  else call.resolve(data.result);
};
// A worker script that fails to load or throws at the top level: fail every waiting call.
worker.onerror = (event) => {
  for (const call of pending.values()) call.reject(new Error(`worker failed: ${event.message}`));
  pending.clear();
};

window.lean = (method, args) =>
  new Promise((resolve, reject) => {
    const id = nextId++;
    pending.set(id, { resolve, reject });
    worker.postMessage({ id, method, args });
  });
