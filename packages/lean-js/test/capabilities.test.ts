import { describe, expect, it } from "vitest";
import {
  type BuildSet,
  type Capabilities,
  type CapabilityScope,
  type WebGpuCapability,
  chooseBackend,
  detectCapabilities,
  webgpuVerdict,
} from "../src/capabilities.js";
import { findModel } from "../src/catalog.js";

const MIB = 1024 * 1024;

const gpuAdapter = (limits: Record<string, number>, isFallbackAdapter = false): WebGpuCapability => ({
  available: true,
  adapter: { vendor: "acme", architecture: "x", device: "", description: "", isFallbackAdapter },
  limits,
  features: ["shader-f16"],
});

/** A cross-origin isolated page on 4 cores with a 1 GiB-binding GPU. */
const everything: Capabilities = {
  secureContext: true,
  crossOriginIsolated: true,
  sharedArrayBuffer: true,
  wasmSimd: true,
  wasmThreads: true,
  hardwareConcurrency: 4,
  webgpu: gpuAdapter({ maxStorageBufferBindingSize: 1024 * MIB, maxBufferSize: 1024 * MIB }),
};
const allBuilds: BuildSet = { simd: true, threads: true, webgpu: true };
const cpuBuilds: BuildSet = { simd: true, threads: true, webgpu: false };

describe("chooseBackend", () => {
  it("prefers WebGPU, then threads, then SIMD", () => {
    expect(chooseBackend("auto", everything, allBuilds).backend).toBe("webgpu");
    expect(chooseBackend("auto", everything, cpuBuilds).backend).toBe("threads");
    expect(chooseBackend("auto", { ...everything, crossOriginIsolated: false }, cpuBuilds).backend).toBe("simd");
  });

  it("says that missing COOP/COEP is why threads were not used", () => {
    const decision = chooseBackend(
      "auto",
      { ...everything, crossOriginIsolated: false, sharedArrayBuffer: false },
      cpuBuilds,
    );
    expect(decision.backend).toBe("simd");
    expect(decision.skipped.map((s) => s.backend)).toEqual(["webgpu", "threads"]);
    expect(decision.reason).toMatch(/threads: the page is not cross-origin isolated/);
    expect(decision.reason).toMatch(/Cross-Origin-Opener-Policy: same-origin/);
    expect(decision.reason).toMatch(/Cross-Origin-Embedder-Policy: require-corp/);
    expect(decision.reason).toMatch(/webgpu: this lean-js build has no WebGPU backend yet/);
  });

  it("passes over a software WebGPU adapter and threads on one core in auto, but not when forced", () => {
    const software = { ...everything, webgpu: gpuAdapter({ maxStorageBufferBindingSize: 128 * MIB }, true) };
    const auto = chooseBackend("auto", software, allBuilds);
    expect(auto.backend).toBe("threads");
    expect(auto.reason).toMatch(/software \(fallback\) WebGPU adapter/);
    expect(chooseBackend("webgpu", software, allBuilds).backend).toBe("webgpu");
    const oneCore = { ...everything, hardwareConcurrency: 1 };
    expect(chooseBackend("auto", oneCore, cpuBuilds).backend).toBe("simd");
    expect(chooseBackend("threads", oneCore, cpuBuilds).backend).toBe("threads");
  });

  it("refuses a forced backend that cannot run, saying why", () => {
    const isolatedNot = { ...everything, crossOriginIsolated: false };
    expect(() => chooseBackend("threads", isolatedNot, cpuBuilds)).toThrow(
      expect.objectContaining({
        name: "BackendUnavailableError",
        message: expect.stringMatching(/^the threads backend cannot run here: the page is not cross-origin isolated/),
      }),
    );
    expect(() => chooseBackend("webgpu", everything, cpuBuilds)).toThrow(
      /the webgpu backend cannot run here: this lean-js build has no WebGPU backend yet/,
    );
    const noGpu = { ...everything, webgpu: { available: false as const, reason: "no WebGPU adapter" } };
    expect(() => chooseBackend("webgpu", noGpu, allBuilds)).toThrow(/cannot run here: no WebGPU adapter/);
    expect(() => chooseBackend("simd", { ...everything, wasmSimd: false }, cpuBuilds)).toThrow(/no SIMD/);
    expect(() => chooseBackend("threads", everything, { ...cpuBuilds, threads: false })).toThrow(
      /no multi-thread WebAssembly build/,
    );
  });

  it("fails clearly when nothing can run, and on an unknown backend", () => {
    const old = { ...everything, wasmSimd: false, crossOriginIsolated: false };
    expect(() => chooseBackend("auto", old, cpuBuilds)).toThrow(
      /no lean backend can run here \(webgpu: .*; threads: .*; simd: this browser's WebAssembly has no SIMD/,
    );
    expect(() => chooseBackend("cuda" as never, everything, cpuBuilds)).toThrow(TypeError);
  });
});

describe("webgpuVerdict", () => {
  const caps = (binding: number) => ({
    ...everything,
    webgpu: gpuAdapter({ maxStorageBufferBindingSize: binding, maxBufferSize: 4096 * MIB }),
  });
  const qwen = findModel("qwen2.5-coder-0.5b-instruct-q4_0")!.gpu;
  const smol = findModel("smollm2-135m-instruct-q4_0")!.gpu;

  it("binds whole tensors when the largest fits", () => {
    expect(webgpuVerdict(caps(1024 * MIB), allBuilds, qwen)).toEqual({
      how: "every tensor fits one storage binding (largest 137.9 MiB ≤ 1024.0 MiB)",
    });
  });

  it("takes the split-binding path under the 128 MiB default limit", () => {
    // Qwen2.5-Coder's output matrix (144,643,072 bytes) exceeds 128 MiB; SmolLM2's do not.
    expect(webgpuVerdict(caps(128 * MIB), allBuilds, qwen)).toEqual({
      how: "the largest tensor (137.9 MiB) exceeds a storage binding (128.0 MiB): split by rows",
    });
    expect(webgpuVerdict(caps(128 * MIB), allBuilds, smol)).toHaveProperty("how", expect.stringMatching(/^every tensor fits/));
    expect(webgpuVerdict(caps(128 * MIB), allBuilds, null)).toHaveProperty("how", expect.stringMatching(/split by rows/));
  });

  it("refuses an adapter whose binding cannot hold one row", () => {
    expect(webgpuVerdict(caps(2048), allBuilds, qwen)).toEqual({
      unavailable: "one weight row (2736 bytes) exceeds the adapter's storage binding limit (2048 bytes)",
    });
  });

  it("counts maxBufferSize when it is the smaller limit", () => {
    const small = { ...everything, webgpu: gpuAdapter({ maxStorageBufferBindingSize: 1024 * MIB, maxBufferSize: 100 * MIB }) };
    expect(webgpuVerdict(small, allBuilds, qwen)).toHaveProperty("how", expect.stringMatching(/exceeds a storage binding \(100\.0 MiB\)/));
  });
});

describe("detectCapabilities", () => {
  const wasm = globalThis.WebAssembly as unknown as CapabilityScope["WebAssembly"];

  it("reads a cross-origin isolated scope with a WebGPU adapter", async () => {
    // GPUSupportedLimits-like: limits are getters on the prototype.
    const limits = Object.create({
      get maxStorageBufferBindingSize() {
        return 256 * MIB;
      },
      get maxBufferSize() {
        return 512 * MIB;
      },
    });
    const scope: CapabilityScope = {
      isSecureContext: true,
      crossOriginIsolated: true,
      SharedArrayBuffer,
      WebAssembly: wasm,
      navigator: {
        hardwareConcurrency: 8,
        gpu: {
          requestAdapter: async () => ({
            limits,
            features: new Set(["timestamp-query", "shader-f16"]),
            info: { vendor: "acme", architecture: "rdna", device: "", description: "Acme GPU", isFallbackAdapter: false },
          }),
        },
      },
    };
    expect(await detectCapabilities({}, scope)).toEqual({
      secureContext: true,
      crossOriginIsolated: true,
      sharedArrayBuffer: true,
      wasmSimd: true,
      wasmThreads: true,
      hardwareConcurrency: 8,
      webgpu: {
        available: true,
        adapter: { vendor: "acme", architecture: "rdna", device: "", description: "Acme GPU", isFallbackAdapter: false },
        limits: { maxStorageBufferBindingSize: 256 * MIB, maxBufferSize: 512 * MIB },
        features: ["shader-f16", "timestamp-query"],
      },
    });
  });

  it("reports what is missing on a plain http page without WebGPU", async () => {
    const caps = await detectCapabilities({}, { isSecureContext: false, WebAssembly: wasm, navigator: {} });
    expect(caps).toMatchObject({
      crossOriginIsolated: false,
      sharedArrayBuffer: false,
      wasmSimd: true,
      wasmThreads: false,
      hardwareConcurrency: 1,
      webgpu: { available: false, reason: "WebGPU needs a secure context (https or localhost)" },
    });
  });

  it("reports an absent adapter, a failing request, and skips probing when asked", async () => {
    const withGpu = (requestAdapter: () => Promise<null>) => ({
      isSecureContext: true,
      WebAssembly: wasm,
      navigator: { gpu: { requestAdapter } },
    });
    expect((await detectCapabilities({}, withGpu(async () => null))).webgpu).toEqual({
      available: false,
      reason: "no WebGPU adapter (GPU blocklisted or absent)",
    });
    expect(
      (await detectCapabilities({}, withGpu(() => Promise.reject(new Error("device lost"))))).webgpu,
    ).toEqual({ available: false, reason: "requesting a WebGPU adapter failed: Error: device lost" });
    let asked = false;
    const probed = await detectCapabilities({ webgpu: false }, withGpu(async () => ((asked = true), null)));
    expect(asked).toBe(false);
    expect(probed.webgpu).toMatchObject({ available: false, reason: expect.stringMatching(/^not probed/) });
  });

  it("does not count SharedArrayBuffer without wasm shared memory", async () => {
    const noSharedMemory = {
      validate: wasm!.validate,
      Memory: function () {
        throw new TypeError("shared memory disabled");
      } as unknown as NonNullable<CapabilityScope["WebAssembly"]>["Memory"],
    };
    const caps = await detectCapabilities(
      { webgpu: false },
      { crossOriginIsolated: true, SharedArrayBuffer, WebAssembly: noSharedMemory },
    );
    expect(caps).toMatchObject({ sharedArrayBuffer: true, wasmThreads: false });
  });
});
