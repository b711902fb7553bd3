/**
 * Model files as the caller gives them (URLs, Files, Blobs, bytes) turned into the worker's
 * {@link WireFile}s: the main model's (index.ts) and a draft model's (`Engine.loadDraft`).
 */
import { catalog, catalogFiles, findModel } from "./catalog.js";
import type { WireFile } from "./protocol.js";

/** A model file: a URL (absolute, or relative to the page), a File/Blob, or its bytes. */
export type FileInput = string | URL | Blob | ArrayBuffer | Uint8Array;

/** The page's URL, against which relative model URLs resolve. */
function pageUrl(): string | undefined {
  const g = globalThis as { document?: { baseURI?: string }; location?: { href?: string } };
  return g.document?.baseURI ?? g.location?.href;
}

export function absoluteUrl(url: string | URL): string {
  try {
    return new URL(url, pageUrl()).href;
  } catch {
    throw new TypeError(`not a valid URL: ${String(url)}`);
  }
}

export function defaultModelBaseUrl(options: { modelBaseUrl?: string | URL }): string {
  return absoluteUrl(options.modelBaseUrl ?? "models/");
}

/** A file as the worker takes it; `field` names it in errors. */
export function wireFile(input: FileInput, what: string, field = `model.${what}`): WireFile {
  if ((typeof input === "string" && input !== "") || input instanceof URL) {
    const url = absoluteUrl(input);
    return { name: url, source: { url }, size: null, sha256: null };
  }
  if (input instanceof Blob) {
    const name = "name" in input && typeof input.name === "string" ? input.name : `${what} (Blob)`;
    return { name, source: { blob: input }, size: null, sha256: null };
  }
  if (input instanceof ArrayBuffer) {
    return { name: `${what} (ArrayBuffer)`, source: { bytes: input }, size: null, sha256: null };
  }
  if (input instanceof Uint8Array) {
    const whole =
      input.buffer instanceof ArrayBuffer && input.byteOffset === 0 && input.byteLength === input.buffer.byteLength;
    const bytes = whole ? (input.buffer as ArrayBuffer) : input.slice().buffer;
    return { name: `${what} (Uint8Array)`, source: { bytes }, size: null, sha256: null };
  }
  throw new TypeError(
    `${field} must be a URL (string or URL), File, Blob, ArrayBuffer or Uint8Array, got ${describeValue(input)}`,
  );
}

export function describeValue(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "string") return value === "" ? "an empty string" : JSON.stringify(value);
  if (typeof value !== "object") return typeof value;
  return (value as object).constructor?.name ?? "an object";
}

/** Whether `v` is a file itself rather than a spec object holding files. */
export function isFileInput(v: unknown): boolean {
  return v instanceof URL || v instanceof Blob || v instanceof ArrayBuffer || ArrayBuffer.isView(v);
}

/**
 * A draft model for speculative decoding (`speculative: { draft: n }`): a smaller model with the
 * engine's vocabulary. A catalog id (its GGUF, checked against the catalog's size and sha256;
 * the target's tokenizer serves both), or `{ gguf, sha256? }`: the GGUF as a URL, File, Blob,
 * ArrayBuffer or Uint8Array, and the SHA-256 (hex) it must have.
 */
export type DraftModelSpec = string | { gguf: FileInput; sha256?: string };

const DRAFT_SPEC = "a catalog id or { gguf, sha256? }";

/** The draft model's GGUF as the worker takes it; a malformed spec is a TypeError. */
export function draftWireFile(draft: DraftModelSpec, modelBaseUrl?: string | URL): WireFile {
  if (typeof draft === "string") {
    const entry = findModel(draft);
    if (!entry) {
      throw new TypeError(
        `unknown draft model id '${draft}' (known: ${catalog.map((m) => m.id).join(", ")}); ` +
          `for a GGUF file give draft: { gguf: "${draft}" }`,
      );
    }
    const { file } = catalogFiles(entry, defaultModelBaseUrl({ modelBaseUrl }))[0]!;
    return { name: file.url, source: { url: file.url }, size: file.size, sha256: file.sha256 };
  }
  if (typeof draft !== "object" || draft === null || isFileInput(draft)) {
    throw new TypeError(`draft must be ${DRAFT_SPEC}, got ${describeValue(draft)}`);
  }
  const unknown = Object.keys(draft).filter((key) => key !== "gguf" && key !== "sha256");
  if (unknown.length > 0) {
    throw new TypeError(`unknown field ${unknown.map((k) => `'${k}'`).join(", ")} in draft (known: gguf, sha256)`);
  }
  if (draft.gguf === undefined || draft.gguf === null || draft.gguf === "") {
    throw new TypeError(`draft.gguf is required: draft must be ${DRAFT_SPEC}`);
  }
  const { sha256 } = draft;
  if (sha256 !== undefined && sha256 !== null && !(typeof sha256 === "string" && /^[0-9a-f]{64}$/i.test(sha256))) {
    throw new TypeError(`draft.sha256 must be 64 hex digits, got ${describeValue(sha256)}`);
  }
  return { ...wireFile(draft.gguf, "draft", "draft.gguf"), sha256: sha256?.toLowerCase() ?? null };
}
