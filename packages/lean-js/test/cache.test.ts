import { createHash } from "node:crypto";
import { beforeEach, describe, expect, it } from "vitest";
import {
  deleteCachedFiles,
  type FileDeps,
  listCachedFiles,
  openModelFile,
  type OpenOptions,
  partKey,
} from "../src/cache.js";
import type { WireFile } from "../src/protocol.js";
import { NodeSha256 } from "./node-sha256.js";

const URL_A = "https://models.example/a.gguf";
const bytesA = Uint8Array.from({ length: 10_000 }, (_, i) => (i * 7) % 251);
const shaA = createHash("sha256").update(bytesA).digest("hex");
/** Stored parts in these tests (PART_BYTES in production): a.gguf is 3 whole parts and 1000 bytes. */
const PART = 3000;

/**
 * Cache Storage in memory; `put` reads the body stream to the end, as browsers do, and fails
 * once the entries would hold more than `quota` bytes.
 */
class MemoryCache {
  entries = new Map<string, { body: Uint8Array; headers: Headers }>();
  quota = Infinity;

  async match(request: RequestInfo | URL) {
    const entry = this.entries.get(String(request instanceof Request ? request.url : request));
    // In pieces, as a browser reads an entry.
    return entry ? new Response(body(entry.body.slice(), 1000), { headers: entry.headers }) : undefined;
  }

  stored() {
    let n = 0;
    for (const { body } of this.entries.values()) n += body.length;
    return n;
  }

  async put(request: RequestInfo | URL, response: Response) {
    const reader = response.body!.getReader();
    const chunks: Uint8Array[] = [];
    let length = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      length += value.length;
      if (this.stored() + length > this.quota) {
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

  /** The keys of the parts stored for `url` and whether its manifest says complete. */
  async stateOf(url: string) {
    const manifest = this.entries.get(partKey(url, "manifest"));
    const parts = [...this.entries.keys()].filter((k) => k.startsWith(`${url}?lean-part=`) && !k.endsWith("manifest"));
    return {
      parts: parts.length,
      manifest: manifest ? (JSON.parse(new TextDecoder().decode(manifest.body)) as Record<string, unknown>) : null,
    };
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
      const end = Math.min(at + chunk, bytes.length, failAfter ?? Infinity);
      controller.enqueue(bytes.slice(at, end));
      at = end;
    },
  });
}

interface Sent {
  url: string;
  range: string | null;
  ifRange: string | null;
  signal?: AbortSignal | null;
}

let storage: MemoryCacheStorage;
let fetches: Sent[];
let warnings: string[];
let sleeps: number[];
let serve: (url: string, request: Sent) => Response;

const deps = (): FileDeps => ({
  caches: storage as unknown as CacheStorage,
  fetch: (async (input: RequestInfo | URL, init?: RequestInit) => {
    const headers = new Headers(init?.headers);
    const sent = { url: String(input), range: headers.get("Range"), ifRange: headers.get("If-Range") };
    fetches.push(sent);
    return serve(String(input), { ...sent, signal: init?.signal });
  }) as typeof fetch,
  sha256: () => new NodeSha256(),
  sleep: async (ms) => {
    sleeps.push(ms);
  },
});
const options = (cacheName: string | null = "test"): OpenOptions => ({
  cacheName,
  warn: (m) => warnings.push(m),
  partBytes: PART,
});
const wire = (extra: Partial<WireFile> = {}): WireFile => ({
  name: URL_A,
  source: { url: URL_A },
  size: bytesA.length,
  sha256: shaA,
  ...extra,
});

/**
 * An HTTP server's answer for `bytes`: 206 from the requested byte (when `ranges` and If-Range,
 * if sent, names `etag`), else 200; the body fails after `failAfter` of its bytes when given.
 */
function answer(
  bytes: Uint8Array,
  request: Sent,
  { etag = '"v1"' as string | null, ranges = true, failAfter = undefined as number | undefined, headers = {} } = {},
): Response {
  const common: Record<string, string> = { "Accept-Ranges": ranges ? "bytes" : "none", ...(etag ? { ETag: etag } : {}) };
  const range = request.range && /^bytes=(\d+)-$/.exec(request.range);
  if (range && ranges && (request.ifRange === null || request.ifRange === etag)) {
    const start = Number(range[1]);
    if (start >= bytes.length) {
      return new Response(null, { status: 416, headers: { ...common, "Content-Range": `bytes */${bytes.length}` } });
    }
    return new Response(body(bytes.subarray(start), 1000, failAfter), {
      status: 206,
      headers: {
        ...common,
        "Content-Length": String(bytes.length - start),
        "Content-Range": `bytes ${start}-${bytes.length - 1}/${bytes.length}`,
        ...headers,
      },
    });
  }
  return new Response(body(bytes, 1000, failAfter), {
    headers: { ...common, "Content-Length": String(bytes.length), ...headers },
  });
}

/** Answers from `bytes`, each request's body failing after the next of `failures` (then none). */
function flaky(failures: (number | undefined)[], bytes = bytesA, extra: Parameters<typeof answer>[2] = {}) {
  let n = 0;
  return (_url: string, request: Sent) => answer(bytes, request, { ...extra, failAfter: failures[n++] });
}

/** Opens and reads a file; returns its source and the bytes delivered. */
async function load(file: WireFile, d = deps(), o = options()) {
  const opened = await openModelFile(file, d, o);
  const chunks: Uint8Array[] = [];
  const progress: number[] = [];
  await opened.read((c) => chunks.push(c.slice()), (loaded) => progress.push(loaded));
  return { source: opened.source, size: opened.size, bytes: new Uint8Array(Buffer.concat(chunks)), progress };
}

/** What the test cache holds for URL_A. */
const stateA = async () => (await storage.open("test")).stateOf(URL_A);

beforeEach(() => {
  storage = new MemoryCacheStorage();
  fetches = [];
  warnings = [];
  sleeps = [];
  serve = (_url, request) => answer(bytesA, request);
});

describe("openModelFile from a URL", () => {
  it("downloads, verifies, stores in parts; the second load comes from the cache without a request", async () => {
    const first = await load(wire());
    expect(first).toMatchObject({ source: "network", size: bytesA.length, bytes: bytesA });
    expect(first.progress.at(-1)).toBe(bytesA.length);
    const cache = storage.caches.get("test")!;
    for (let i = 0; i < 4; i++) {
      expect(cache.entries.get(partKey(URL_A, i))!.body).toEqual(bytesA.subarray(i * PART, (i + 1) * PART));
    }
    expect(await stateA()).toMatchObject({ parts: 4, manifest: { complete: true, parts: 4, size: 10_000, sha256: shaA } });
    expect(cache.entries.has(URL_A)).toBe(false);

    const second = await load(wire());
    expect(second).toMatchObject({ source: "cache", size: bytesA.length, bytes: bytesA });
    expect(second.progress).toEqual([1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10_000]);
    expect(fetches.map((f) => f.url)).toEqual([URL_A]);
    expect(warnings).toEqual([]);
  });

  it("takes the size from Content-Length when the catalog has none", async () => {
    const opened = await openModelFile(wire({ size: null, sha256: null }), deps(), options());
    expect(opened.size).toBe(bytesA.length);
  });

  it("leaves nothing in the cache when the sha256 does not match: no entry, no parts", async () => {
    const wrong = "0".repeat(64);
    await expect(load(wire({ sha256: wrong }))).rejects.toMatchObject({
      name: "ModelFileError",
      message: `${URL_A}: sha256 ${shaA}, expected ${wrong} (a corrupt or changed file)`,
    });
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("leaves nothing in the cache when the size is wrong", async () => {
    await expect(load(wire({ size: bytesA.length + 1, sha256: null }))).rejects.toThrow(
      `${URL_A}: 10000 bytes, expected 10001`,
    );
    await expect(load(wire({ size: bytesA.length - 1, sha256: null }))).rejects.toThrow(
      `${URL_A}: more than the expected 9999 bytes`,
    );
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  // Offsets: inside the first chunk, either side of chunk (1000) and part (3000) boundaries, the last byte.
  for (const failAfter of [1, 999, 1000, 2999, 3000, 3001, 6000, 9999]) {
    it(`resumes with Range + If-Range after a failure at byte ${failAfter}: the consumer sees one stream`, async () => {
      serve = flaky([failAfter]);
      const loaded = await load(wire());
      expect(loaded.bytes).toEqual(bytesA);
      expect(loaded.progress).toEqual([...loaded.progress].sort((a, b) => a - b));
      expect(fetches).toEqual([
        { url: URL_A, range: null, ifRange: null },
        { url: URL_A, range: `bytes=${failAfter}-`, ifRange: '"v1"' },
      ]);
      expect(sleeps).toEqual([250]);
      expect(await stateA()).toMatchObject({ parts: 4, manifest: { complete: true, sha256: shaA } });
      expect(warnings).toEqual([]);
    });
  }

  it("survives several failures in one load, and gives up after 3 retries without progress", async () => {
    serve = flaky([2500, 1, 0, 3000]);
    expect((await load(wire())).bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual([null, "bytes=2500-", "bytes=2501-", "bytes=2501-", "bytes=5501-"]);
    expect(sleeps).toEqual([250, 250, 1000, 250]);

    storage = new MemoryCacheStorage();
    fetches = [];
    serve = flaky([4000, 0, 0, 0, 0]);
    await expect(load(wire())).rejects.toMatchObject({
      name: "ModelFileError",
      message:
        `${URL_A}: the transfer failed after 4000 bytes (network error) ` +
        "(3000 bytes are kept in Cache Storage: loading the model again resumes from there)",
    });
    expect(fetches).toHaveLength(4);
    expect(await stateA()).toMatchObject({ parts: 1, manifest: { complete: false, parts: 1 } });
    expect(await listCachedFiles(storage as unknown as CacheStorage, "test")).toEqual([]);
  });

  it("retries a transfer that cannot start again (fetch rejects, HTTP 503)", async () => {
    let n = 0;
    serve = (_url, request) => {
      n++;
      if (n === 2) throw new TypeError("Failed to fetch");
      if (n === 3) return new Response("busy", { status: 503, statusText: "Service Unavailable" });
      return answer(bytesA, request, { failAfter: n === 1 ? 5000 : undefined });
    };
    expect((await load(wire())).bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual([null, "bytes=5000-", "bytes=5000-", "bytes=5000-"]);
  });

  it("gives up a stalled body or an answer that never comes, and resumes", async () => {
    // The body stops sending after 4500 bytes and never ends; the retry's answer never comes
    // unless the fetch is aborted; the third request is answered.
    let n = 0;
    serve = (_url, request) => {
      n++;
      if (n === 1) {
        let at = 0;
        return new Response(
          new ReadableStream<Uint8Array>({
            pull: (controller) => {
              if (at >= 4500) return new Promise<void>(() => {});
              controller.enqueue(bytesA.slice(at, at + 1500));
              at += 1500;
            },
          }),
          { headers: { "Content-Length": "10000", ETag: '"v1"' } },
        );
      }
      if (n === 2) {
        return new Promise<Response>((_, reject) =>
          request.signal!.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))),
        ) as unknown as Response;
      }
      return answer(bytesA, request);
    };
    const loaded = await load(wire(), deps(), { ...options(), stallMs: 30 });
    expect(loaded.bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual([null, "bytes=4500-", "bytes=4500-"]);
    expect(sleeps).toEqual([250, 1000]);
    expect(await stateA()).toMatchObject({ manifest: { complete: true } });
  });

  it("a server without Range support: the whole file again, its first bytes checked and skipped", async () => {
    serve = flaky([4321], bytesA, { ranges: false });
    expect((await load(wire())).bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual([null, null]);
    expect(await stateA()).toMatchObject({ manifest: { complete: true } });

    // Range ignored (a 200 although it was asked for): the same.
    storage = new MemoryCacheStorage();
    fetches = [];
    let n = 0;
    serve = (_url, request) => answer(bytesA, { ...request, range: null }, { failAfter: n++ === 0 ? 4321 : undefined });
    expect((await load(wire({ sha256: null }))).bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual([null, "bytes=4321-"]);
  });

  it("a server without Range support whose file changed: an error, never a mixed file", async () => {
    const changed = bytesA.slice();
    changed[100] ^= 1;
    let n = 0;
    serve = (_url, request) =>
      n++ === 0 ? answer(bytesA, request, { failAfter: 4321, ranges: false }) : answer(changed, request, { ranges: false });
    const delivered: number[] = [];
    const opened = await openModelFile(wire({ sha256: null }), deps(), options());
    await expect(opened.read((c) => delivered.push(c.length))).rejects.toMatchObject({
      name: "ModelFileError",
      message: `${URL_A}: the file changed during the download (the server sent its first 4321 bytes again, and they differ)`,
    });
    expect(delivered.reduce((a, b) => a + b)).toBe(4321);
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("a changed validator is an error within a load: If-Range answered with the new file, or a 206 of it", async () => {
    const changed = bytesA.slice();
    changed[9000] ^= 1;
    // An honest server: If-Range no longer matches, so the whole (new) file comes back.
    let n = 0;
    serve = (_url, request) =>
      n++ === 0 ? answer(bytesA, request, { failAfter: 5000 }) : answer(changed, request, { etag: '"v2"' });
    await expect(load(wire({ sha256: null }))).rejects.toThrow(
      `${URL_A}: the file changed during the download (ETag "v1" became "v2")`,
    );
    expect(storage.caches.get("test")!.entries.size).toBe(0);

    // A server that ignores If-Range: the 206's own ETag tells.
    n = 0;
    serve = (_url, request) =>
      n++ === 0
        ? answer(bytesA, request, { failAfter: 5000 })
        : answer(changed, { ...request, ifRange: null }, { etag: '"v2"' });
    await expect(load(wire({ sha256: null }))).rejects.toThrow("the file changed during the download");
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("a wrong Content-Range, or a total that disagrees, is an error", async () => {
    const lies: Record<string, string>[] = [
      { "Content-Range": "bytes 0-9999/10000", "Content-Length": "10000" },
      { "Content-Range": "bytes 5000-10000/10001", "Content-Length": "5001" },
      { "Content-Range": "bytes 5000-9999/10000", "Content-Length": "4000" },
      { "Content-Range": "nonsense" },
    ];
    const messages = [
      `${URL_A}: asked for bytes 5000-, the server sent bytes 0-9999`,
      `${URL_A}: the server now says the file has 10001 bytes, not 10000 (the file changed during the download?)`,
      `${URL_A}: the server's Content-Length 4000 disagrees with its Content-Range 5000-9999`,
      `${URL_A}: the server answered a bad Content-Range (nonsense)`,
    ];
    for (const [i, headers] of lies.entries()) {
      storage = new MemoryCacheStorage();
      let n = 0;
      serve = (_url, request) => answer(bytesA, request, n++ === 0 ? { failAfter: 5000 } : { headers });
      await expect(load(wire({ sha256: null })), JSON.stringify(headers)).rejects.toMatchObject({
        name: "ModelFileError",
        message: messages[i],
      });
      expect(storage.caches.get("test")!.entries.size).toBe(0);
    }
  });

  it("a lying Content-Length: short bodies end in an error after the retries, a long one at once", async () => {
    // Every body stops 1000 bytes short of what it declared (the connection closes cleanly).
    serve = (_url, request) => {
      const response = answer(bytesA, request);
      const declared = Number(response.headers.get("Content-Length"));
      return new Response(body(bytesA.subarray(bytesA.length - declared, bytesA.length - 1000)), {
        status: response.status,
        headers: response.headers,
      });
    };
    await expect(load(wire({ sha256: null }))).rejects.toThrow(
      `${URL_A}: the transfer failed after 9000 bytes (the connection closed before the end)`,
    );
    expect(fetches.map((f) => f.range)).toEqual([null, "bytes=9000-", "bytes=9000-", "bytes=9000-"]);

    // More bytes than Content-Length said (no catalog size): an error, nothing stored.
    storage = new MemoryCacheStorage();
    serve = (_url, request) => answer(bytesA, request, { headers: { "Content-Length": "9500" } });
    await expect(load(wire({ size: null, sha256: null }))).rejects.toThrow(`${URL_A}: more than the expected 9500 bytes`);
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("resumes across loads from the kept parts: byte-identical, fewer bytes fetched", async () => {
    let n = 0;
    serve = (_url, request) => {
      if (n++ === 0) return answer(bytesA, request, { failAfter: 7500 });
      throw new TypeError("Failed to fetch");
    };
    await expect(load(wire())).rejects.toThrow(
      `${URL_A}: the transfer failed after 7500 bytes (Failed to fetch) ` +
        "(6000 bytes are kept in Cache Storage: loading the model again resumes from there)",
    );
    expect(await stateA()).toMatchObject({ parts: 2, manifest: { complete: false, parts: 2, etag: '"v1"' } });

    fetches = [];
    let sent = 0;
    serve = (_url, request) => {
      const response = answer(bytesA, request);
      sent += Number(response.headers.get("Content-Length"));
      return response;
    };
    const opened = await openModelFile(wire(), deps(), options());
    expect(opened).toMatchObject({ source: "network", size: 10_000 });
    const chunks: Uint8Array[] = [];
    await opened.read((c) => chunks.push(c.slice()));
    expect(new Uint8Array(Buffer.concat(chunks))).toEqual(bytesA);
    expect(fetches).toEqual([{ url: URL_A, range: "bytes=6000-", ifRange: '"v1"' }]);
    expect(sent).toBe(4000);
    expect(await stateA()).toMatchObject({ parts: 4, manifest: { complete: true, parts: 4, sha256: shaA } });
    expect((await listCachedFiles(storage as unknown as CacheStorage, "test")).map((f) => f.url)).toEqual([URL_A]);
    expect((await load(wire())).source).toBe("cache");
  });

  it("across loads: a changed file (or no Range) starts over; a resumed file failing its sha256 leaves nothing", async () => {
    const keepTwoParts = async () => {
      storage = new MemoryCacheStorage();
      serve = flaky([7500, 0, 0, 0]);
      await expect(load(wire({ sha256: null }))).rejects.toThrow("6000 bytes are kept");
      fetches = [];
    };
    const changed = bytesA.map((b) => b ^ 0xff);
    await keepTwoParts();
    serve = (_url, request) => answer(changed, request, { etag: '"v2"' });
    expect((await load(wire({ sha256: null }))).bytes).toEqual(changed);
    expect(fetches.map((f) => [f.range, f.ifRange])).toEqual([["bytes=6000-", '"v1"']]);
    expect((await storage.open("test")).entries.get(partKey(URL_A, 0))!.body).toEqual(changed.subarray(0, PART));

    await keepTwoParts();
    serve = (_url, request) => answer(bytesA, request, { ranges: false });
    expect((await load(wire({ sha256: null }))).bytes).toEqual(bytesA);
    expect(fetches).toHaveLength(1);

    // A server that ignores If-Range and sends a 206 of the changed file: its ETag tells, it starts over.
    await keepTwoParts();
    serve = (_url, request) =>
      answer(changed, { ...request, ifRange: null, range: fetches.length === 1 ? request.range : null }, { etag: '"v2"' });
    expect((await load(wire({ sha256: null }))).bytes).toEqual(changed);
    expect(fetches.map((f) => f.range)).toEqual(["bytes=6000-", null]);

    // A server that lies about the validator: only the sha256 can tell; then nothing is kept.
    await keepTwoParts();
    serve = (_url, request) => answer(changed, request);
    await expect(load(wire())).rejects.toThrow(/sha256 .*, expected .* \(a corrupt or changed file\)/);
    expect(storage.caches.get("test")!.entries.size).toBe(0);
  });

  it("across loads: a kept part that went missing is fetched again", async () => {
    serve = flaky([7500, 0, 0, 0]);
    await expect(load(wire())).rejects.toThrow("6000 bytes are kept");
    await (await storage.open("test")).delete(partKey(URL_A, 1));
    fetches = [];
    serve = (_url, request) => answer(bytesA, request);
    expect((await load(wire())).bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual(["bytes=6000-", "bytes=3000-"]);
    expect(await stateA()).toMatchObject({ parts: 4, manifest: { complete: true } });
  });

  it("across loads: a kept part of the wrong length is an error that removes every part", async () => {
    serve = flaky([7500, 0, 0, 0]);
    await expect(load(wire())).rejects.toThrow("6000 bytes are kept");
    const cache = await storage.open("test");
    cache.entries.get(partKey(URL_A, 1))!.body = bytesA.slice(3000, 5999);
    serve = (_url, request) => answer(bytesA, request);
    await expect(load(wire())).rejects.toMatchObject({
      name: "ModelFileError",
      message: `${URL_A}: the kept part 1 of the download has 2999 bytes, not 3000 (it was removed: load the model again)`,
    });
    expect(cache.entries.size).toBe(0);
    expect((await load(wire())).bytes).toEqual(bytesA);
  });

  it("keeps no parts of a file whose change could not be told (no validator, no sha256)", async () => {
    serve = flaky([7500, 0, 0, 0], bytesA, { etag: null });
    await expect(load(wire({ sha256: null }))).rejects.toThrow("6000 bytes are kept");
    fetches = [];
    serve = (_url, request) => answer(bytesA, request, { etag: null });
    expect((await load(wire({ sha256: null }))).bytes).toEqual(bytesA);
    expect(fetches.map((f) => f.range)).toEqual([null]);
  });

  it("warns on a quota error and still delivers every byte; nothing stays stored", async () => {
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
    serve = flaky([5000]);
    expect(await load(wire(), deps(), options(null))).toMatchObject({ source: "network", bytes: bytesA });
    expect(warnings).toEqual([]);
    expect(storage.caches.size).toBe(0);
  });

  it("reads a legacy whole-file entry; replaces one whose size disagrees with the catalog", async () => {
    const cache = await storage.open("test");
    cache.entries.set(URL_A, { body: bytesA, headers: new Headers({ "Content-Length": "10000" }) });
    expect(await load(wire())).toMatchObject({ source: "cache", bytes: bytesA });
    cache.entries.set(URL_A, { body: bytesA.slice(0, 10), headers: new Headers({ "Content-Length": "10" }) });
    const loaded = await load(wire());
    expect(loaded.source).toBe("network");
    expect(warnings).toEqual([`${URL_A}: the cached copy has 10 bytes, not 10000: downloading it again`]);
    expect(cache.entries.has(URL_A)).toBe(false);
    expect(await stateA()).toMatchObject({ manifest: { complete: true } });
  });

  it("removes a damaged cached copy (legacy entry, or a part) and says to load again", async () => {
    const cache = await storage.open("test");
    cache.entries.set(URL_A, { body: bytesA.slice(0, 10), headers: new Headers({ "Content-Length": "20" }) });
    await expect(load(wire({ size: null, sha256: null }))).rejects.toThrow(
      `${URL_A}: 10 bytes, expected 20 (an interrupted transfer?) (the cached copy was removed: load the model again)`,
    );
    expect(cache.entries.size).toBe(0);

    await load(wire());
    cache.entries.get(partKey(URL_A, 2))!.body = bytesA.slice(0, 10);
    await expect(load(wire())).rejects.toThrow(
      `${URL_A} (part 2): 10 bytes, expected 3000 (an interrupted transfer?) (the cached copy was removed: load the model again)`,
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
    const silent = {
      ...deps(),
      fetch: ((_: unknown, init: RequestInit) =>
        new Promise((_, reject) =>
          init.signal!.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))),
        )) as typeof fetch,
    };
    await expect(openModelFile(wire(), silent, { ...options(), stallMs: 20 })).rejects.toThrow(
      `${URL_A}: cannot fetch ${URL_A} (no answer in 0.02 s)`,
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
    const URL_C = "https://models.example/c.gguf?download=true";
    const URL_D = "https://models.example/legacy.json";
    serve = (url, request) => (url === URL_B ? new Response("{}") : answer(bytesA, request));
    await load(wire());
    await load({ name: URL_B, source: { url: URL_B }, size: 2, sha256: null });
    // A partial download (not listed) and a legacy whole entry (listed).
    serve = flaky([4000, 0, 0, 0]);
    await expect(load(wire({ name: URL_C, source: { url: URL_C } }))).rejects.toThrow("3000 bytes are kept");
    const cache = await storage.open("test");
    cache.entries.set(URL_D, { body: new Uint8Array(3), headers: new Headers({ "Content-Length": "3" }) });
    expect(cache.entries.has(partKey(URL_C, 0))).toBe(true);
    const listed = await listCachedFiles(storage as unknown as CacheStorage, "test");
    expect(listed.map(({ url, bytes, sha256 }) => ({ url, bytes, sha256 }))).toEqual([
      { url: URL_A, bytes: 10000, sha256: shaA },
      { url: URL_B, bytes: 2, sha256: createHash("sha256").update("{}").digest("hex") },
      { url: URL_D, bytes: 3, sha256: null },
    ]);
    // Deleting a partial download removes its parts.
    expect(await deleteCachedFiles(storage as unknown as CacheStorage, "test", [URL_C, URL_D])).toBe(2);
    expect([...cache.entries.keys()].filter((k) => k.startsWith(URL_C) || k === URL_D)).toEqual([]);
    expect(Date.parse(listed[0]!.storedAt!)).toBeGreaterThan(0);

    expect(await deleteCachedFiles(storage as unknown as CacheStorage, "test", [URL_B, "https://x/none"])).toBe(1);
    expect((await listCachedFiles(storage as unknown as CacheStorage, "test")).map((f) => f.url)).toEqual([URL_A]);
    expect([...cache.entries.keys()].filter((k) => k.startsWith(URL_A))).toEqual([
      partKey(URL_A, "manifest"),
      ...[0, 1, 2, 3].map((i) => partKey(URL_A, i)),
    ]);
    expect(await deleteCachedFiles(storage as unknown as CacheStorage, "test", null)).toBe(1);
    expect(await storage.has("test")).toBe(false);
    expect(await listCachedFiles(storage as unknown as CacheStorage, "test")).toEqual([]);
    expect(await listCachedFiles(undefined, "test")).toEqual([]);
  });
});
