/**
 * Reading model files (URL, Blob or bytes) chunk by chunk, with Cache Storage for downloads: a
 * download is written to the cache while it streams and committed only once complete and
 * verified (size and sha256 where known), so an interrupted or corrupt download never leaves an
 * entry behind. Failing to cache (quota, no Cache Storage) is a warning: the model still runs.
 */
import { ErrorName, leanError } from "./errors.js";
import type { WireFile } from "./protocol.js";
import { Sha256 } from "./sha256.js";

export const DEFAULT_CACHE_NAME = "lean-models-v1";

/** Headers of a cache entry besides Content-Length. */
const SHA256_HEADER = "X-Lean-Sha256";
const STORED_HEADER = "X-Lean-Stored";

export interface FileDeps {
  fetch: typeof fetch;
  /** `globalThis.caches`; undefined outside secure contexts. */
  caches: CacheStorage | undefined;
}

export interface OpenedFile {
  /** The byte size, known before reading (from the catalog, the cache entry, Content-Length or the Blob). */
  size: number | null;
  source: "network" | "cache" | "local";
  /**
   * Streams the bytes to `onChunk` (each chunk may be kept or consumed at once), then verifies
   * them; a download is then committed to the cache. Rejects with a ModelFileError on a network
   * failure or a failed check.
   */
  read(onChunk: (chunk: Uint8Array) => void, onProgress?: (loaded: number) => void): Promise<void>;
}

export interface OpenOptions {
  /** Cache Storage name; null: no caching. */
  cacheName: string | null;
  warn(message: string): void;
}

const fileError = (message: string) => leanError(ErrorName.ModelFile, message);
const describe = (e: unknown) => (e instanceof Error ? e.message : String(e));

export async function openModelFile(
  file: WireFile,
  deps: FileDeps,
  options: OpenOptions,
): Promise<OpenedFile> {
  const { source } = file;
  if ("bytes" in source) return local(file, source.bytes.byteLength, () => bytesStream(source.bytes));
  if ("blob" in source) return local(file, source.blob.size, () => source.blob.stream());
  return openUrl(file, source.url, deps, options);
}

function local(file: WireFile, size: number, stream: () => ReadableStream<Uint8Array>): OpenedFile {
  if (file.size !== null && size !== file.size) {
    throw fileError(`${file.name}: ${size} bytes, expected ${file.size}`);
  }
  return {
    size,
    source: "local",
    read: (onChunk, onProgress) => pump(file, stream(), onChunk, onProgress),
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

async function openUrl(
  file: WireFile,
  url: string,
  deps: FileDeps,
  options: OpenOptions,
): Promise<OpenedFile> {
  const cache = await openCache(deps, options);
  const hit = cache ? await cache.match(url).catch(() => undefined) : undefined;
  if (cache && hit?.body) {
    const stored = headerNumber(hit, "Content-Length");
    if (file.size === null || stored === file.size) {
      const body = hit.body;
      return {
        size: stored ?? file.size,
        source: "cache",
        read: async (onChunk, onProgress) => {
          try {
            // Verified when stored: the size is checked again, the (slow) hash is not.
            await pump({ ...file, size: stored ?? file.size, sha256: null }, body, onChunk, onProgress);
          } catch (e) {
            await cache.delete(url).catch(() => false);
            throw fileError(`${describe(e)} (the cached copy was removed: load the model again)`);
          }
        },
      };
    }
    await cache.delete(url).catch(() => false);
    options.warn(`${file.name}: the cached copy has ${stored} bytes, not ${file.size}: downloading it again`);
  }

  let response: Response;
  try {
    response = await deps.fetch(url);
  } catch (e) {
    throw fileError(`${file.name}: cannot fetch ${url} (${describe(e)})`);
  }
  if (!response.ok || !response.body) {
    throw fileError(`${file.name}: ${url} answered HTTP ${response.status} ${response.statusText}`.trim());
  }
  const body = response.body;
  const size = file.size ?? headerNumber(response, "Content-Length");
  return {
    size,
    source: "network",
    read: async (onChunk, onProgress) => {
      const writer = cache ? startCacheWrite(cache, url, file, size, options) : null;
      try {
        await pump(file, body, (chunk) => {
          writer?.write(chunk);
          onChunk(chunk);
        }, onProgress);
      } catch (e) {
        writer?.abandon(e);
        throw e;
      }
      await writer?.commit();
    },
  };
}

function headerNumber(response: Response, name: string): number | null {
  const value = response.headers.get(name);
  const n = value === null ? NaN : Number(value);
  return Number.isSafeInteger(n) && n >= 0 ? n : null;
}

/** Reads `body` to the end, then checks the size and sha256 that `file` expects. */
async function pump(
  file: WireFile,
  body: ReadableStream<Uint8Array>,
  onChunk: (chunk: Uint8Array) => void,
  onProgress: ((loaded: number) => void) | undefined,
): Promise<void> {
  const hash = file.sha256 === null ? null : new Sha256();
  const reader = body.getReader();
  let loaded = 0;
  try {
    for (;;) {
      let next: ReadableStreamReadResult<Uint8Array>;
      try {
        next = await reader.read();
      } catch (e) {
        throw fileError(`${file.name}: the transfer failed after ${loaded} bytes (${describe(e)})`);
      }
      if (next.done) break;
      loaded += next.value.length;
      if (file.size !== null && loaded > file.size) {
        throw fileError(`${file.name}: more than the expected ${file.size} bytes`);
      }
      hash?.update(next.value);
      onChunk(next.value);
      onProgress?.(loaded);
    }
  } finally {
    reader.releaseLock();
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
}

/**
 * A cache entry written while the download streams: its body is a stream that is closed only
 * after verification, so `cache.put` completes (and the entry appears) only for a good file;
 * erroring the stream makes the put fail and leaves nothing behind.
 */
function startCacheWrite(
  cache: Cache,
  url: string,
  file: WireFile,
  size: number | null,
  options: OpenOptions,
) {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  const body = new ReadableStream<Uint8Array>({
    start: (c) => {
      controller = c;
    },
  });
  const headers = new Headers({ "Content-Type": "application/octet-stream" });
  if (size !== null) headers.set("Content-Length", String(size));
  if (file.sha256 !== null) headers.set(SHA256_HEADER, file.sha256.toLowerCase());
  headers.set(STORED_HEADER, new Date().toISOString());
  let failure: unknown = null;
  const put = cache.put(url, new Response(body, { headers })).catch((e: unknown) => {
    failure = e;
  });
  const warnNotCached = () =>
    options.warn(
      `${file.name} is not cached (${describe(failure)}${
        failure instanceof Error && failure.name === "QuotaExceededError" ? ": storage quota exceeded" : ""
      }); it still runs, but will be downloaded again next time`,
    );
  return {
    write(chunk: Uint8Array) {
      if (failure !== null) return;
      try {
        controller.enqueue(chunk);
      } catch (e) {
        // The put gave up (e.g. quota) and cancelled the stream.
        failure ??= e;
      }
    },
    abandon(reason: unknown) {
      try {
        controller.error(reason);
      } catch {
        // Already errored or cancelled: nothing is stored either way.
      }
    },
    async commit() {
      if (failure === null) {
        try {
          controller.close();
        } catch (e) {
          failure = e;
        }
      }
      await put;
      if (failure !== null) warnNotCached();
    },
  };
}

export interface CachedFile {
  url: string;
  bytes: number | null;
  sha256: string | null;
  /** ISO date of the download. */
  storedAt: string | null;
}

export async function listCachedFiles(
  caches: CacheStorage | undefined,
  cacheName: string,
): Promise<CachedFile[]> {
  if (!caches || !(await caches.has(cacheName))) return [];
  const cache = await caches.open(cacheName);
  const files: CachedFile[] = [];
  for (const request of await cache.keys()) {
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

/** Deletes the entries of `urls` (all of them: null); returns how many were deleted. */
export async function deleteCachedFiles(
  caches: CacheStorage | undefined,
  cacheName: string,
  urls: readonly string[] | null,
): Promise<number> {
  if (!caches || !(await caches.has(cacheName))) return 0;
  const cache = await caches.open(cacheName);
  if (urls === null) {
    const count = (await cache.keys()).length;
    await caches.delete(cacheName);
    return count;
  }
  let deleted = 0;
  for (const url of urls) if (await cache.delete(url)) deleted++;
  return deleted;
}
