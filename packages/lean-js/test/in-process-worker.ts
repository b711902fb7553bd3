// The worker module (src/worker.ts) run in this Node process behind a WorkerLike, as a page runs
// it in a Web Worker, and a fetch that answers file: URLs as a web server would. One worker per
// test file: vitest gives each file its own module graph, and the worker holds one model.
import { createReadStream, existsSync, statSync } from "node:fs";
import { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import type { WorkerLike } from "../src/engine.js";
import type { Reply, Request } from "../src/protocol.js";

/** fetch for file: URLs (the wasm next to its glue, the test models), as a web server would answer. */
export function installFileFetch() {
  const networkFetch = globalThis.fetch;
  globalThis.fetch = (async (input: RequestInfo | URL, init?: RequestInit) => {
    const url = String(input instanceof Request ? input.url : input);
    if (!url.startsWith("file:")) return networkFetch(input, init);
    const path = fileURLToPath(url);
    if (!existsSync(path)) return new Response("not found", { status: 404, statusText: "Not Found" });
    const body = Readable.toWeb(createReadStream(path)) as ReadableStream<Uint8Array>;
    const type = path.endsWith(".wasm") ? "application/wasm" : "application/octet-stream";
    return new Response(body, { headers: { "Content-Type": type, "Content-Length": String(statSync(path).size) } });
  }) as typeof fetch;
}

/**
 * The worker module in this thread, behind a WorkerLike. Messages travel over MessagePorts, as
 * they do between a page and its worker: the worker's yields between tokens must let them in.
 */
export async function inProcessWorker(): Promise<WorkerLike> {
  const scope = globalThis as unknown as {
    postMessage(reply: Reply): void;
    onmessage: ((event: { data: Request }) => void) | null;
  };
  const toWorker = new MessageChannel();
  const toPage = new MessageChannel();
  toWorker.port2.onmessage = (event) => scope.onmessage?.({ data: event.data as Request });
  const worker: WorkerLike = {
    onmessage: null,
    onerror: null,
    postMessage: (request) => toWorker.port1.postMessage(request),
    terminate() {
      toWorker.port1.close();
      toPage.port1.close();
    },
  };
  toPage.port1.onmessage = (event) => worker.onmessage?.(event as MessageEvent<Reply>);
  scope.postMessage = (reply) => toPage.port2.postMessage(reply);
  // The worker yields between tokens through a MessageChannel of its own. Browsers run the
  // tasks of different ports in arrival order (a cancel gets in within a token, as the demo
  // shows in Chromium), but Node handles up to 1000 messages of one port before looking at
  // another, so here the yield goes through setImmediate, which lets every port run in between.
  const realMessageChannel = globalThis.MessageChannel;
  globalThis.MessageChannel = class {
    port1 = { onmessage: null as ((event: unknown) => void) | null };
    port2 = { postMessage: () => setImmediate(() => this.port1.onmessage?.({ data: null })) };
  } as unknown as typeof MessageChannel;
  try {
    await import("../src/worker.js");
  } finally {
    globalThis.MessageChannel = realMessageChannel;
  }
  return worker;
}
