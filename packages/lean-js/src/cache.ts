/**
 * Reading model files (URL, Blob or bytes) chunk by chunk, with Cache Storage for downloads.
 *
 * A download survives the network:
 * - within one load, a transfer that fails after N bytes is retried (a few times, with a short
 *   backoff) with `Range: bytes=N-` (and `If-Range`, same-origin): a 206 from byte N continues
 *   the same stream, so the consumer never sees a restart. A 200 instead (no Range support) is
 *   the whole file again: its first N bytes must hash to what was already delivered, else it is
 *   an error ("the file changed during the download"), never a mixed file. A changed validator
 *   (ETag, Last-Modified), a wrong Content-Range, a length that disagrees: clear errors.
 * - across loads, the download is stored as it streams in parts of {@link PART_BYTES} (Cache
 *   Storage entries `<url>?lean-part=<i>`) with a small JSON manifest (`<url>?lean-part=manifest`:
 *   size, validator, expected sha256, parts done). A load that finds a partial download asks the
 *   server for the rest (Range + If-Range); when the server confirms the file is the same (206 from
 *   the first missing byte) it streams the kept parts from the cache, then the network. Otherwise
 *   the parts are dropped and the download starts over.
 * - the file counts as cached only once the manifest says `complete`, written after the size and
 *   sha256 checked out; a failed check removes the manifest and every part. A legacy whole entry
 *   (key `<url>`, lean-js before parts) is still read.
 * Failing to cache (quota, no Cache Storage) is a warning: the model still runs.
 *
 * The SHA-256 is the wasm module's (rust/lean-wasm's `Sha256`, RustCrypto's sha2), given in
 * {@link FileDeps}.
 */
import { ErrorName, leanError } from "./errors.js";
import type { WireFile } from "./protocol.js";

export const DEFAULT_CACHE_NAME = "lean-models-v1";
/** Bytes of one stored part of a download (the last part of a file is shorter). */
export const PART_BYTES = 16 * 1024 * 1024;
/**
 * Waits before each retry of a failed transfer; a transfer that failed once more than these
 * without a byte of progress in between ends the load.
 */
const RETRY_DELAYS_MS = [250, 1000, 3000];
/**
 * A request that brings no byte for this long has stalled (a connection a proxy or a sleeping
 * network left open): it is given up and, mid-body, retried like a broken one.
 */
const STALL_MS = 30_000;

/** Headers of a legacy whole-file cache entry besides Content-Length. */
const SHA256_HEADER = "X-Lean-Sha256";
const STORED_HEADER = "X-Lean-Stored";
const PART_PARAM = "lean-part";

/** A streaming SHA-256 (rust/lean-wasm's `Sha256`). */
export interface Sha256Hasher {
  update(chunk: Uint8Array): void;
  /** An independent copy of the state. */
  fork(): Sha256Hasher;
  /** The digest of the bytes so far (lowercase hex); the hash can go on after it. */
  hex(): string;
  free(): void;
}

export interface FileDeps {
  fetch: typeof fetch;
  /** `globalThis.caches`; undefined outside secure contexts. */
  caches: CacheStorage | undefined;
  /** A new SHA-256 (the worker's: the wasm module's `Sha256`). */
  sha256(): Sha256Hasher;
  /** Waits before a retry; default setTimeout. */
  sleep?(ms: number): Promise<void>;
}

export interface OpenedFile {
  /** The byte size, known before reading (from the catalog, the cache entry, Content-Length or the Blob). */
  size: number | null;
  source: "network" | "cache" | "local";
  /**
   * Streams the bytes to `onChunk` (each chunk may be kept or consumed at once), then verifies
   * them; a download is then committed to the cache. Rejects with a ModelFileError on a network
   * failure (after retries) or a failed check.
   */
  read(onChunk: (chunk: Uint8Array) => void, onProgress?: (loaded: number) => void): Promise<void>;
}

export interface OpenOptions {
  /** Cache Storage name; null: no caching. */
  cacheName: string | null;
  warn(message: string): void;
  /** Bytes per stored part (tests); default {@link PART_BYTES}. */
  partBytes?: number;
  /** The waits before retries (tests); default {@link RETRY_DELAYS_MS}. */
  retryDelaysMs?: readonly number[];
  /** How long a request may bring no byte (tests); default {@link STALL_MS}. */
  stallMs?: number;
}

const fileError = (message: string) => leanError(ErrorName.ModelFile, message);
const describe = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** Errors that mean the bytes are wrong (not merely missing): the stored parts go too. */
const corruptErrors = new WeakSet<object>();
function corrupt(message: string): Error {
  const error = fileError(message);
  corruptErrors.add(error);
  return error;
}

/** A transfer that broke off (or could not start): retried from the byte it reached. */
class TransferFailure extends Error {}

export async function openModelFile(
  file: WireFile,
  deps: FileDeps,
  options: OpenOptions,
): Promise<OpenedFile> {
  const { source } = file;
  if ("bytes" in source) return local(file, source.bytes.byteLength, () => bytesStream(source.bytes), deps);
  if ("blob" in source) return local(file, source.blob.size, () => source.blob.stream(), deps);
  return openUrl(file, source.url, deps, options);
}

function local(file: WireFile, size: number, stream: () => ReadableStream<Uint8Array>, deps: FileDeps): OpenedFile {
  if (file.size !== null && size !== file.size) {
    throw fileError(`${file.name}: ${size} bytes, expected ${file.size}`);
  }
  return {
    size,
    source: "local",
    read: (onChunk, onProgress) => pump(file, stream(), deps, onChunk, onProgress),
  };
}

/** Views of `bytes` in bounded chunks (no copy), as a download would deliver them. */
function bytesStream(bytes: ArrayBuffer): ReadableStream<Uint8Array> {
  const chunk = 4 * 1024 * 1024;
  let at = 0;
  return new ReadableStream({
    pull(controller) {
      if (at >= bytes.byteLength) return controller.close();
      const length = Math.min(chunk, bytes.byteLength - at);
      controller.enqueue(new Uint8Array(bytes, at, length));
      at += length;
    },
  });
}

async function openCache(deps: FileDeps, options: OpenOptions): Promise<Cache | null> {
  if (options.cacheName === null) return null;
  if (!deps.caches) {
    options.warn(
      "Cache Storage is unavailable (it needs a secure context: https or localhost): the model is not cached",
    );
    return null;
  }
  try {
    return await deps.caches.open(options.cacheName);
  } catch (e) {
    options.warn(`Cache Storage cannot be opened (${describe(e)}): the model is not cached`);
    return null;
  }
}

// --- stored parts ---------------------------------------------------------------------------

/** What is stored of a download besides its parts (JSON, at `partKey(url, "manifest")`). */
interface Manifest {
  lean: 1;
  /** Total bytes; null while unknown (no Content-Length nor catalog size). */
  size: number | null;
  /** The server's validators, for If-Range and to tell a changed file. */
  etag: string | null;
  lastModified: string | null;
  /** The sha256 expected (the catalog's), or, once complete, the verified digest. */
  sha256: string | null;
  partBytes: number;
  /** Parts stored, from the first: each partBytes long but a complete file's last. */
  parts: number;
  complete: boolean;
  /** ISO date: when the download started, or (complete) when it was committed. */
  storedAt: string;
}

/** The cache key of a part (or the manifest) of `url`'s download. */
export function partKey(url: string, part: number | "manifest"): string {
  const base = url.split("#")[0]!;
  return `${base}${base.includes("?") ? "&" : "?"}${PART_PARAM}=${part}`;
}

const manifestSuffix = new RegExp(`[?&]${PART_PARAM}=manifest$`);
const partSuffix = new RegExp(`[?&]${PART_PARAM}=\\d+$`);

async function readManifest(cache: Cache, url: string): Promise<Manifest | null> {
  try {
    const response = await cache.match(partKey(url, "manifest"));
    if (!response) return null;
    const m = (await response.json()) as Partial<Manifest>;
    const count = (n: unknown) => typeof n === "number" && Number.isSafeInteger(n) && n >= 0;
    if (m.lean !== 1 || !count(m.parts) || !count(m.partBytes) || m.partBytes === 0) return null;
    if (m.size !== null && !count(m.size)) return null;
    return m as Manifest;
  } catch {
    return null;
  }
}

async function writeManifest(cache: Cache, url: string, manifest: Manifest): Promise<void> {
  await cache.put(
    partKey(url, "manifest"),
    new Response(JSON.stringify(manifest), { headers: { "Content-Type": "application/json" } }),
  );
}

/**
 * Deletes `url`'s manifest and parts (the parts listed, and any after them up to the first one
 * missing: a part whose storing was under way); true when something was deleted.
 */
async function dropParts(cache: Cache, url: string, listed: number | null = null): Promise<boolean> {
  const parts = listed ?? (await readManifest(cache, url))?.parts ?? 0;
  let deleted = await cache.delete(partKey(url, "manifest")).catch(() => false);
  for (let i = 0; ; i++) {
    const gone = await cache.delete(partKey(url, i)).catch(() => false);
    deleted ||= gone;
    if (!gone && i >= parts) break;
  }
  return deleted;
}

/**
 * Stores a download in parts as it streams: each part is a Cache Storage entry written from a
 * stream (the put completes once the part is whole); after each part the manifest counts it.
 * A failure (quota) stops the storing and, at the end, removes what was stored, with a warning.
 */
class PartWriter {
  #cache: Cache;
  #url: string;
  #name: string;
  #options: OpenOptions;
  manifest: Manifest;
  /** The file offset the next byte written must have. */
  #next: number;
  #controller: ReadableStreamDefaultController<Uint8Array> | null = null;
  /** Bytes in the part being written. */
  #inPart = 0;
  /** Every put, in order: the manifest is written after the parts it counts. */
  #chain: Promise<void>;
  failure: unknown = null;
  /** Writing stopped (a put cancelled its stream); `failure` comes with that put's rejection. */
  #stopped = false;
  /** Parts started but not (yet) counted by the manifest. */
  #pendingParts = 0;
  /** Each part's put: whether it stored the part. */
  #puts: Promise<boolean>[] = [];
  /** A part was not stored: the ones after it cannot count either. */
  #gap = false;

  constructor(cache: Cache, url: string, name: string, manifest: Manifest, options: OpenOptions) {
    this.#cache = cache;
    this.#url = url;
    this.#name = name;
    this.#options = options;
    this.manifest = manifest;
    this.#next = manifest.parts * manifest.partBytes;
    this.#chain = writeManifest(cache, url, { ...manifest }).catch((e: unknown) => this.#fail(e));
  }

  #fail(e: unknown): void {
    this.failure ??= e;
    try {
      this.#controller?.error(e);
    } catch {
      // Already closed or errored.
    }
    this.#controller = null;
  }

  /** `chunk` holds the bytes at offset `at` of the file (always the next ones). */
  write(at: number, chunk: Uint8Array): void {
    if (this.failure !== null || this.#stopped) return;
    if (at !== this.#next) return this.#fail(new Error(`internal: part write at ${at}, expected ${this.#next}`));
    const { partBytes } = this.manifest;
    let offset = 0;
    while (offset < chunk.length && this.failure === null && !this.#stopped) {
      if (!this.#controller) this.#startPart();
      const take = Math.min(chunk.length - offset, partBytes - this.#inPart);
      try {
        this.#controller!.enqueue(chunk.subarray(offset, offset + take));
      } catch {
        // The put gave up (e.g. quota) and cancelled the stream: its rejection says why.
        this.#stopped = true;
        this.#controller = null;
        return;
      }
      offset += take;
      this.#inPart += take;
      this.#next += take;
      if (this.#inPart === partBytes) this.#endPart();
    }
  }

  #startPart(): void {
    const part = this.manifest.parts + (this.#pendingParts++);
    const body = new ReadableStream<Uint8Array>({
      start: (c) => {
        this.#controller = c;
      },
    });
    const put = this.#cache.put(
      partKey(this.#url, part),
      new Response(body, { headers: { "Content-Type": "application/octet-stream" } }),
    );
    // Caught at once (an unhandled rejection otherwise); awaited in order below.
    const stored = put.then(
      () => true,
      (e: unknown) => {
        this.#fail(e);
        return false;
      },
    );
    this.#puts.push(stored);
    this.#inPart = 0;
  }

  #endPart(): void {
    try {
      this.#controller?.close();
    } catch (e) {
      this.#fail(e);
    }
    this.#controller = null;
    const stored = this.#puts[this.#puts.length - 1]!;
    this.#chain = this.#chain.then(async () => {
      this.#gap ||= !(await stored);
      if (this.#gap) return;
      this.manifest.parts++;
      this.#pendingParts--;
      await writeManifest(this.#cache, this.#url, { ...this.manifest }).catch((e: unknown) => this.#fail(e));
    });
  }

  /** Stores the last part and commits the verified file: `sha256` is its digest. */
  async commit(size: number, sha256: string): Promise<void> {
    if (this.failure === null && !this.#stopped && this.#controller) this.#endPart();
    await this.#chain;
    await Promise.all(this.#puts);
    if (this.failure === null && this.#stopped) this.failure = new Error("a part could not be stored");
    if (this.failure === null) {
      try {
        await writeManifest(this.#cache, this.#url, {
          ...this.manifest,
          size,
          sha256,
          complete: true,
          storedAt: new Date().toISOString(),
        });
      } catch (e) {
        this.failure = e;
      }
    }
    if (this.failure !== null) await this.#notCached();
  }

  /**
   * Stops storing: the part in progress is lost. `keep`: the parts stored stay for the next
   * load to resume from; otherwise everything goes.
   */
  async abandon(reason: unknown, keep: boolean): Promise<void> {
    this.#fail(reason);
    await this.#chain;
    await Promise.all(this.#puts);
    if (!keep) await dropParts(this.#cache, this.#url, this.manifest.parts + this.#pendingParts);
  }

  async #notCached(): Promise<void> {
    await Promise.all(this.#puts);
    await dropParts(this.#cache, this.#url, this.manifest.parts + this.#pendingParts);
    const failure = this.failure;
    this.#options.warn(
      `${this.#name} is not cached (${describe(failure)}${
        failure instanceof Error && failure.name === "QuotaExceededError" ? ": storage quota exceeded" : ""
      }); it still runs, but will be downloaded again next time`,
    );
  }

  /** Bytes stored for good (counted by the manifest) once the puts under way completed. */
  async keptBytes(): Promise<number> {
    await this.#chain;
    return this.manifest.parts * this.manifest.partBytes;
  }
}

// --- HTTP -----------------------------------------------------------------------------------

function headerNumber(response: Response, name: string): number | null {
  const value = response.headers.get(name);
  const n = value === null ? NaN : Number(value);
  return Number.isSafeInteger(n) && n >= 0 ? n : null;
}

/** `bytes first-last/total` (total may be `*`); null when absent (a cross-origin response hides it). */
function contentRange(response: Response): { first: number; last: number; total: number | null } | "bad" | null {
  const value = response.headers.get("Content-Range");
  if (value === null) return null;
  const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(value.trim());
  if (!m) return "bad";
  return { first: Number(m[1]), last: Number(m[2]), total: m[3] === "*" ? null : Number(m[3]) };
}

interface Validator {
  etag: string | null;
  lastModified: string | null;
}

function validatorOf(response: Response): Validator {
  return { etag: response.headers.get("ETag"), lastModified: response.headers.get("Last-Modified") };
}

/** A validator of `now` that differs from the one `before` had (a changed file), or null. */
function changedValidator(before: Validator, now: Validator): string | null {
  if (before.etag !== null && now.etag !== null && before.etag !== now.etag) {
    return `ETag ${before.etag} became ${now.etag}`;
  }
  if (before.lastModified !== null && now.lastModified !== null && before.lastModified !== now.lastModified) {
    return `Last-Modified ${before.lastModified} became ${now.lastModified}`;
  }
  return null;
}

/** What If-Range can carry: a strong ETag, else Last-Modified. */
function ifRange(v: Validator): string | null {
  if (v.etag !== null && !v.etag.startsWith("W/")) return v.etag;
  return v.lastModified;
}

/**
 * If-Range is not a CORS-safelisted header: cross-origin it would need a preflight that a CDN
 * may refuse (and then every resume would fail). Cross-origin the 206's validator is compared
 * instead. Outside a browser (no `location`) there is no CORS.
 */
function sameOrigin(url: string): boolean {
  const here = (globalThis as { location?: { href: string; origin: string } }).location;
  if (!here) return true;
  try {
    return new URL(url, here.href).origin === here.origin;
  } catch {
    return false;
  }
}

/** A body that the server compressed: its Content-Length and byte ranges are not the file's. */
const encoded = (response: Response) => {
  const encoding = response.headers.get("Content-Encoding");
  return encoding !== null && encoding.trim().toLowerCase() !== "identity";
};

const retryableStatus = (status: number) => status === 408 || status === 429 || status >= 500;

/** Ends the connection of a response from {@link watchedFetch}. */
const aborts = new WeakMap<Response, () => void>();

/**
 * fetch, given up when no answer comes within `stallMs`; the response's connection can be ended
 * later through `aborts` (a stalled body).
 */
async function watchedFetch(
  deps: FileDeps,
  url: string,
  headers: Record<string, string>,
  stallMs: number,
): Promise<Response> {
  const controller = new AbortController();
  let stalled = false;
  const timer = setTimeout(() => {
    stalled = true;
    controller.abort();
  }, stallMs);
  try {
    const response = await deps.fetch(url, { headers, signal: controller.signal });
    aborts.set(response, () => controller.abort());
    return response;
  } catch (e) {
    throw stalled ? new Error(`no answer in ${stallMs / 1000} s`) : e;
  } finally {
    clearTimeout(timer);
  }
}

// --- URLs -----------------------------------------------------------------------------------

async function openUrl(
  file: WireFile,
  url: string,
  deps: FileDeps,
  options: OpenOptions,
): Promise<OpenedFile> {
  const cache = await openCache(deps, options);
  let manifest: Manifest | null = null;
  if (cache) {
    const legacy = await openLegacyEntry(file, url, cache, deps, options);
    if (legacy) return legacy;
    manifest = await readManifest(cache, url);
    if (manifest?.complete) {
      if (file.size === null || manifest.size === file.size) return cachedParts(file, url, cache, manifest, deps);
      await dropParts(cache, url, manifest.parts);
      options.warn(`${file.name}: the cached copy has ${manifest.size} bytes, not ${file.size}: downloading it again`);
      manifest = null;
    } else if (manifest && !resumable(manifest, file)) {
      await dropParts(cache, url, manifest.parts);
      manifest = null;
    }
  }

  const stallMs = options.stallMs ?? STALL_MS;
  const fetchFile = async (headers: Record<string, string>) => {
    try {
      return await watchedFetch(deps, url, headers, stallMs);
    } catch (e) {
      throw fileError(`${file.name}: cannot fetch ${url} (${describe(e)})`);
    }
  };
  // A partial download: the rest, if the server confirms the file did not change.
  let kept = 0;
  let response: Response | null = null;
  if (cache && manifest && manifest.parts > 0) {
    const from = manifest.parts * manifest.partBytes;
    const validator = ifRange(manifest);
    const headers: Record<string, string> = { Range: `bytes=${from}-` };
    if (validator !== null && sameOrigin(url)) headers["If-Range"] = validator;
    const answer = await fetchFile(headers);
    const range = contentRange(answer);
    const length = headerNumber(answer, "Content-Length");
    // Without Content-Range (hidden cross-origin unless exposed) the length tells the total.
    const total = range === null ? (length === null ? null : from + length) : range === "bad" ? null : range.total;
    if (
      answer.status === 206 &&
      answer.body &&
      (range === null || (range !== "bad" && range.first === from)) &&
      total === manifest.size &&
      changedValidator(manifest, validatorOf(answer)) === null
    ) {
      kept = from;
      response = answer;
    } else {
      // Changed, or no Range support: start over (with this answer when it is the whole file).
      await dropParts(cache, url, manifest.parts);
      manifest = null;
      if (answer.status === 200) response = answer;
      else await answer.body?.cancel().catch(() => undefined);
    }
  } else if (cache && manifest) {
    await dropParts(cache, url, manifest.parts);
    manifest = null;
  }
  response ??= await fetchFile({});
  if (!response.ok || !response.body) {
    throw fileError(`${file.name}: ${url} answered HTTP ${response.status} ${response.statusText}`.trim());
  }
  const first = response;
  const validator: Validator = manifest ?? validatorOf(first);
  const size =
    file.size ?? manifest?.size ?? (encoded(first) ? null : headerNumber(first, "Content-Length"));
  return {
    size,
    source: "network",
    read: (onChunk, onProgress) =>
      download(
        { file, url, deps, options, cache, manifest, kept, first, validator, size },
        onChunk,
        onProgress,
      ),
  };
}

/** A partial download can resume when its size is known and a changed file can be told. */
function resumable(m: Manifest, file: WireFile): boolean {
  if (m.size === null || (file.size !== null && m.size !== file.size)) return false;
  if (file.sha256 !== null && m.sha256 !== null && m.sha256 !== file.sha256.toLowerCase()) return false;
  return m.etag !== null || m.lastModified !== null || m.sha256 !== null || file.sha256 !== null;
}

async function openLegacyEntry(
  file: WireFile,
  url: string,
  cache: Cache,
  deps: FileDeps,
  options: OpenOptions,
): Promise<OpenedFile | null> {
  const hit = await cache.match(url).catch(() => undefined);
  if (!hit?.body) return null;
  const stored = headerNumber(hit, "Content-Length");
  if (file.size === null || stored === file.size) {
    const body = hit.body;
    return {
      size: stored ?? file.size,
      source: "cache",
      read: async (onChunk, onProgress) => {
        try {
          // Verified when stored: the size is checked again, the (slow) hash is not.
          await pump({ ...file, size: stored ?? file.size, sha256: null }, body, deps, onChunk, onProgress);
        } catch (e) {
          await cache.delete(url).catch(() => false);
          throw fileError(`${describe(e)} (the cached copy was removed: load the model again)`);
        }
      },
    };
  }
  await cache.delete(url).catch(() => false);
  options.warn(`${file.name}: the cached copy has ${stored} bytes, not ${file.size}: downloading it again`);
  return null;
}

/** A complete download from its parts: verified when stored, so only the sizes are checked. */
function cachedParts(file: WireFile, url: string, cache: Cache, manifest: Manifest, deps: FileDeps): OpenedFile {
  const size = manifest.size!;
  return {
    size,
    source: "cache",
    read: async (onChunk, onProgress) => {
      let at = 0;
      try {
        for (let i = 0; i < manifest.parts; i++) {
          const part = await cache.match(partKey(url, i));
          if (!part?.body) throw new Error(`part ${i} of the cached copy is missing`);
          const length = Math.min(manifest.partBytes, size - at);
          const before = at;
          const progress = onProgress && ((loaded: number) => onProgress(before + loaded));
          const expected = { ...file, name: `${file.name} (part ${i})`, size: length, sha256: null };
          await pump(expected, part.body, deps, onChunk, progress);
          at += length;
        }
        if (at !== size) throw new Error(`the cached copy has ${at} bytes, not ${size}`);
      } catch (e) {
        await dropParts(cache, url, manifest.parts);
        throw fileError(`${file.name}: ${describe(e)} (the cached copy was removed: load the model again)`);
      }
    },
  };
}

interface Download {
  file: WireFile;
  url: string;
  deps: FileDeps;
  options: OpenOptions;
  cache: Cache | null;
  /** The partial download being resumed, or null. */
  manifest: Manifest | null;
  /** Bytes that the manifest's parts hold (`first` starts there). */
  kept: number;
  first: Response;
  validator: Validator;
  size: number | null;
}

/**
 * Streams the kept parts (if any), then the network from where they end, retrying a transfer
 * that fails; stores the parts; verifies; commits.
 */
async function download(
  d: Download,
  onChunk: (chunk: Uint8Array) => void,
  onProgress: ((loaded: number) => void) | undefined,
): Promise<void> {
  const { file, url, deps, options, cache, size } = d;
  const partBytes = d.manifest?.partBytes ?? options.partBytes ?? PART_BYTES;
  const hash = deps.sha256();
  let at = 0;
  let writer: PartWriter | null = null;
  const deliver = (chunk: Uint8Array) => {
    if (size !== null && at + chunk.length > size) {
      throw corrupt(`${file.name}: more than the expected ${size} bytes`);
    }
    hash.update(chunk);
    writer?.write(at, chunk);
    at += chunk.length;
    onChunk(chunk);
    onProgress?.(at);
  };
  try {
    // The kept parts: a missing one ends them (the network takes over from its first byte).
    if (cache && d.manifest) {
      for (let i = 0; i < d.manifest.parts; i++) {
        const part = await cache.match(partKey(url, i)).catch(() => undefined);
        if (!part?.body) break;
        const before = at;
        const damaged = (why: string) =>
          corrupt(`${file.name}: the kept part ${i} of the download ${why} (it was removed: load the model again)`);
        try {
          await readBody(part.body, deliver);
        } catch (e) {
          if (corruptErrors.has(e as object)) throw e;
          throw damaged(`cannot be read (${describe(e)})`);
        }
        if (at - before !== partBytes) throw damaged(`has ${at - before} bytes, not ${partBytes}`);
      }
    }
    if (cache) {
      const manifest: Manifest = {
        lean: 1,
        size,
        etag: d.validator.etag,
        lastModified: d.validator.lastModified,
        sha256: file.sha256?.toLowerCase() ?? null,
        partBytes,
        parts: at / partBytes,
        complete: false,
        storedAt: new Date().toISOString(),
      };
      writer = new PartWriter(cache, url, file.name, manifest, options);
    }

    await fromNetwork(d, () => at, deliver, hash);

    if (file.size !== null && at !== file.size) {
      throw corrupt(`${file.name}: ${at} bytes, expected ${file.size}`);
    }
    const actual = hash.hex();
    if (file.sha256 !== null && actual !== file.sha256.toLowerCase()) {
      throw corrupt(`${file.name}: sha256 ${actual}, expected ${file.sha256} (a corrupt or changed file)`);
    }
    await writer?.commit(at, actual);
  } catch (e) {
    const keep = !corruptErrors.has(e as object);
    if (writer) await writer.abandon(e, keep);
    else if (cache && !keep) await dropParts(cache, url);
    if (keep && writer && e instanceof Error && e.name === ErrorName.ModelFile) {
      const stored = await writer.keptBytes();
      if (stored > 0) {
        e.message += ` (${stored} bytes are kept in Cache Storage: loading the model again resumes from there)`;
      }
    }
    throw e;
  } finally {
    hash.free();
  }
}

/**
 * Reads `body` to its end into `deliver`; returns the bytes read. A read that fails is a
 * TransferFailure; so is one that waits more than `stallMs` (then `abort` ends the connection).
 */
async function readBody(
  body: ReadableStream<Uint8Array>,
  deliver: (chunk: Uint8Array) => void,
  stall?: { ms: number; abort: (() => void) | undefined },
): Promise<number> {
  const reader = body.getReader();
  let read = 0;
  try {
    for (;;) {
      let next: ReadableStreamReadResult<Uint8Array>;
      let stalled = false;
      const timer =
        stall &&
        setTimeout(() => {
          stalled = true;
          stall.abort?.();
          // Ends the pending read (done) whether or not the fetch heeds its signal.
          reader.cancel().catch(() => undefined);
        }, stall.ms);
      try {
        next = await reader.read();
      } catch (e) {
        throw new TransferFailure(stalled ? `no data for ${stall!.ms / 1000} s` : describe(e));
      } finally {
        clearTimeout(timer);
      }
      if (stalled) throw new TransferFailure(`no data for ${stall!.ms / 1000} s`);
      if (next.done) return read;
      read += next.value.length;
      deliver(next.value);
    }
  } finally {
    reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/**
 * The network's bytes from offset `position()` to the end, through `deliver`: `d.first` first,
 * then, after a failure, new requests from where it stopped.
 */
async function fromNetwork(
  d: Download,
  position: () => number,
  deliver: (chunk: Uint8Array) => void,
  hash: Sha256Hasher,
): Promise<void> {
  const { file, url, deps, options, size, validator } = d;
  const delays = options.retryDelaysMs ?? RETRY_DELAYS_MS;
  const stallMs = options.stallMs ?? STALL_MS;
  const sleep = deps.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  // Range requests: unless the server said it has none, or compressed the body.
  const ranges = d.first.headers.get("Accept-Ranges")?.trim().toLowerCase() !== "none" && !encoded(d.first);
  let current: { response: Response; start: number } | null = { response: d.first, start: d.kept };
  let failures = 0;
  for (;;) {
    const before = position();
    let cause: string;
    try {
      if (current && current.start !== before) {
        // A kept part was missing: this response starts too late.
        await current.response.body?.cancel().catch(() => undefined);
        current = null;
      }
      current ??= await reopen();
      const { response, start } = current;
      current = null;
      const skip = before - start;
      const stall = { ms: stallMs, abort: aborts.get(response) };
      const read = await readBody(response.body!, skip > 0 ? skipping(skip, deliver) : deliver, stall);
      const at = position();
      if (size === null || at === size) return;
      // The body ended short of the size: broken off, unless it was as long as it said.
      const declared = encoded(response) ? null : headerNumber(response, "Content-Length");
      if (declared !== null && read === declared) throw corrupt(`${file.name}: ${at} bytes, expected ${size}`);
      cause = "the connection closed before the end";
    } catch (e) {
      if (!(e instanceof TransferFailure)) throw e;
      cause = e.message;
    }
    const at = position();
    failures = at > before ? 1 : failures + 1;
    if (failures > delays.length) {
      throw fileError(`${file.name}: the transfer failed after ${at} bytes (${cause})`);
    }
    await sleep(delays[failures - 1]!);
  }

  /**
   * The whole file again (200, when the server has no Range support) or its rest (206),
   * checked against what was already delivered.
   */
  async function reopen(): Promise<{ response: Response; start: number }> {
    const at = position();
    const headers: Record<string, string> = {};
    if (ranges) {
      headers.Range = `bytes=${at}-`;
      const v = ifRange(validator);
      if (v !== null && sameOrigin(url)) headers["If-Range"] = v;
    }
    let response: Response;
    try {
      response = await watchedFetch(deps, url, headers, stallMs);
    } catch (e) {
      throw new TransferFailure(describe(e));
    }
    const changed = () => {
      const how = changedValidator(validator, validatorOf(response));
      return how && corrupt(`${file.name}: the file changed during the download (${how})`);
    };
    if (response.status === 206 && response.body) {
      const c = changed();
      if (c) throw c;
      const range = contentRange(response);
      const length = headerNumber(response, "Content-Length");
      if (range === "bad") {
        const value = response.headers.get("Content-Range");
        throw corrupt(`${file.name}: the server answered a bad Content-Range (${value})`);
      }
      if (range && range.first !== at) {
        throw corrupt(`${file.name}: asked for bytes ${at}-, the server sent bytes ${range.first}-${range.last}`);
      }
      const total = range ? range.total : length === null ? null : at + length;
      if (size !== null && total !== null && total !== size) {
        throw corrupt(
          `${file.name}: the server now says the file has ${total} bytes, not ${size} ` +
            "(the file changed during the download?)",
        );
      }
      if (range && length !== null && length !== range.last - range.first + 1) {
        throw corrupt(
          `${file.name}: the server's Content-Length ${length} disagrees with its Content-Range ` +
            `${range.first}-${range.last}`,
        );
      }
      return { response, start: at };
    }
    if (response.status === 200 && response.body) {
      const c = changed();
      if (c) {
        await response.body.cancel().catch(() => undefined);
        throw c;
      }
      const length = encoded(response) ? null : headerNumber(response, "Content-Length");
      if (size !== null && length !== null && length !== size) {
        await response.body.cancel().catch(() => undefined);
        throw corrupt(`${file.name}: the file changed during the download (${length} bytes now, ${size} before)`);
      }
      return { response, start: 0 };
    }
    await response.body?.cancel().catch(() => undefined);
    if (retryableStatus(response.status)) {
      throw new TransferFailure(`HTTP ${response.status} ${response.statusText}`.trim());
    }
    if (response.status === 416) {
      throw corrupt(`${file.name}: the server refused bytes ${at}- (HTTP 416): the file changed during the download?`);
    }
    throw fileError(`${file.name}: ${url} answered HTTP ${response.status} ${response.statusText}`.trim());
  }

  /**
   * `deliver` after the first `count` bytes of a body that starts over: those must hash to what
   * was already delivered (else the file changed), and are dropped.
   */
  function skipping(count: number, next: (chunk: Uint8Array) => void) {
    const expected = hash.hex();
    // The hash of the bytes sent again: freed once they are all in (if the body fails midway,
    // wasm-bindgen's FinalizationRegistry frees it).
    let again: Sha256Hasher | null = null;
    let left = count;
    return (chunk: Uint8Array) => {
      if (left > 0) {
        const take = Math.min(left, chunk.length);
        again ??= deps.sha256();
        again.update(chunk.subarray(0, take));
        left -= take;
        if (left === 0) {
          const actual = again.hex();
          again.free();
          again = null;
          if (actual !== expected) {
            throw corrupt(
              `${file.name}: the file changed during the download ` +
                `(the server sent its first ${count} bytes again, and they differ)`,
            );
          }
        }
        if (take === chunk.length) return;
        chunk = chunk.subarray(take);
      }
      next(chunk);
    };
  }
}

/** Reads `body` to the end, then checks the size and sha256 that `file` expects. */
async function pump(
  file: WireFile,
  body: ReadableStream<Uint8Array>,
  deps: FileDeps,
  onChunk: (chunk: Uint8Array) => void,
  onProgress?: (loaded: number) => void,
): Promise<void> {
  const hash = file.sha256 === null ? null : deps.sha256();
  let loaded = 0;
  try {
    try {
      await readBody(body, (chunk) => {
        loaded += chunk.length;
        if (file.size !== null && loaded > file.size) {
          throw fileError(`${file.name}: more than the expected ${file.size} bytes`);
        }
        hash?.update(chunk);
        onChunk(chunk);
        onProgress?.(loaded);
      });
    } catch (e) {
      if (!(e instanceof TransferFailure)) throw e;
      throw fileError(`${file.name}: the transfer failed after ${loaded} bytes (${e.message})`);
    }
    if (file.size !== null && loaded !== file.size) {
      throw fileError(`${file.name}: ${loaded} bytes, expected ${file.size} (an interrupted transfer?)`);
    }
    if (hash && file.sha256 !== null) {
      const actual = hash.hex();
      if (actual !== file.sha256.toLowerCase()) {
        throw fileError(`${file.name}: sha256 ${actual}, expected ${file.sha256} (a corrupt or changed file)`);
      }
    }
  } finally {
    hash?.free();
  }
}

// --- listing and deleting -------------------------------------------------------------------

export interface CachedFile {
  url: string;
  bytes: number | null;
  sha256: string | null;
  /** ISO date of the download. */
  storedAt: string | null;
}

/** The complete files in the cache; a partial download (kept to resume) is not listed. */
export async function listCachedFiles(
  caches: CacheStorage | undefined,
  cacheName: string,
): Promise<CachedFile[]> {
  if (!caches || !(await caches.has(cacheName))) return [];
  const cache = await caches.open(cacheName);
  const files: CachedFile[] = [];
  for (const request of await cache.keys()) {
    if (partSuffix.test(request.url)) continue;
    if (manifestSuffix.test(request.url)) {
      const url = request.url.replace(manifestSuffix, "");
      const manifest = await readManifest(cache, url);
      if (manifest?.complete) {
        files.push({ url, bytes: manifest.size, sha256: manifest.sha256, storedAt: manifest.storedAt });
      }
      continue;
    }
    const response = await cache.match(request);
    if (!response) continue;
    files.push({
      url: request.url,
      bytes: headerNumber(response, "Content-Length"),
      sha256: response.headers.get(SHA256_HEADER),
      storedAt: response.headers.get(STORED_HEADER),
    });
  }
  return files;
}

/**
 * Deletes what is stored of `urls` (everything: null): complete files and partial downloads;
 * returns how many files (complete or partial) were deleted.
 */
export async function deleteCachedFiles(
  caches: CacheStorage | undefined,
  cacheName: string,
  urls: readonly string[] | null,
): Promise<number> {
  if (!caches || !(await caches.has(cacheName))) return 0;
  const cache = await caches.open(cacheName);
  if (urls === null) {
    const count = (await cache.keys()).filter((r) => !partSuffix.test(r.url)).length;
    await caches.delete(cacheName);
    return count;
  }
  let deleted = 0;
  for (const url of urls) {
    const whole = await cache.delete(url);
    const parts = await dropParts(cache, url);
    if (whole || parts) deleted++;
  }
  return deleted;
}
