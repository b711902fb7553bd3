/**
 * Models lean-js knows by id: the four seed models (Q4_0 GGUFs on Hugging Face, tokenizer files
 * from the original repositories), the 2025 small models (Llama 3.2, Qwen3, Gemma 3; see
 * `currentModels`), all fetched at run time and never bundled, and lean's test models,
 * which an app serves itself (URLs relative to `modelBaseUrl`). An entry without tokenizer
 * files runs on the tokenizer and chat template in its GGUF's own metadata.
 */
import type { GpuNeeds, ModelFileRole } from "./protocol.js";

export interface CatalogFile {
  /** Absolute URL, or relative to `modelBaseUrl` for a `local` model. */
  url: string;
  /** Exact size in bytes and sha256 (hex), checked when known. */
  size: number | null;
  sha256: string | null;
}

export interface CatalogModel {
  id: string;
  name: string;
  parameters: string;
  quantization: string;
  /** Download size for display (the exact one is `gguf.size`, when known). */
  approxBytes: number;
  /** A context length that suits the model in a browser (its own can be far larger). */
  defaultContextLength: number;
  /** Served by the app rather than downloaded from Hugging Face (lean's test models). */
  local: boolean;
  gguf: CatalogFile;
  /** tokenizer.json; null: the tokenizer comes from the GGUF's metadata (`tokenizer.ggml.*`). */
  tokenizer: CatalogFile | null;
  /** tokenizer_config.json (its settings win over the GGUF's), when there is one. */
  tokenizerConfig: CatalogFile | null;
  /** chat_template.jinja, which wins over the config's and the GGUF's template. */
  chatTemplate: CatalogFile | null;
  gpu: GpuNeeds | null;
}

const hf = (repo: string, file: string): CatalogFile => ({
  url: `https://huggingface.co/${repo}/resolve/main/${file}`,
  size: null,
  sha256: null,
});

/** The seed models. Sizes and checksums are not pinned: the files live in others' repositories. */
const seedModels: CatalogModel[] = [
  {
    id: "smollm2-360m-instruct-q4_0",
    name: "SmolLM2 360M Instruct",
    parameters: "360M",
    quantization: "Q4_0",
    approxBytes: 229e6,
    defaultContextLength: 4096,
    local: false,
    gguf: hf("bartowski/SmolLM2-360M-Instruct-GGUF", "SmolLM2-360M-Instruct-Q4_0.gguf"),
    tokenizer: hf("HuggingFaceTB/SmolLM2-360M-Instruct", "tokenizer.json"),
    tokenizerConfig: hf("HuggingFaceTB/SmolLM2-360M-Instruct", "tokenizer_config.json"),
    chatTemplate: null,
    gpu: null,
  },
  {
    id: "smollm2-1.7b-instruct-q4_0",
    name: "SmolLM2 1.7B Instruct",
    parameters: "1.7B",
    quantization: "Q4_0",
    approxBytes: 994e6,
    // No grouped-query attention: its f32 KV cache takes 384 KiB per token.
    defaultContextLength: 2048,
    local: false,
    gguf: hf("bartowski/SmolLM2-1.7B-Instruct-GGUF", "SmolLM2-1.7B-Instruct-Q4_0.gguf"),
    tokenizer: hf("HuggingFaceTB/SmolLM2-1.7B-Instruct", "tokenizer.json"),
    tokenizerConfig: hf("HuggingFaceTB/SmolLM2-1.7B-Instruct", "tokenizer_config.json"),
    chatTemplate: null,
    gpu: null,
  },
  {
    id: "qwen2.5-0.5b-instruct-q4_0",
    name: "Qwen2.5 0.5B Instruct",
    parameters: "0.5B",
    quantization: "Q4_0",
    approxBytes: 429e6,
    defaultContextLength: 4096,
    local: false,
    gguf: hf("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_0.gguf"),
    tokenizer: hf("Qwen/Qwen2.5-0.5B-Instruct", "tokenizer.json"),
    tokenizerConfig: hf("Qwen/Qwen2.5-0.5B-Instruct", "tokenizer_config.json"),
    chatTemplate: null,
    gpu: null,
  },
  {
    id: "qwen2.5-3b-instruct-q4_0",
    name: "Qwen2.5 3B Instruct",
    parameters: "3B",
    quantization: "Q4_0",
    approxBytes: 1.82e9,
    // The model (one allocation, at most 2 GiB on wasm32) and its 288 MiB KV cache fit in 4 GiB.
    defaultContextLength: 4096,
    local: false,
    gguf: hf("Qwen/Qwen2.5-3B-Instruct-GGUF", "qwen2.5-3b-instruct-q4_0.gguf"),
    tokenizer: hf("Qwen/Qwen2.5-3B-Instruct", "tokenizer.json"),
    tokenizerConfig: hf("Qwen/Qwen2.5-3B-Instruct", "tokenizer_config.json"),
    chatTemplate: null,
    gpu: null,
  },
];

/**
 * The 2025 small models (architectures `llama` with Llama 3's rope scaling, `qwen3`, `gemma3`).
 * Unverified: these URLs and sizes were written where Hugging Face could not be reached, so
 * neither was checked against the repositories. They were chosen as (1) ungated repositories
 * (meta-llama's and google's are gated, so their GGUFs come from bartowski's and unsloth's
 * re-quantizations, which llama.cpp's converter made; Qwen's own Qwen3-*-GGUF repositories carry
 * no Q4 file for the small sizes, so unsloth's), (2) Q4_0, like the seed models, under the file
 * names those repositories use, and (3) `approxBytes` estimated from the parameter counts
 * (Q4_0 layers; the tied embedding Q6_K, or Q8_0 for Gemma 3's 1152-wide rows, as llama.cpp
 * quantizes the output head). The Llama and Gemma entries have no tokenizer files (the
 * originals are gated): they run on the GGUF's own tokenizer and chat template. The Qwen3
 * entries take theirs from Qwen's (ungated) original repositories, as the seed models do.
 */
const currentModels: CatalogModel[] = [
  {
    id: "llama-3.2-1b-instruct-q4_0",
    name: "Llama 3.2 1B Instruct",
    parameters: "1.2B",
    quantization: "Q4_0",
    approxBytes: 771e6,
    // 64 KiB of f32 KV cache per token (8 KV heads of 64, 16 layers).
    defaultContextLength: 4096,
    local: false,
    gguf: hf("bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_0.gguf"),
    tokenizer: null,
    tokenizerConfig: null,
    chatTemplate: null,
    gpu: null,
  },
  {
    id: "qwen3-0.6b-q4_0",
    name: "Qwen3 0.6B",
    parameters: "0.6B",
    quantization: "Q4_0",
    approxBytes: 382e6,
    // 224 KiB of f32 KV cache per token (8 KV heads of 128, 28 layers).
    defaultContextLength: 2048,
    local: false,
    gguf: hf("unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q4_0.gguf"),
    tokenizer: hf("Qwen/Qwen3-0.6B", "tokenizer.json"),
    tokenizerConfig: hf("Qwen/Qwen3-0.6B", "tokenizer_config.json"),
    chatTemplate: null,
    gpu: null,
  },
  {
    id: "qwen3-1.7b-q4_0",
    name: "Qwen3 1.7B",
    parameters: "1.7B",
    quantization: "Q4_0",
    approxBytes: 1.06e9,
    // 224 KiB of f32 KV cache per token, as 0.6B.
    defaultContextLength: 2048,
    local: false,
    gguf: hf("unsloth/Qwen3-1.7B-GGUF", "Qwen3-1.7B-Q4_0.gguf"),
    tokenizer: hf("Qwen/Qwen3-1.7B", "tokenizer.json"),
    tokenizerConfig: hf("Qwen/Qwen3-1.7B", "tokenizer_config.json"),
    chatTemplate: null,
    gpu: null,
  },
  {
    id: "gemma-3-1b-it-q4_0",
    name: "Gemma 3 1B Instruct",
    parameters: "1B",
    quantization: "Q4_0",
    approxBytes: 720e6,
    // 52 KiB of f32 KV cache per token (one KV head of 256, 26 layers).
    defaultContextLength: 4096,
    local: false,
    gguf: hf("unsloth/gemma-3-1b-it-GGUF", "gemma-3-1b-it-Q4_0.gguf"),
    tokenizer: null,
    tokenizerConfig: null,
    chatTemplate: null,
    gpu: null,
  },
];

const local = (url: string, size: number, sha256: string): CatalogFile => ({ url, size, sha256 });

const smolTokenizer = {
  tokenizer: local(
    "smollm2-135m-instruct/tokenizer.json",
    3522871,
    "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
  ),
  tokenizerConfig: local(
    "smollm2-135m-instruct/tokenizer_config.json",
    297,
    "156c41a2e14e6e6bd4286c506c38ee883a78e0f5ce165ad9bf63fe73ebf9e974",
  ),
  chatTemplate: local(
    "smollm2-135m-instruct/chat_template.jinja",
    368,
    "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
  ),
};

const qwenTokenizer = {
  tokenizer: local(
    "qwen2.5-coder-0.5b-instruct/tokenizer.json",
    11430690,
    "870929f6937e07fc88e0bc62333a39c5fe97bcbea944ea9d3a6ffcf760ef360d",
  ),
  tokenizerConfig: local(
    "qwen2.5-coder-0.5b-instruct/tokenizer_config.json",
    315,
    "a90199bf23062e740eb628b94e3eb0c2eb95be5d65d8023f665f9455324d580a",
  ),
  chatTemplate: local(
    "qwen2.5-coder-0.5b-instruct/chat_template.jinja",
    2507,
    "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
  ),
};

function testModel(
  id: string,
  quantization: string,
  size: number,
  sha256: string,
  gpu: GpuNeeds,
): CatalogModel {
  const smol = id.startsWith("smollm2");
  return {
    id,
    name: `${smol ? "SmolLM2 135M Instruct" : "Qwen2.5-Coder 0.5B Instruct"} (${quantization}, test model)`,
    parameters: smol ? "135M" : "0.5B",
    quantization,
    approxBytes: size,
    defaultContextLength: 2048,
    local: true,
    gguf: local(`${id}.gguf`, size, sha256),
    ...(smol ? smolTokenizer : qwenTokenizer),
    gpu,
  };
}

/** lean's test models (scripts/fetch-test-models.sh), laid out as the repository's models/. */
const testModels: CatalogModel[] = [
  testModel("smollm2-135m-instruct-q4_0", "Q4_0", 77571136,
    "dc51cbdc90dfb5c74a00a173bbc5ff4609f0df10a2a535040d484246c347da16",
    { largestTensorBytes: 15925248, largestRowBytes: 864 }),
  testModel("smollm2-135m-instruct-q4_1", "Q4_1", 98362432,
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    { largestTensorBytes: 30081024, largestRowBytes: 960 }),
  testModel("smollm2-135m-instruct-q8_0", "Q8_0", 144811072,
    "0c1d3326cd9793cfb7296113c063dd5c24e2bd734b48ec1a3d01b7158eca9387",
    { largestTensorBytes: 30081024, largestRowBytes: 1632 }),
  testModel("qwen2.5-coder-0.5b-instruct-q4_0", "Q4_0", 428730240,
    "c167f84bf35f9a22df8d67cfaa5fbd058de06a26a06ea05131c4a9d6b0c8a515",
    { largestTensorBytes: 144643072, largestRowBytes: 2736 }),
  testModel("qwen2.5-coder-0.5b-instruct-q4_k_m", "Q4_K_M", 491400064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    { largestTensorBytes: 144643072, largestRowBytes: 3990 }),
  // Gemma 3 270M (the base model: no chat template anywhere, raw completion only), as a GGUF
  // alone: its SentencePiece tokenizer comes from the GGUF's metadata.
  {
    id: "gemma-3-270m-q4_k_m",
    name: "Gemma 3 270M (Q4_K_M, test model)",
    parameters: "270M",
    quantization: "Q4_K_M",
    approxBytes: 253113024,
    defaultContextLength: 2048,
    local: true,
    gguf: local(
      "gemma-3-270m-q4_k_m.gguf",
      253113024,
      "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    tokenizer: null,
    tokenizerConfig: null,
    chatTemplate: null,
    gpu: { largestTensorBytes: 178257920, largestRowBytes: 1680 },
  },
];

export const catalog: readonly CatalogModel[] = [...seedModels, ...currentModels, ...testModels];

export function findModel(id: string): CatalogModel | undefined {
  return catalog.find((m) => m.id === id);
}

/** Every file of `model` (the GGUF first, then those of the tokenizer it has), with URLs made absolute (`modelBaseUrl` for local models). */
export function catalogFiles(
  model: CatalogModel,
  modelBaseUrl: string | URL,
): { role: ModelFileRole; file: CatalogFile }[] {
  const absolute = (f: CatalogFile): CatalogFile =>
    model.local ? { ...f, url: new URL(f.url, modelBaseUrl).href } : f;
  const files: { role: ModelFileRole; file: CatalogFile }[] = [{ role: "gguf", file: absolute(model.gguf) }];
  for (const role of ["tokenizer", "tokenizerConfig", "chatTemplate"] as const) {
    const file = model[role];
    if (file) files.push({ role, file: absolute(file) });
  }
  return files;
}
