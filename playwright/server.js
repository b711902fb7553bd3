// Static server for the browser tests: 127.0.0.1 only, with the headers that make a page
// cross-origin isolated (COOP + COEP), which SharedArrayBuffer and so the threads build need.
// Serves only what the tests load: the built wasm packages, the test pages, lean-js's build
// (packages/lean-js/dist), the HF fixtures, the test models ($LEAN_MODELS, default models/),
// wllama's npm builds and their page (bench-browser.mjs, a benchmark) and, when $LEAN_VITE_APP
// names a built app (scripts/test-vite-app.sh), that app under /app/.
// It counts the requests per path, so a test can tell what came from the network rather than
// from a cache: GET /__stats answers {path: count}, DELETE /__stats resets the counts. No
// dependencies.
//   node playwright/server.js [port]     (env LEAN_TEST_PORT; default 8787)
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { createServer } from "node:http";
import { dirname, extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const port = Number(process.argv[2] ?? process.env.LEAN_TEST_PORT ?? 8787);

/** URL prefix → directory on disk. */
const roots = {
  "/pkg/": join(repo, "rust/lean-wasm/pkg"),
  "/pkg-mt/": join(repo, "rust/lean-wasm/pkg-mt"),
  "/page/": join(repo, "playwright/page"),
  "/lean-js/": join(repo, "packages/lean-js/dist"),
  "/lean-js-page/": join(repo, "playwright/lean-js-page"),
  "/wllama/": join(repo, "playwright/node_modules/@wllama/wllama/esm"),
  "/wllama-v2/": join(repo, "playwright/node_modules/wllama-v2/esm"),
  "/wllama-page/": join(repo, "playwright/wllama-page"),
  "/fixtures/": join(repo, "fixtures/hf"),
  "/models/": resolve(process.env.LEAN_MODELS ?? join(repo, "models")),
  ...(process.env.LEAN_VITE_APP ? { "/app/": resolve(process.env.LEAN_VITE_APP) } : {}),
};

const contentTypes = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".json": "application/json",
  ".wasm": "application/wasm",
  ".jinja": "text/plain; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
};

const isolationHeaders = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
  "Cross-Origin-Resource-Policy": "same-origin",
  "Cache-Control": "no-store",
};

/** The file a URL path names, or null when it lies outside every root. */
function fileFor(pathname) {
  for (const [prefix, dir] of Object.entries(roots)) {
    if (!pathname.startsWith(prefix)) continue;
    const file = resolve(dir, "." + sep + decodeURIComponent(pathname.slice(prefix.length)));
    return file.startsWith(dir + sep) ? file : null;
  }
  return null;
}

function reply(res, status, text) {
  res.writeHead(status, { ...isolationHeaders, "Content-Type": "text/plain; charset=utf-8" });
  res.end(text);
}

/** Requests per URL path since the start or the last reset (the stats endpoint itself excluded). */
const requestCounts = new Map();

function stats(req, res) {
  if (req.method === "DELETE") requestCounts.clear();
  else if (req.method !== "GET") return reply(res, 405, "method not allowed");
  res.writeHead(200, { ...isolationHeaders, "Content-Type": "application/json" });
  res.end(JSON.stringify(Object.fromEntries(requestCounts)));
}

const server = createServer(async (req, res) => {
  const { pathname } = new URL(req.url, "http://localhost");
  if (pathname === "/__stats") return stats(req, res);
  requestCounts.set(pathname, (requestCounts.get(pathname) ?? 0) + 1);
  if (pathname === "/") {
    res.writeHead(302, { ...isolationHeaders, Location: "/page/index.html" });
    return res.end();
  }
  if (req.method !== "GET" && req.method !== "HEAD") return reply(res, 405, "method not allowed");
  const file = fileFor(pathname);
  const info = file && (await stat(file).catch(() => null));
  if (!info?.isFile()) return reply(res, 404, `not found: ${pathname}`);
  res.writeHead(200, {
    ...isolationHeaders,
    "Content-Type": contentTypes[extname(file)] ?? "application/octet-stream",
    "Content-Length": info.size,
  });
  if (req.method === "HEAD") return res.end();
  createReadStream(file)
    .on("error", () => res.destroy())
    .pipe(res);
});

server.listen(port, "127.0.0.1", () => {
  console.log(`lean test server: http://127.0.0.1:${port}/ (models: ${roots["/models/"]})`);
});
