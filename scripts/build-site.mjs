#!/usr/bin/env node
// Writes the static site `_site/` (what `npm run build` at the root ends with): the demo's two
// pages with lean-js, its worker and both wasm builds (packages/demo/dist, built with relative
// URLs, so it works from any sub-path), the opt-in isolation service worker (coi-sw.js), and the
// HF fixture the device page's parity self-check compares against. Models are not copied: the
// pages load catalog models from `models/` next to them (scripts/serve-site.mjs serves lean's
// test models there) or from Hugging Face.
import { cpSync, existsSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const dist = join(repo, "packages/demo/dist");
const site = join(repo, "_site");
const FIXTURES = ["smollm2-135m-instruct-q4_0.json"];

if (!existsSync(join(dist, "index.html"))) {
  console.error(`build-site: ${dist}/index.html is missing: run npm run build -w lean-demo first`);
  process.exit(1);
}
rmSync(site, { recursive: true, force: true });
cpSync(dist, site, { recursive: true });
mkdirSync(join(site, "fixtures"), { recursive: true });
for (const name of FIXTURES) cpSync(join(repo, "fixtures/hf", name), join(site, "fixtures", name));
console.log(`build-site: wrote ${site} (serve it with: node scripts/serve-site.mjs)`);
