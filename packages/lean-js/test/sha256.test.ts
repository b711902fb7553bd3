// The SHA-256 that verifies downloads: the wasm module's (rust/lean-wasm/src/sha256.rs, RustCrypto's
// sha2), checked against the FIPS 180-4 examples and node:crypto, however the data is split, and
// forked midway. Needs the single-thread build in src/wasm/ (npm run build); skipped without it,
// unless $CI is set.
import { createHash, randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import type { WasmModule } from "../src/wasm-types.js";

const dir = join(import.meta.dirname, "../src/wasm/simd");
const built = existsSync(join(dir, "lean_wasm_bg.wasm"));
if (!built && process.env.CI) throw new Error(`missing ${dir}/lean_wasm_bg.wasm (run npm run build)`);

const reference = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex");

let wasm: WasmModule;

describe.skipIf(!built)("the wasm module's Sha256", () => {
  beforeAll(async () => {
    const glue = (await import(join(dir, "lean_wasm.js"))) as WasmModule & { initSync(m: { module: Uint8Array }): void };
    glue.initSync({ module: readFileSync(join(dir, "lean_wasm_bg.wasm")) });
    wasm = glue;
  });

  const hex = (parts: (string | Uint8Array)[]) => {
    const hash = new wasm.Sha256();
    for (const part of parts) hash.update(typeof part === "string" ? new TextEncoder().encode(part) : part);
    const digest = hash.hex();
    hash.free();
    return digest;
  };

  it("matches the FIPS 180-4 examples", () => {
    expect(hex([])).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect(hex(["abc"])).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect(hex(["abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"])).toBe(
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    );
  });

  it("equals node:crypto at every padding boundary and for 1 MiB", () => {
    for (const length of [1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 1024 * 1024]) {
      const bytes = randomBytes(length);
      expect(hex([bytes]), `length ${length}`).toBe(reference(bytes));
    }
  });

  it("gives the same digest however the data is split into updates", () => {
    const bytes = randomBytes(300_001);
    for (const sizes of [[1], [3, 61, 64, 7], [4096], [65_536, 1]]) {
      const parts: Uint8Array[] = [];
      for (let at = 0, i = 0; at < bytes.length; i++) {
        const size = sizes[i % sizes.length]!;
        parts.push(bytes.subarray(at, at + size));
        at += size;
      }
      expect(hex(parts), `chunks ${sizes.join(",")}`).toBe(reference(bytes));
    }
  });

  it("forks: both copies go on separately; hex does not end the hash", () => {
    const bytes = randomBytes(1000);
    const hash = new wasm.Sha256();
    hash.update(bytes.subarray(0, 300));
    const fork = hash.fork();
    expect(fork.hex()).toBe(reference(bytes.subarray(0, 300)));
    hash.update(bytes.subarray(300));
    fork.update(new Uint8Array([1, 2, 3]));
    expect(hash.hex()).toBe(reference(bytes));
    expect(hash.hex()).toBe(reference(bytes));
    expect(fork.hex()).toBe(reference(Buffer.concat([bytes.subarray(0, 300), Buffer.from([1, 2, 3])])));
    expect([hash.bytes, fork.bytes]).toEqual([1000, 303]);
    hash.free();
    fork.free();
  });
});
