// Where tests find lean's test models: $LEAN_MODELS, default the repository's models/. Missing
// models skip a test, or fail it when $CI is set.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { catalogFiles, type CatalogModel } from "../src/catalog.js";
import type { WireFile, WireModel } from "../src/protocol.js";

export const repo = resolve(import.meta.dirname, "../../..");
export const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");

/** True when `file` (under the models directory) exists; otherwise skips (or fails under CI). */
export function haveModel(file: string, skip: (note: string) => void): boolean {
  if (existsSync(join(modelsDir, file))) return true;
  if (process.env.CI) throw new Error(`test model missing: ${join(modelsDir, file)} (set LEAN_MODELS)`);
  skip(`test model missing: ${join(modelsDir, file)} (set LEAN_MODELS)`);
  return false;
}

/** A catalog model's files under `baseUrl` as the worker's load request takes them. */
export function wireModel(model: CatalogModel, baseUrl: URL): WireModel {
  const files = Object.fromEntries(
    catalogFiles(model, baseUrl).map(({ role, file }) => [
      role,
      { name: file.url, source: { url: file.url }, size: file.size, sha256: file.sha256 } satisfies WireFile,
    ]),
  );
  return { gguf: files.gguf!, tokenizer: files.tokenizer!, tokenizerConfig: files.tokenizerConfig!, chatTemplate: files.chatTemplate! };
}
