// A Sha256Hasher on node:crypto, for tests that do not load the wasm module (fake builds, the
// cache's unit tests); sha256.test.ts checks the wasm one against the same vectors.
import { createHash, type Hash } from "node:crypto";
import type { Sha256Hasher } from "../src/cache.js";

export class NodeSha256 implements Sha256Hasher {
  #hash: Hash;
  constructor(hash: Hash = createHash("sha256")) {
    this.#hash = hash;
  }
  update(chunk: Uint8Array): void {
    this.#hash.update(chunk);
  }
  fork(): NodeSha256 {
    return new NodeSha256(this.#hash.copy());
  }
  hex(): string {
    return this.#hash.copy().digest("hex");
  }
  get bytes(): number {
    return NaN;
  }
  free(): void {}
}
