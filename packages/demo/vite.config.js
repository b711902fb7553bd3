// The lean-js demo: a chat page (index.html) and a device-check page (device.html).
// Dev and preview servers send COOP/COEP, so the page is cross-origin isolated (shared memory,
// hence the threads backend), and serve lean's test models under /models/ from the repository's
// models/ (or $LEAN_MODELS): the default model works offline.
import { createReadStream, statSync } from "node:fs";
import { extname, resolve, sep } from "node:path";
import { defineConfig } from "vite";

const modelsDir = resolve(process.env.LEAN_MODELS ?? resolve(import.meta.dirname, "../../models"));
/** The HF reference fixtures: the device page's parity self-check compares against them. */
const fixturesDir = resolve(import.meta.dirname, "../../fixtures/hf");

const isolation = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
};

const contentTypes = {
  ".gguf": "application/octet-stream",
  ".json": "application/json",
  ".jinja": "text/plain; charset=utf-8",
};

/** Serves GET/HEAD /models/<file> from `modelsDir` (and /fixtures/<file> from `fixturesDir`), with its Content-Length (lean-js streams it). */
function serveModels(req, res, next) {
  const { pathname } = new URL(req.url ?? "/", "http://localhost");
  const [prefix, dir] = pathname.startsWith("/models/")
    ? ["/models/", modelsDir]
    : pathname.startsWith("/fixtures/")
      ? ["/fixtures/", fixturesDir]
      : [null, null];
  if (!prefix) return next();
  let file;
  try {
    file = resolve(dir, decodeURIComponent(pathname.slice(prefix.length)));
  } catch {
    file = null;
  }
  let size = -1;
  try {
    if (file?.startsWith(dir + sep) && statSync(file).isFile()) size = statSync(file).size;
  } catch {
    size = -1;
  }
  if (size < 0 || (req.method !== "GET" && req.method !== "HEAD")) {
    res.writeHead(size < 0 ? 404 : 405, { ...isolation, "Content-Type": "text/plain" });
    return res.end(size < 0 ? `not found: ${pathname}` : "method not allowed");
  }
  res.writeHead(200, {
    ...isolation,
    "Cross-Origin-Resource-Policy": "same-origin",
    "Content-Type": contentTypes[extname(file)] ?? "application/octet-stream",
    "Content-Length": String(size),
    "Cache-Control": "no-store",
  });
  if (req.method === "HEAD") return res.end();
  createReadStream(file).pipe(res);
}

export default defineConfig({
  // Relative asset URLs: the built site (dist/, and _site/ at the root) works from any sub-path.
  base: "./",
  server: { headers: isolation },
  preview: { headers: isolation },
  plugins: [
    {
      name: "lean-test-models",
      configureServer: (server) => void server.middlewares.use(serveModels),
      configurePreviewServer: (server) => void server.middlewares.use(serveModels),
    },
  ],
  build: {
    target: "es2022",
    rolldownOptions: {
      input: {
        chat: resolve(import.meta.dirname, "index.html"),
        device: resolve(import.meta.dirname, "device.html"),
      },
    },
  },
});
