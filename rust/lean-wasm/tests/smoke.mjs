// Node smoke test of the wasm build (pkg-node/, from scripts/build-wasm.sh):
//   node rust/lean-wasm/tests/smoke.mjs
// Greedy tokens must equal the Hugging Face reference; bad input must give readable JS errors.
// Models: $LEAN_MODELS (default: the repository's models/); missing models skip, or fail if $CI.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, "..", "..", "..");
const models = process.env.LEAN_MODELS ?? join(repo, "models");
const ggufPath = join(models, "smollm2-135m-instruct-q4_0.gguf");
const tokenizerDir = join(models, "smollm2-135m-instruct");
const fixture = JSON.parse(
  readFileSync(join(repo, "fixtures", "hf", "smollm2-135m-instruct-q4_0.json"), "utf8"),
);
const chatShort = fixture.cases.find((c) => c.name === "chat_short");

if (!existsSync(ggufPath)) {
  if (process.env.CI) throw new Error(`model missing: ${ggufPath}`);
  console.log(`skipping the wasm smoke test: ${ggufPath} not found (set LEAN_MODELS)`);
  process.exit(0);
}

// --target nodejs glue is CommonJS.
const { WasmEngine, backend, takePanicMessage } = createRequire(import.meta.url)(
  join(here, "..", "pkg-node", "lean_wasm.js"),
);

const tokenizerJson = readFileSync(join(tokenizerDir, "tokenizer.json"));
const tokenizerConfig = readFileSync(join(tokenizerDir, "tokenizer_config.json"));
const chatTemplate = readFileSync(join(tokenizerDir, "chat_template.jinja"), "utf8");
const newEngine = (gguf) =>
  new WasmEngine(gguf, tokenizerJson, tokenizerConfig, chatTemplate, 2048);

const ggufBytes = readFileSync(ggufPath);
const engine = newEngine(ggufBytes);

/** Runs a generation, recording every callback with its time. */
function generate(prompt, options, stopAfter = Infinity) {
  const events = [];
  const json = engine.generate(JSON.stringify(prompt), JSON.stringify(options), (text, id) => {
    events.push({ text, id, at: performance.now() });
    return events.length < stopAfter;
  });
  return { result: JSON.parse(json), events };
}

test("backend is the single-thread simd build", () => {
  assert.equal(backend(), "simd");
  assert.equal(engine.contextLength(), 2048);
});

test("greedy chat tokens equal the HF reference", () => {
  const max = 16;
  const { result, events } = generate({ messages: chatShort.messages }, { max_tokens: max });
  assert.deepEqual(result.prompt_ids, chatShort.prompt_ids);
  assert.deepEqual(result.token_ids, chatShort.greedy_ids.slice(0, max));
  assert.equal(result.finish_reason, "length");
  assert.deepEqual(events.map((e) => e.id), result.token_ids);
  assert.equal(events.map((e) => e.text).join(""), result.text);
  assert.ok(chatShort.greedy_text.startsWith(result.text), result.text);
});

test("tokenize matches a raw prompt's ids", () => {
  const ids = Array.from(engine.tokenize(chatShort.prompt_text));
  assert.deepEqual(ids, chatShort.prompt_ids);
});

test("a callback returning false cancels", () => {
  const { result } = generate({ ids: chatShort.prompt_ids }, { max_tokens: 16 }, 3);
  assert.deepEqual(result.token_ids, chatShort.greedy_ids.slice(0, 3));
  assert.equal(result.finish_reason, "cancelled");
});

test("a throwing callback's exception reaches the caller", () => {
  assert.throws(
    () => engine.generate(JSON.stringify({ raw: "Hi" }), "{}", () => {
      throw new RangeError("from the callback");
    }),
    { name: "RangeError", message: "from the callback" },
  );
});

test("bad options are refused with a readable message", () => {
  assert.throws(
    () => engine.generate(JSON.stringify({ raw: "Hi" }), '{"max_token": 4}', () => true),
    (e) => e instanceof Error && /invalid options JSON: unknown field `max_token`/.test(e.message),
  );
  assert.throws(
    () => engine.generate(JSON.stringify({ raw: "Hi" }), '{"temperature": -1}', () => true),
    (e) => e instanceof Error && /temperature/.test(e.message),
  );
});

test("a corrupt GGUF gives a JS Error naming the GGUF problem; the engine still works", () => {
  assert.throws(
    () => newEngine(ggufBytes.subarray(0, 1000)),
    (e) => e instanceof Error && /invalid GGUF file/.test(e.message),
  );
  const { result } = generate({ ids: chatShort.prompt_ids }, { max_tokens: 4 });
  assert.deepEqual(result.token_ids, chatShort.greedy_ids.slice(0, 4));
});

test("decode speed (single thread, simd128)", () => {
  const max = 64;
  // No stop ids, so that every run decodes exactly `max` tokens.
  const started = performance.now();
  const { result, events } = generate({ ids: chatShort.prompt_ids }, {
    max_tokens: max,
    stop_token_ids: [],
  });
  assert.equal(result.token_ids.length, max);
  const prefillMs = events[0].at - started;
  // The first token comes out of the prefill; the rate counts the ones after it.
  const decodeTokPerS = ((max - 1) * 1000) / (events.at(-1).at - events[0].at);
  console.log(
    `prefill ${chatShort.prompt_ids.length} tokens: ${prefillMs.toFixed(0)} ms; ` +
      `decode: ${decodeTokPerS.toFixed(1)} tok/s over ${max - 1} tokens`,
  );
});

test("no Rust panic was recorded along the way", () => {
  assert.equal(takePanicMessage(), undefined);
});
