#!/usr/bin/env node
// Serves the static site `_site/` (npm run build) with plain Node, no dependencies:
//
//   node scripts/serve-site.mjs [--port 8080] [--host 127.0.0.1] [--dir _site] [--base /]
//                               [--models DIR] [--no-isolation]
//
// Every response carries Cross-Origin-Opener-Policy: same-origin, Cross-Origin-Embedder-Policy:
// require-corp and Cross-Origin-Resource-Policy: same-origin, so the pages are cross-origin
// isolated (SharedArrayBuffer: the threads backend). --no-isolation leaves those headers out, as a
// plain static host does (then `?coi=1` turns on the pages' service worker, coi-sw.js, instead).
// --base /sub/ serves the site under a sub-path. <base>models/ serves lean's test models from
// --models, $LEAN_MODELS or the repository's models/ (so the default model loads offline).
// Port 0 picks a free port; the address goes to stdout: `serve-site: http://…/`.
import { createReadStream, existsSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { dirname, extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const port = Number(option("--port", process.env.PORT ?? 8080));
const host = option("--host", "127.0.0.1");
const root = resolve(option("--dir", join(repo, "_site")));
let base = option("--base", "/");
if (!base.startsWith("/")) base = `/${base}`;
if (!base.endsWith("/")) base += "/";
const modelsDir = resolve(option("--models", process.env.LEAN_MODELS ?? join(repo, "models")));
const isolate = !args.includes("--no-isolation");

if (!existsSync(join(root, "index.html"))) {
  console.error(`serve-site: ${root}/index.html is missing: run npm run build first`);
  process.exit(1);
}

const types = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json; charset=utf-8",
  ".wasm": "application/wasm",
  ".map": "application/json; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".txt": "text/plain; charset=utf-8",
  ".jinja": "text/plain; charset=utf-8",
  ".gguf": "application/octet-stream",
};

const isolation = isolate
  ? {
      "Cross-Origin-Opener-Policy": "same-origin",
      "Cross-Origin-Embedder-Policy": "require-corp",
      "Cross-Origin-Resource-Policy": "same-origin",
    }
  : {};

/** The file a URL path names (under `dir`), or null; directories give their index.html. */
function fileFor(dir, relative) {
  let path;
  try {
    path = resolve(dir, decodeURIComponent(relative));
  } catch {
    return null;
  }
  if (path !== dir && !path.startsWith(dir + sep)) return null;
  try {
    let stat = statSync(path);
    if (stat.isDirectory()) {
      path = join(path, "index.html");
      stat = statSync(path);
    }
    return stat.isFile() ? { path, size: stat.size } : null;
  } catch {
    return null;
  }
}

const server = createServer((req, res) => {
  const { pathname } = new URL(req.url ?? "/", "http://localhost");
  const send = (status, text, extra = {}) => {
    res.writeHead(status, { ...isolation, "Content-Type": "text/plain; charset=utf-8", ...extra });
    res.end(req.method === "HEAD" ? undefined : text);
  };
  if (req.method !== "GET" && req.method !== "HEAD") return send(405, "method not allowed", { Allow: "GET, HEAD" });
  if (pathname === base.slice(0, -1) || (base !== "/" && pathname === "/")) return send(302, "", { Location: base });
  if (!pathname.startsWith(base)) return send(404, `not found: ${pathname}`);
  const relative = pathname.slice(base.length);
  const file = relative.startsWith("models/") ? fileFor(modelsDir, relative.slice("models/".length)) : fileFor(root, relative);
  if (!file) return send(404, `not found: ${pathname}`);
  const ext = extname(file.path);
  res.writeHead(200, {
    ...isolation,
    "Content-Type": types[ext] ?? "application/octet-stream",
    "Content-Length": String(file.size),
    // Pages and the service worker: always revalidated; hashed assets and models may be cached.
    "Cache-Control": ext === ".html" || file.path.endsWith("coi-sw.js") ? "no-cache" : "public, max-age=3600",
    "X-Content-Type-Options": "nosniff",
  });
  if (req.method === "HEAD") return res.end();
  createReadStream(file.path).pipe(res);
});

server.listen(port, host, () => {
  const address = server.address();
  const shown = typeof address === "object" && address ? `http://${host}:${address.port}${base}` : String(address);
  console.log(`serve-site: ${shown} (${root}${isolate ? ", COOP/COEP on" : ", no COOP/COEP: use ?coi=1"})`);
});
