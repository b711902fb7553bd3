import { createHash, randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { Sha256 } from "../src/sha256.js";

const reference = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex");

describe("Sha256", () => {
  it("matches the FIPS 180-4 examples", () => {
    expect(new Sha256().hex()).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect(new Sha256().update(new TextEncoder().encode("abc")).hex()).toBe(
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    );
    const twoBlocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    expect(new Sha256().update(new TextEncoder().encode(twoBlocks)).hex()).toBe(
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    );
  });

  it("equals node:crypto at every padding boundary", () => {
    for (const length of [1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000]) {
      const bytes = randomBytes(length);
      expect(new Sha256().update(bytes).hex(), `length ${length}`).toBe(reference(bytes));
    }
  });

  it("gives the same digest however the data is split into updates", () => {
    const bytes = randomBytes(300_001);
    for (const sizes of [[1], [3, 61, 64, 7], [4096], [65_536, 1]]) {
      const hash = new Sha256();
      let at = 0;
      for (let i = 0; at < bytes.length; i++) {
        const size = sizes[i % sizes.length]!;
        hash.update(bytes.subarray(at, at + size));
        at += size;
      }
      expect(hash.hex(), `chunks ${sizes.join(",")}`).toBe(reference(bytes));
    }
  });

  it("refuses use after the digest", () => {
    const hash = new Sha256();
    hash.hex();
    expect(() => hash.update(new Uint8Array(1))).toThrow(/update after digest/);
    expect(() => hash.hex()).toThrow(/digest twice/);
  });
});
