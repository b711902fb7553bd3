/**
 * What this browser can run, and which backend lean picks: by capability, not by measurement.
 * WebGPU when an adapter has the limits the model needs (whole tensors per storage binding, or
 * row-split bindings when bindings are small); else WebAssembly threads when the page is
 * cross-origin isolated (shared memory); else single-thread WebAssembly SIMD.
 */
import { ErrorName, leanError } from "./errors.js";
import type { Backend, BackendChoice, GpuNeeds } from "./protocol.js";

export interface GpuAdapterSummary {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  /** A software adapter (e.g. SwiftShader, lavapipe): slower than lean's CPU backends. */
  isFallbackAdapter: boolean;
}

export type WebGpuCapability =
  | { available: false; reason: string }
  | {
      available: true;
      adapter: GpuAdapterSummary;
      limits: Record<string, number>;
      features: string[];
    };

export interface Capabilities {
  secureContext: boolean;
  crossOriginIsolated: boolean;
  /** SharedArrayBuffer exists (browsers expose it only to cross-origin isolated pages). */
  sharedArrayBuffer: boolean;
  wasmSimd: boolean;
  /** WebAssembly shared memory and atomics validate and instantiate. */
  wasmThreads: boolean;
  hardwareConcurrency: number;
  webgpu: WebGpuCapability;
}

/** Which backends the WebAssembly builds installed with lean-js provide. */
export interface BuildSet {
  simd: boolean;
  threads: boolean;
  webgpu: boolean;
}

export interface BackendDecision {
  backend: Backend;
  /** Why this backend: for `auto`, why each faster one was not used. */
  reason: string;
  /** The faster backends `auto` passed over, each with its reason. */
  skipped: { backend: Backend; reason: string }[];
}

/** The parts of WebGPU that detection reads (lib.dom has no WebGPU types). */
interface GpuAdapterLike {
  limits: object;
  features: Iterable<string>;
  info?: Partial<Omit<GpuAdapterSummary, "isFallbackAdapter">> & { isFallbackAdapter?: boolean };
  isFallbackAdapter?: boolean;
}

/** The globals detection reads: `globalThis` in a page or worker, a fake in tests. */
export interface CapabilityScope {
  isSecureContext?: boolean;
  crossOriginIsolated?: boolean;
  SharedArrayBuffer?: unknown;
  navigator?: {
    hardwareConcurrency?: number;
    gpu?: { requestAdapter(options?: object): Promise<GpuAdapterLike | null> };
  };
  WebAssembly?: {
    validate(bytes: BufferSource): boolean;
    Memory: new (descriptor: { initial: number; maximum: number; shared: boolean }) => {
      buffer: unknown;
    };
  };
}

// Smallest modules that use the feature (as wasm-feature-detect writes them):
// i8x16.popcnt over a v128 splat; an atomic load from a shared memory.
const SIMD_MODULE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0, 253, 15,
  253, 98, 11,
]);
const THREADS_MODULE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 4, 1, 96, 0, 0, 3, 2, 1, 0, 5, 4, 1, 3, 1, 1, 10, 11, 1, 9, 0,
  65, 0, 254, 16, 2, 0, 26, 11,
]);

const MIB = 1024 * 1024;
const mib = (bytes: number) => `${(bytes / MIB).toFixed(1)} MiB`;

/**
 * Probes the environment. `webgpu: false` skips requesting an adapter (it can take a while,
 * and is pointless when no installed build has the WebGPU backend).
 */
export async function detectCapabilities(
  options: { webgpu?: boolean } = {},
  scope: CapabilityScope = globalThis as CapabilityScope,
): Promise<Capabilities> {
  const wasm = scope.WebAssembly;
  const validates = (bytes: Uint8Array<ArrayBuffer>) => {
    try {
      return wasm?.validate(bytes) ?? false;
    } catch {
      return false;
    }
  };
  let sharedMemory = false;
  if (typeof scope.SharedArrayBuffer === "function" && wasm) {
    try {
      const memory = new wasm.Memory({ initial: 1, maximum: 1, shared: true });
      sharedMemory = memory.buffer instanceof (scope.SharedArrayBuffer as typeof SharedArrayBuffer);
    } catch {
      sharedMemory = false;
    }
  }
  return {
    secureContext: scope.isSecureContext ?? false,
    crossOriginIsolated: scope.crossOriginIsolated ?? false,
    sharedArrayBuffer: typeof scope.SharedArrayBuffer === "function",
    wasmSimd: validates(SIMD_MODULE),
    wasmThreads: sharedMemory && validates(THREADS_MODULE),
    hardwareConcurrency: scope.navigator?.hardwareConcurrency ?? 1,
    webgpu:
      options.webgpu === false
        ? { available: false, reason: "not probed (no installed build has the WebGPU backend)" }
        : await detectWebGpu(scope),
  };
}

async function detectWebGpu(scope: CapabilityScope): Promise<WebGpuCapability> {
  const gpu = scope.navigator?.gpu;
  if (!gpu) {
    return {
      available: false,
      reason: scope.isSecureContext
        ? "this browser has no WebGPU (navigator.gpu is missing)"
        : "WebGPU needs a secure context (https or localhost)",
    };
  }
  let adapter: GpuAdapterLike | null;
  try {
    adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
  } catch (e) {
    return { available: false, reason: `requesting a WebGPU adapter failed: ${String(e)}` };
  }
  if (!adapter) return { available: false, reason: "no WebGPU adapter (GPU blocklisted or absent)" };
  const limits: Record<string, number> = {};
  // GPUSupportedLimits exposes its limits as (enumerable) prototype getters.
  for (const key in adapter.limits) {
    const value = (adapter.limits as Record<string, unknown>)[key];
    if (typeof value === "number") limits[key] = value;
  }
  const info = adapter.info ?? {};
  return {
    available: true,
    adapter: {
      vendor: info.vendor ?? "",
      architecture: info.architecture ?? "",
      device: info.device ?? "",
      description: info.description ?? "",
      isFallbackAdapter: info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false,
    },
    limits,
    features: [...adapter.features].sort(),
  };
}

/** Why WebGPU cannot run the model here, or null when it can (with `how`: which binding path). */
export function webgpuVerdict(
  caps: Capabilities,
  builds: BuildSet,
  needs: GpuNeeds | null,
): { unavailable: string } | { how: string } {
  if (!builds.webgpu) return { unavailable: "this lean-js build has no WebGPU backend yet" };
  if (!caps.webgpu.available) return { unavailable: caps.webgpu.reason };
  const { limits } = caps.webgpu;
  const binding = Math.min(
    limits.maxStorageBufferBindingSize ?? 0,
    limits.maxBufferSize ?? Number.POSITIVE_INFINITY,
  );
  const tensor = needs?.largestTensorBytes ?? null;
  const row = needs?.largestRowBytes ?? null;
  if (tensor !== null && tensor <= binding) {
    return { how: `every tensor fits one storage binding (largest ${mib(tensor)} ≤ ${mib(binding)})` };
  }
  if (row !== null && row > binding) {
    return {
      unavailable: `one weight row (${row} bytes) exceeds the adapter's storage binding limit (${binding} bytes)`,
    };
  }
  return {
    how:
      tensor === null
        ? `tensors larger than a storage binding (${mib(binding)}) are split by rows`
        : `the largest tensor (${mib(tensor)}) exceeds a storage binding (${mib(binding)}): split by rows`,
  };
}

export function threadsUnavailableReason(caps: Capabilities, builds: BuildSet): string | null {
  if (!builds.threads) return "this lean-js build has no multi-thread WebAssembly build";
  if (!caps.crossOriginIsolated) {
    return (
      "the page is not cross-origin isolated: serve it with the headers " +
      "Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp " +
      "(or credentialless) to enable shared memory"
    );
  }
  if (!caps.sharedArrayBuffer) return "SharedArrayBuffer is unavailable in this browser";
  if (!caps.wasmThreads) return "this browser's WebAssembly has no shared memory/atomics";
  return null;
}

export function simdUnavailableReason(caps: Capabilities, builds: BuildSet): string | null {
  if (!builds.simd) return "this lean-js build has no single-thread WebAssembly build";
  if (!caps.wasmSimd) return "this browser's WebAssembly has no SIMD (simd128)";
  return null;
}

/**
 * Picks the backend. `auto` takes the first of webgpu → threads → simd that can run (passing
 * over a software WebGPU adapter, and threads on a single core, which the CPU backends beat);
 * a forced backend that cannot run throws a BackendUnavailableError saying why.
 */
export function chooseBackend(
  requested: BackendChoice,
  caps: Capabilities,
  builds: BuildSet,
  needs: GpuNeeds | null = null,
): BackendDecision {
  const gpu = webgpuVerdict(caps, builds, needs);
  const unavailable: Record<Backend, string | null> = {
    webgpu: "unavailable" in gpu ? gpu.unavailable : null,
    threads: threadsUnavailableReason(caps, builds),
    simd: simdUnavailableReason(caps, builds),
  };
  if (requested !== "auto") {
    if (!Object.hasOwn(unavailable, requested)) {
      throw new TypeError(`unknown backend '${String(requested)}' (auto, webgpu, threads or simd)`);
    }
    const reason = unavailable[requested];
    if (reason === null) {
      const how = "how" in gpu && requested === "webgpu" ? `: ${gpu.how}` : "";
      return { backend: requested, reason: `requested${how}`, skipped: [] };
    }
    throw leanError(ErrorName.BackendUnavailable, `the ${requested} backend cannot run here: ${reason}`);
  }
  // A software adapter or one core makes the faster-looking backend slower than the next one.
  if (unavailable.webgpu === null && caps.webgpu.available && caps.webgpu.adapter.isFallbackAdapter) {
    unavailable.webgpu = "only a software (fallback) WebGPU adapter, slower than the CPU backends";
  }
  if (unavailable.threads === null && caps.hardwareConcurrency < 2) {
    unavailable.threads = "one CPU core: threads would not help";
  }
  const skipped: BackendDecision["skipped"] = [];
  for (const backend of ["webgpu", "threads", "simd"] as const) {
    const reason = unavailable[backend];
    if (reason === null) {
      const how = "how" in gpu && backend === "webgpu" ? gpu.how : "the fastest backend available";
      const why = skipped.map((s) => `${s.backend}: ${s.reason}`);
      return { backend, reason: [how, ...why].join("; "), skipped };
    }
    skipped.push({ backend, reason });
  }
  throw leanError(
    ErrorName.BackendUnavailable,
    `no lean backend can run here (${skipped.map((s) => `${s.backend}: ${s.reason}`).join("; ")})`,
  );
}
