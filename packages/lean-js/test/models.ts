// Where tests find lean's test models: $LEAN_MODELS, default the repository's models/. Missing
// models skip a test, or fail it when $CI is set.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";

export const repo = resolve(import.meta.dirname, "../../..");
export const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");

/** True when `file` (under the models directory) exists; otherwise skips (or fails under CI). */
export function haveModel(file: string, skip: (note: string) => void): boolean {
  if (existsSync(join(modelsDir, file))) return true;
  if (process.env.CI) throw new Error(`test model missing: ${join(modelsDir, file)} (set LEAN_MODELS)`);
  skip(`test model missing: ${join(modelsDir, file)} (set LEAN_MODELS)`);
  return false;
}
