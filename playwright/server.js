// Static server for the browser tests: 127.0.0.1 only, with the headers that make a page
// cross-origin isolated (COOP + COEP), which SharedArrayBuffer and so the threads build need.
// Serves only what the tests load: the built wasm packages, the test pages, lean-js's build
// (packages/lean-js/dist), the HF fixtures, the test models ($LEAN_MODELS, default models/),
// wllama's npm builds and their page (bench-browser.mjs, a benchmark) and, when $LEAN_VITE_APP
// names a built app (scripts/test-vite-app.sh), that app under /app/.
// It counts the requests per path, so a test can tell what came from the network rather than
// from a cache: GET /__stats answers {path: count}, DELETE /__stats resets the counts (and those
// of GET /__bytes: {path: body bytes sent}). Files are served with ETag and Last-Modified, and
// `Range: bytes=N-` (with If-Range) is answered with a 206, as a CDN does.
// Faults, for tests/downloads.spec.js: POST /__faults {path: fault} makes the answers for `path`
// misbehave; DELETE /__faults ends every fault. A fault is {cutAt | stallAt, down, change,
// lieTotal}:
//   cutAt      the first answer whose body reaches this file offset stops there: the connection
//              is destroyed mid-body (once);
//   stallAt    the same, but the connection stays open and silent (a tab closed mid-download);
//   down       after that cut, every request for the path is answered by destroying the
//              connection (the network is gone) until the faults are cleared;
//   change     after that cut, the file has changed: one byte differs, and so does its ETag;
//   lieTotal   after that cut, every 206 claims a total size 1000 bytes larger.
// No dependencies.
//   node playwright/server.js [port]     (env LEAN_TEST_PORT; default 8787)
import { createReadStream } from "node:fs";
import { readFile, stat } from "node:fs/promises";
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
/** Body bytes sent per URL path since then. */
const bytesSent = new Map();

function stats(req, res, counts) {
  if (req.method === "DELETE") {
    requestCounts.clear();
    bytesSent.clear();
  } else if (req.method !== "GET") return reply(res, 405, "method not allowed");
  res.writeHead(200, { ...isolationHeaders, "Content-Type": "application/json" });
  res.end(JSON.stringify(Object.fromEntries(counts)));
}

/** path → {fault, cut: whether the cut happened}. */
const faults = new Map();

async function setFaults(req, res) {
  if (req.method === "DELETE") {
    faults.clear();
    return reply(res, 200, "ok");
  }
  if (req.method !== "POST") return reply(res, 405, "method not allowed");
  let body = "";
  for await (const chunk of req) body += chunk;
  for (const [path, fault] of Object.entries(JSON.parse(body))) faults.set(path, { fault, cut: false });
  return reply(res, 200, "ok");
}

const countBytes = (pathname, n) => bytesSent.set(pathname, (bytesSent.get(pathname) ?? 0) + n);

/**
 * Answers GET/HEAD for `file` (stat `info`): the whole file (200) or, for `Range: bytes=N-`
 * whose If-Range (if any) still names the file, its rest (206); a fault bends the answer.
 */
async function sendFile(req, res, pathname, file, info) {
  const state = faults.get(pathname);
  const fault = state?.fault ?? {};
  if (state?.cut && fault.down) return req.socket.destroy();
  const changed = state?.cut && fault.change;
  const etag = `"${info.size.toString(16)}-${Math.floor(info.mtimeMs).toString(16)}${changed ? "-changed" : ""}"`;
  const headers = {
    ...isolationHeaders,
    "Content-Type": contentTypes[extname(file)] ?? "application/octet-stream",
    "Accept-Ranges": "bytes",
    ETag: etag,
    "Last-Modified": (changed ? new Date(info.mtimeMs + 1000) : info.mtime).toUTCString(),
  };
  const size = info.size;
  let start = 0;
  let status = 200;
  const range = /^bytes=(\d+)-$/.exec(req.headers.range ?? "");
  const ifRange = req.headers["if-range"];
  if (range && (ifRange === undefined || ifRange === etag || ifRange === headers["Last-Modified"])) {
    start = Number(range[1]);
    if (start >= size) {
      res.writeHead(416, { ...headers, "Content-Range": `bytes */${size}` });
      return res.end();
    }
    status = 206;
    const total = state?.cut && fault.lieTotal ? size + 1000 : size;
    headers["Content-Range"] = `bytes ${start}-${size - 1}/${total}`;
  }
  res.writeHead(status, { ...headers, "Content-Length": size - start });
  if (req.method === "HEAD") return res.end();
  // The cut: once, where the body reaches the fault's offset.
  const at = fault.cutAt ?? fault.stallAt;
  const cutAt = state && !state.cut && at > start && at < size ? at : null;
  if (cutAt !== null) state.cut = true;
  const end = (cutAt ?? size) - 1;
  if (changed) {
    // The changed file: its byte 1000 flipped.
    const bytes = await readFile(file);
    bytes[1000] ^= 0xff;
    const body = bytes.subarray(start, end + 1);
    countBytes(pathname, body.length);
    return res.end(body);
  }
  createReadStream(file, { start, end })
    .on("data", (chunk) => countBytes(pathname, chunk.length))
    .on("error", () => res.destroy())
    .on("end", () => {
      // Destroyed once the bytes before the cut are flushed: the client sees a body cut short.
      if (cutAt !== null && fault.stallAt === undefined) res.write("", () => res.destroy());
    })
    .pipe(res, { end: cutAt === null });
}

const server = createServer(async (req, res) => {
  const { pathname } = new URL(req.url, "http://localhost");
  if (pathname === "/__stats") return stats(req, res, requestCounts);
  if (pathname === "/__bytes") return stats(req, res, bytesSent);
  if (pathname === "/__faults") return setFaults(req, res);
  requestCounts.set(pathname, (requestCounts.get(pathname) ?? 0) + 1);
  if (pathname === "/") {
    res.writeHead(302, { ...isolationHeaders, Location: "/page/index.html" });
    return res.end();
  }
  if (req.method !== "GET" && req.method !== "HEAD") return reply(res, 405, "method not allowed");
  const file = fileFor(pathname);
  const info = file && (await stat(file).catch(() => null));
  if (!info?.isFile()) return reply(res, 404, `not found: ${pathname}`);
  return sendFile(req, res, pathname, file, info);
});

server.listen(port, "127.0.0.1", () => {
  console.log(`lean test server: http://127.0.0.1:${port}/ (models: ${roots["/models/"]})`);
});
