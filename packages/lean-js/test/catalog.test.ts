import { createHash } from "node:crypto";
import { createReadStream, statSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { catalog, catalogFiles, findModel } from "../src/catalog.js";
import { haveModel, modelsDir } from "./models.js";

const sha256 = (path: string) =>
  new Promise<string>((resolve, reject) => {
    const hash = createHash("sha256");
    createReadStream(path)
      .on("data", (chunk) => hash.update(chunk))
      .on("end", () => resolve(hash.digest("hex")))
      .on("error", reject);
  });

describe("catalog", () => {
  it("has the four seed models as Q4_0 GGUFs on Hugging Face", () => {
    const seeds = catalog.filter((m) => !m.local).slice(0, 4);
    expect(seeds.map((m) => m.id)).toEqual([
      "smollm2-360m-instruct-q4_0",
      "smollm2-1.7b-instruct-q4_0",
      "qwen2.5-0.5b-instruct-q4_0",
      "qwen2.5-3b-instruct-q4_0",
    ]);
    for (const m of seeds) {
      expect(m.quantization).toBe("Q4_0");
      expect(m.gguf.url).toMatch(/^https:\/\/huggingface\.co\/[^/]+\/[^/]+-GGUF\/resolve\/main\/[^/]+q4_0\.gguf$/i);
      // Tokenizer files come from the original (non-GGUF) repository.
      for (const f of [m.tokenizer, m.tokenizerConfig]) {
        expect(f?.url).toMatch(/^https:\/\/huggingface\.co\/(HuggingFaceTB|Qwen)\/[^/]+-Instruct\/resolve\/main\/tokenizer/);
      }
      expect(m.tokenizer?.url.endsWith("/tokenizer.json")).toBe(true);
      expect(m.tokenizerConfig?.url.endsWith("/tokenizer_config.json")).toBe(true);
    }
  });

  it("has Llama 3.2, Qwen3 and Gemma 3 as Q4_0 GGUFs from ungated repositories", () => {
    const current = catalog.filter((m) => !m.local).slice(4);
    expect(current.map((m) => m.id)).toEqual([
      "llama-3.2-1b-instruct-q4_0",
      "qwen3-0.6b-q4_0",
      "qwen3-1.7b-q4_0",
      "gemma-3-1b-it-q4_0",
    ]);
    for (const m of current) {
      expect(m.quantization).toBe("Q4_0");
      expect(m.gguf.url).toMatch(/^https:\/\/huggingface\.co\/(bartowski|unsloth)\/[^/]+-GGUF\/resolve\/main\/[^/]+-Q4_0\.gguf$/);
      // Gated originals (meta-llama, google): the GGUF's own tokenizer; Qwen's are ungated.
      const qwen = m.id.startsWith("qwen3");
      expect(m.tokenizer?.url ?? null).toBe(qwen ? `https://huggingface.co/Qwen/${m.name.replace(" ", "-")}/resolve/main/tokenizer.json` : null);
      expect(m.tokenizerConfig?.url.endsWith("/tokenizer_config.json") ?? null).toBe(qwen ? true : null);
      expect(m.chatTemplate).toBeNull();
      expect(catalogFiles(m, "http://127.0.0.1/").map((f) => f.role)).toEqual(
        qwen ? ["gguf", "tokenizer", "tokenizerConfig"] : ["gguf"],
      );
    }
  });

  it("has Gemma 3 270M as a local test model: a GGUF alone", () => {
    const gemma = findModel("gemma-3-270m-q4_k_m")!;
    expect(gemma.local).toBe(true);
    expect(catalogFiles(gemma, "http://127.0.0.1/models/")).toEqual([
      {
        role: "gguf",
        file: {
          url: "http://127.0.0.1/models/gemma-3-270m-q4_k_m.gguf",
          size: 253113024,
          sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        },
      },
    ]);
  });

  it("has unique ids, and findModel finds each", () => {
    const ids = catalog.map((m) => m.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const id of ids) expect(findModel(id)?.id).toBe(id);
    expect(findModel("gpt-5")).toBeUndefined();
  });

  it("resolves local models against the base URL and leaves remote URLs alone", () => {
    const local = catalogFiles(findModel("smollm2-135m-instruct-q4_0")!, "http://127.0.0.1:5173/app/models/");
    expect(local.map((f) => [f.role, f.file.url])).toEqual([
      ["gguf", "http://127.0.0.1:5173/app/models/smollm2-135m-instruct-q4_0.gguf"],
      ["tokenizer", "http://127.0.0.1:5173/app/models/smollm2-135m-instruct/tokenizer.json"],
      ["tokenizerConfig", "http://127.0.0.1:5173/app/models/smollm2-135m-instruct/tokenizer_config.json"],
      ["chatTemplate", "http://127.0.0.1:5173/app/models/smollm2-135m-instruct/chat_template.jinja"],
    ]);
    const remote = findModel("qwen2.5-0.5b-instruct-q4_0")!;
    expect(catalogFiles(remote, "http://127.0.0.1/models/").map((f) => f.file.url)).toEqual([
      remote.gguf.url,
      remote.tokenizer?.url,
      remote.tokenizerConfig?.url,
    ]);
  });

  it("lists only the files an entry has: a GGUF alone, or with some tokenizer files", () => {
    const model = findModel("smollm2-135m-instruct-q4_0")!;
    const base = "http://127.0.0.1/models/";
    const alone = { ...model, tokenizer: null, tokenizerConfig: null, chatTemplate: null };
    expect(catalogFiles(alone, base)).toEqual([
      { role: "gguf", file: { ...model.gguf, url: `${base}smollm2-135m-instruct-q4_0.gguf` } },
    ]);
    const templateOnly = { ...alone, chatTemplate: model.chatTemplate };
    expect(catalogFiles(templateOnly, base).map((f) => f.role)).toEqual(["gguf", "chatTemplate"]);
  });

  it("pins the exact size and sha256 of every local test file", async (context) => {
    for (const model of catalog.filter((m) => m.local)) {
      for (const { file } of catalogFiles(model, "file:///")) {
        const relative = file.url.slice("file:///".length);
        if (!haveModel(relative, (note) => context.skip(note))) return;
        const path = join(modelsDir, relative);
        expect(statSync(path).size, relative).toBe(file.size);
        expect(await sha256(path), relative).toBe(file.sha256);
      }
    }
  }, 60_000);
});
