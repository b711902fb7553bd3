import { createHash } from "node:crypto";
import { beforeEach, describe, expect, it } from "vitest";
import {
  deleteCachedFiles,
  type FileDeps,
  listCachedFiles,
  openModelFile,
  type OpenOptions,
} from "../src/cache.js";
import type { WireFile } from "../src/protocol.js";

const URL_A = "https://models.example/a.gguf";
const bytesA = Uint8Array.from({ length: 10_000 }, (_, i) => (i * 7) % 251);
const shaA = createHash("sha256").update(bytesA).digest("hex");

/** Cache Storage in memory; `put` reads the body stream to the end, as browsers do, and can run out of quota. */
class MemoryCache {
  entries = new Map<string, { body: Uint8Array; headers: Headers }>();
  quota = Infinity;

  async match(request: RequestInfo | URL) {
    const entry = this.entries.get(String(request instanceof Request ? request.url : request));
    return entry ? new Response(entry.body.slice(), { headers: entry.headers }) : undefined;
  }

  async put(request: RequestInfo | URL, response: Response) {
    const reader = response.body!.getReader();
    const chunks: Uint8Array[] = [];
    let length = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      length += value.length;
      if (length > this.quota) {
        await reader.cancel();
        throw new DOMException("the quota has been exceeded", "QuotaExceededError");
      }
      chunks.push(value);
    }
    this.entries.set(String(request), { body: new Uint8Array(Buffer.concat(chunks)), headers: response.headers });
  }

  async delete(request: RequestInfo | URL) {
    return this.entries.delete(String(request));
  }

  async keys() {
    return [...this.entries.keys()].map((url) => new Request(url));
  }
}

class MemoryCacheStorage {
  caches = new Map<string, MemoryCache>();
  async open(name: string) {
    if (!this.caches.has(name)) this.caches.set(name, new MemoryCache());
    return this.caches.get(name)!;
  }
  async has(name: string) {
    return this.caches.has(name);
  }
  async delete(name: string) {
    return this.caches.delete(name);
  }
}

/** A body that delivers `bytes` in `chunk`-sized pieces, then fails after `failAfter` bytes if given. */
function body(bytes: Uint8Array, chunk = 1000, failAfter?: number) {
  let at = 0;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (failAfter !== undefined && at >= failAfter) return controller.error(new TypeError("network error"));
      if (at >= bytes.length) return controller.close();
      controller.enqueue(bytes.slice(at, at + chunk));
      at += chunk;
    },
  });
}

let storage: MemoryCacheStorage;
let fetches: string[];
let warnings: string[];
let serve: (url: string) => Response;

const deps = (): FileDeps => ({
  caches: storage as unknown as CacheStorage,
  fetch: (async (input: RequestInfo | URL) => {
    fetches.push(String(input));
    return serve(String(input));
  }) as typeof fetch,
});
const options = (cacheName: string | null = "test"): OpenOptions => ({
  cacheName,
  warn: (m) => warnings.push(m),
});
const wire = (extra: Partial<WireFile> = {}): WireFile => ({
  name: URL_A,
  source: { url: URL_A },
  size: bytesA.length,
  sha256: shaA,
  ...extra,
});

/** Opens and reads a file; returns its source and the bytes delivered. */
async function load(file: WireFile, d = deps(), o = options()) {
  const opened = await openModelFile(file, d, o);
  const chunks: Uint8Array[] = [];
  const progress: number[] = [];
  await opened.read((c) => chunks.push(c.slice()), (loaded) => progress.push(loaded));
  return { source: opened.source, size: opened.size, bytes: new Uint8Array(Buffer.concat(chunks)), progress };
}

beforeEach(() => {
  storage = new MemoryCacheStorage();
  fetches = [];
  warnings = [];
  serve = () => new Response(body(bytesA), { headers: { "Content-Length": String(bytesA.length) } });
});

describe("openModelFile from a URL", () => {
  it("downloads, verifies, caches; the second load comes from the cache without a request", async () => {
    const first = await load(wire());
    expect(first).toMatchObject({ source: "network", size: bytesA.length, bytes: bytesA });
    expect(first.progress.at(-1)).toBe(bytesA.length);
    const entry = storage.caches.get("test")!.entries.get(URL_A)!;
    expect(entry.body).toEqual(bytesA);
    expect(entry.headers.get("Content-Length")).toBe(String(bytesA.length));
    expect(entry.headers.get("X-Lean-Sha256")).toBe(shaA);

    const second = await load(wire());
    expect(second).toMatchObject({ source: "cache", size: bytesA.length, bytes: bytesA });
    expect(fetches).toEqual([URL_A]);
    expect(warnings).toEqual([]);
  });

  it("takes the size from Content-Length when the catalog has none", async () => {
    const opened = await openModelFile(wire({ size: null, sha256: null }), deps(), options());
    expect(opened.size).toBe(bytesA.length);
  });

  it("leaves no cache entry when the sha256 does not match", async () => {
    const wrong = "0".repeat(64);
    await expect(load(wire({ sha256: wrong }))).rejects.toMatchObject({
      name: "ModelFileError",
      message: `${URL_A}: sha256 ${shaA}, expected ${wrong} (a corrupt or changed file)`,
    });
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("leaves no cache entry when the size is wrong", async () => {
    await expect(load(wire({ size: bytesA.length + 1, sha256: null }))).rejects.toThrow(
      `${URL_A}: 10000 bytes, expected 10001 (an interrupted transfer?)`,
    );
    await expect(load(wire({ size: bytesA.length - 1, sha256: null }))).rejects.toThrow(
      `${URL_A}: more than the expected 9999 bytes`,
    );
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("leaves no cache entry when the transfer breaks off", async () => {
    serve = () => new Response(body(bytesA, 1000, 4000));
    await expect(load(wire())).rejects.toMatchObject({
      name: "ModelFileError",
      message: `${URL_A}: the transfer failed after 4000 bytes (network error)`,
    });
    expect(storage.caches.get("test")!.entries.size).toBe(0);
    // The next attempt downloads again and succeeds.
    serve = () => new Response(body(bytesA));
    expect((await load(wire())).source).toBe("network");
    expect(storage.caches.get("test")!.entries.size).toBe(1);
  });

  it("warns on a quota error and still delivers every byte", async () => {
    storage = new MemoryCacheStorage();
    (await storage.open("test")).quota = 5000;
    const loaded = await load(wire());
    expect(loaded.bytes).toEqual(bytesA);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/is not cached \(the quota has been exceeded: storage quota exceeded\); it still runs/);
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("runs uncached, with a warning, without Cache Storage; and silently with caching off", async () => {
    const noCaches = { ...deps(), caches: undefined };
    expect((await load(wire(), noCaches)).bytes).toEqual(bytesA);
    expect(warnings).toEqual([
      "Cache Storage is unavailable (it needs a secure context: https or localhost): the model is not cached",
    ]);
    warnings = [];
    expect((await load(wire(), deps(), options(null))).source).toBe("network");
    expect(warnings).toEqual([]);
    expect(storage.caches.size).toBe(0);
  });

  it("replaces a cached copy whose size disagrees with the catalog", async () => {
    const cache = await storage.open("test");
    cache.entries.set(URL_A, { body: bytesA.slice(0, 10), headers: new Headers({ "Content-Length": "10" }) });
    const loaded = await load(wire());
    expect(loaded.source).toBe("network");
    expect(warnings).toEqual([`${URL_A}: the cached copy has 10 bytes, not 10000: downloading it again`]);
    expect(cache.entries.get(URL_A)!.body).toEqual(bytesA);
  });

  it("removes a damaged cached copy and says to load again", async () => {
    const cache = await storage.open("test");
    cache.entries.set(URL_A, { body: bytesA.slice(0, 10), headers: new Headers({ "Content-Length": "20" }) });
    await expect(load(wire({ size: null, sha256: null }))).rejects.toThrow(
      `${URL_A}: 10 bytes, expected 20 (an interrupted transfer?) (the cached copy was removed: load the model again)`,
    );
    expect(cache.entries.size).toBe(0);
  });

  it("names the URL and status of an HTTP error, and the cause of a network error", async () => {
    serve = () => new Response("not found", { status: 404, statusText: "Not Found" });
    await expect(openModelFile(wire(), deps(), options())).rejects.toMatchObject({
      name: "ModelFileError",
      message: `${URL_A}: ${URL_A} answered HTTP 404 Not Found`,
    });
    const failing = { ...deps(), fetch: (() => Promise.reject(new TypeError("Failed to fetch"))) as typeof fetch };
    await expect(openModelFile(wire(), failing, options())).rejects.toThrow(
      `${URL_A}: cannot fetch ${URL_A} (Failed to fetch)`,
    );
  });
});

describe("openModelFile from local data", () => {
  it("streams a Blob and checks its size and sha256", async () => {
    const file = { name: "a.gguf", source: { blob: new Blob([bytesA]) }, size: null, sha256: shaA };
    expect(await load(file)).toMatchObject({ source: "local", size: bytesA.length, bytes: bytesA });
    await expect(openModelFile({ ...file, size: 3 }, deps(), options())).rejects.toThrow(
      "a.gguf: 10000 bytes, expected 3",
    );
    await expect(load({ ...file, sha256: "f".repeat(64) })).rejects.toThrow(/a\.gguf: sha256 .* expected f{64}/);
    expect(fetches).toEqual([]);
    expect(storage.caches.size).toBe(0);
  });

  it("streams an ArrayBuffer in bounded chunks without copying it first", async () => {
    const big = new Uint8Array(9 * 1024 * 1024 + 5).map((_, i) => i % 256);
    const opened = await openModelFile(
      { name: "big", source: { bytes: big.buffer }, size: null, sha256: null },
      deps(),
      options(),
    );
    const sizes: number[] = [];
    await opened.read((c) => {
      expect(c.buffer).toBe(big.buffer);
      sizes.push(c.length);
    });
    expect(sizes).toEqual([4 * 1024 * 1024, 4 * 1024 * 1024, 1024 * 1024 + 5]);
  });
});

describe("listCachedFiles and deleteCachedFiles", () => {
  it("list and delete entries by URL or all at once", async () => {
    const URL_B = "https://models.example/b.json";
    serve = (url) => new Response(url === URL_A ? body(bytesA) : "{}");
    await load(wire());
    await load({ name: URL_B, source: { url: URL_B }, size: 2, sha256: null });
    const listed = await listCachedFiles(storage as unknown as CacheStorage, "test");
    expect(listed.map(({ url, bytes, sha256 }) => ({ url, bytes, sha256 }))).toEqual([
      { url: URL_A, bytes: 10000, sha256: shaA },
      { url: URL_B, bytes: 2, sha256: null },
    ]);
    expect(Date.parse(listed[0]!.storedAt!)).toBeGreaterThan(0);

    expect(await deleteCachedFiles(storage as unknown as CacheStorage, "test", [URL_B, "https://x/none"])).toBe(1);
    expect((await listCachedFiles(storage as unknown as CacheStorage, "test")).map((f) => f.url)).toEqual([URL_A]);
    expect(await deleteCachedFiles(storage as unknown as CacheStorage, "test", null)).toBe(1);
    expect(await storage.has("test")).toBe(false);
    expect(await listCachedFiles(storage as unknown as CacheStorage, "test")).toEqual([]);
    expect(await listCachedFiles(undefined, "test")).toEqual([]);
  });
});
