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
const { ModelLoader, WasmEngine, backend, takePanicMessage } = createRequire(import.meta.url)(
  join(here, "..", "pkg-node", "lean_wasm.js"),
);

const tokenizerJson = readFileSync(join(tokenizerDir, "tokenizer.json"));
const tokenizerConfig = readFileSync(join(tokenizerDir, "tokenizer_config.json"));
const chatTemplate = readFileSync(join(tokenizerDir, "chat_template.jinja"), "utf8");
const newEngine = (gguf) =>
  new WasmEngine(gguf, tokenizerJson, tokenizerConfig, chatTemplate, 2048);

const ggufBytes = readFileSync(ggufPath);
/** Streams `bytes` into a ModelLoader in chunks of `chunk` bytes, as lean-js does from fetch(). */
function loadInChunks(bytes, chunk) {
  const loader = new ModelLoader(bytes.length);
  for (let at = 0; at < bytes.length; at += chunk) loader.push(bytes.subarray(at, at + chunk));
  assert.equal(loader.received, bytes.length);
  return loader.finish(tokenizerJson, tokenizerConfig, chatTemplate, 2048);
}
// The engine the tests share comes through the streaming loader (an odd chunk size, so that
// chunks straddle every alignment).
const engine = loadInChunks(ggufBytes, 1_000_003);
const rawShort = fixture.cases.find((c) => c.name === "raw_short");

/** Runs begin + step until done, collecting the tokens of every step (both return Promises). */
async function stepAll(prompt, options) {
  const begun = JSON.parse(await engine.begin(JSON.stringify(prompt), JSON.stringify(options)));
  const tokens = [];
  for (;;) {
    const step = JSON.parse(await engine.step());
    tokens.push(...step.tokens);
    if (step.done) return { begun, tokens, result: step.done };
  }
}

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

test("the streaming loader refuses wrong sizes with readable errors", () => {
  assert.throws(() => new ModelLoader(-1), /whole number of bytes, got -1/);
  assert.throws(() => new ModelLoader(1.5), /whole number of bytes, got 1.5/);
  assert.throws(() => new ModelLoader(3 * 2 ** 30), /at most 2048.0 MiB in one buffer/);
  const tooLong = new ModelLoader(10);
  tooLong.push(new Uint8Array(6));
  assert.throws(
    () => tooLong.push(new Uint8Array(5)),
    /longer than the announced 10 bytes \(received 6 \+ 5\)/,
  );
  assert.throws(
    () => tooLong.finish(tokenizerJson, tokenizerConfig, chatTemplate, 2048),
    /ended after 6 of 10 bytes \(an interrupted download\?\)/,
  );
  const corrupt = new ModelLoader(1000);
  corrupt.push(ggufBytes.subarray(0, 1000));
  assert.throws(
    () => corrupt.finish(tokenizerJson, tokenizerConfig, chatTemplate, 2048),
    /invalid GGUF file/,
  );
});

test("a GGUF alone: the tokenizer and chat template come from its metadata, exactly", () => {
  // No tokenizer.json: ModelLoader.finish and the constructor take it as optional.
  const loader = new ModelLoader(ggufBytes.length);
  loader.push(ggufBytes);
  const lone = loader.finish(undefined, undefined, undefined, 512);
  try {
    const info = JSON.parse(lone.info());
    assert.equal(info.tokenizer_from_gguf, true);
    assert.equal(info.has_chat_template, true);
    assert.deepEqual(Array.from(lone.tokenize(chatShort.prompt_text)), chatShort.prompt_ids);
    const json = lone.generate(JSON.stringify({ messages: chatShort.messages }), '{"max_tokens": 8}', () => true);
    const result = JSON.parse(json);
    assert.deepEqual(result.prompt_ids, chatShort.prompt_ids);
    assert.deepEqual(result.token_ids, chatShort.greedy_ids.slice(0, 8));
  } finally {
    lone.free();
  }
  // Explicit files still win: this engine was built from tokenizer.json.
  assert.equal(JSON.parse(engine.info()).tokenizer_from_gguf, false);
});

test("a GGUF without tokenizer metadata and no tokenizer.json: a readable error", () => {
  // tokenizer.ggml.model renamed (same length): the file stays valid but has no tokenizer.
  const key = Buffer.from("tokenizer.ggml.model");
  const patched = Buffer.from(ggufBytes);
  const at = patched.indexOf(key);
  assert.ok(at > 0);
  patched[at + key.length - 1] = "X".charCodeAt(0);
  assert.throws(
    () => new WasmEngine(patched, null, null, null, 512),
    (e) => e instanceof Error && /the file has no tokenizer \(no tokenizer\.ggml\.model\); give a tokenizer\.json/.test(e.message),
  );
});

test("info describes the model and the stop ids", () => {
  const info = JSON.parse(engine.info());
  assert.equal(info.architecture, "llama");
  assert.equal(info.backend.length > 0, true);
  assert.equal(info.context_length, 2048);
  assert.equal(info.train_context_length, 8192);
  assert.equal(info.vocab_size, 49152);
  assert.equal(info.file_bytes, ggufBytes.length);
  // 30 layers × 3 kv heads × 64 dims × 2048 positions, keys and values, f32.
  assert.equal(info.kv_cache_bytes, 2 * 30 * 3 * 64 * 2048 * 4);
  assert.equal(info.eos_token, "<|im_end|>");
  assert.deepEqual(info.eos_token_ids, [2, 0]);
  assert.equal(info.has_chat_template, true);
});

test("begin + step give the reference tokens one per step, and stop at an eos id", async () => {
  const { begun, tokens, result } = await stepAll({ raw: rawShort.prompt }, { max_tokens: 40 });
  assert.deepEqual(begun.prompt_ids, rawShort.prompt_ids);
  const eos = JSON.parse(engine.info()).eos_token_ids;
  const stopAt = rawShort.greedy_ids.findIndex((id) => eos.includes(id));
  assert.ok(stopAt > 0, "the reference continues past an eos id");
  assert.deepEqual(result.token_ids, rawShort.greedy_ids.slice(0, stopAt + 1));
  assert.equal(result.finish_reason, "stop");
  // The stop id is in token_ids but not streamed.
  assert.deepEqual(tokens.map((t) => t.id), rawShort.greedy_ids.slice(0, stopAt));
  assert.equal(tokens.map((t) => t.text).join(""), result.text);
  assert.ok(rawShort.greedy_text.startsWith(result.text), result.text);
  await assert.rejects(engine.step(), /no generation in progress: call begin first/);
});

test("cancel ends a generation; the next one is exact again", async () => {
  await engine.begin(JSON.stringify({ ids: chatShort.prompt_ids }), "{}");
  const first = JSON.parse(await engine.step());
  assert.deepEqual(first.tokens.map((t) => t.id), chatShort.greedy_ids.slice(0, 1));
  const cancelled = JSON.parse(engine.cancel());
  assert.equal(cancelled.done.finish_reason, "cancelled");
  assert.deepEqual(cancelled.done.token_ids, chatShort.greedy_ids.slice(0, 1));
  assert.equal(engine.cancel(), undefined);
  const { result } = await stepAll({ messages: chatShort.messages }, { max_tokens: 8 });
  assert.deepEqual(result.token_ids, chatShort.greedy_ids.slice(0, 8));
  assert.equal(result.finish_reason, "length");
});

test("a new begin abandons the generation in progress", async () => {
  await engine.begin(JSON.stringify({ raw: "Once upon a time" }), "{}");
  await engine.step();
  const { result } = await stepAll({ ids: chatShort.prompt_ids }, { max_tokens: 5 });
  assert.deepEqual(result.token_ids, chatShort.greedy_ids.slice(0, 5));
});

test("sampling: step-wise equals generate, the seed decides", async () => {
  const options = { max_tokens: 12, temperature: 0.8, top_k: 40, top_p: 0.9, seed: 7,
    repetition_penalty: 1.1, stop_token_ids: [] };
  const stepped = (await stepAll({ messages: chatShort.messages }, options)).result;
  const generated = generate({ messages: chatShort.messages }, options).result;
  assert.deepEqual(stepped, generated);
  const reseeded = (await stepAll({ messages: chatShort.messages }, { ...options, seed: 8 })).result;
  assert.notDeepEqual(reseeded.token_ids, stepped.token_ids);
});

test("a bad prompt fails in begin and leaves no generation behind", async () => {
  await assert.rejects(engine.begin('{"text": "hi"}', "{}"), /invalid prompt JSON: unknown variant `text`/);
  await assert.rejects(engine.begin('{"ids": []}', "{}"), /the prompt is empty/);
  await assert.rejects(
    engine.begin(JSON.stringify({ ids: new Array(2048).fill(1) }), "{}"),
    /the prompt has 2048 tokens, which leaves no room/,
  );
  await assert.rejects(engine.begin('{"ids": [49152]}', "{}"), /token id 49152 is outside the vocabulary/);
  await assert.rejects(engine.step(), /no generation in progress/);
});

test("a constraint: generate and begin/step give lean-cli's tokens; a rejected one is a ConstraintError", async () => {
  const constrained = JSON.parse(
    readFileSync(join(repo, "fixtures", "constraint", "smollm2-135m-instruct-q4_0.json"), "utf8"),
  );
  const c = constrained.cases.find((k) => k.name === "city");
  const options = { max_tokens: c.max_tokens, constraint: { type: "json_schema", schema: c.schema } };
  const { result } = generate({ messages: c.messages }, options);
  assert.deepEqual(result.token_ids, c.token_ids);
  assert.equal(result.text, c.text);
  assert.equal(result.finish_reason, c.finish_reason);
  const stepped = await stepAll({ messages: c.messages }, options);
  assert.deepEqual(stepped.result.token_ids, c.token_ids);
  const rejected = (constraint) => (e) =>
    e instanceof Error && e.name === "ConstraintError" && e.message.startsWith(`invalid ${constraint}:`);
  assert.throws(
    () => generate({ raw: "Hi" }, { constraint: { type: "json_schema", schema: { type: "strng" } } }),
    rejected("json_schema"),
  );
  await assert.rejects(
    engine.begin(JSON.stringify({ raw: "Hi" }), JSON.stringify({ constraint: { type: "regex", pattern: "(a" } })),
    rejected("regex"),
  );
  await assert.rejects(
    engine.begin(JSON.stringify({ raw: "Hi" }), JSON.stringify({ constraint: { type: "grammar", lark: "start: nope" } })),
    rejected("grammar"),
  );
  // The shape is checked at the boundary: an unknown type or field is refused, not ignored.
  assert.throws(
    () => generate({ raw: "Hi" }, { constraint: { type: "json_schema", json_schema: {} } }),
    /invalid options JSON: .*json_schema/,
  );
  assert.throws(() => generate({ raw: "Hi" }, { constraint: { type: "xml" } }), /unknown variant `xml`/);
  // The engine goes on: a regex, then free text.
  const year = generate({ raw: "The year is" }, { max_tokens: 8, constraint: { type: "regex", pattern: " [0-9]{4}" } });
  assert.match(year.result.text, /^ [0-9]{4}$/);
  assert.equal(year.result.finish_reason, "stop");
  const free = generate({ messages: chatShort.messages }, { max_tokens: 4 });
  assert.deepEqual(free.result.token_ids, chatShort.greedy_ids.slice(0, 4));
});

test("tools: a forced call gives lean-cli's call through generate and begin/step; bad tools are a ToolError", async () => {
  const fixture = JSON.parse(readFileSync(join(repo, "fixtures", "tools", "smollm2-135m-instruct-q4_0.json"), "utf8"));
  const c = fixture.cases.find((k) => k.name === "forced");
  const options = {
    max_tokens: c.max_tokens,
    tools: fixture.tools,
    tool_choice: { type: "function", function: { name: c.tool_choice } },
  };
  const strip = (calls) => calls.map(({ type, function: f }) => ({ type, function: f }));
  const { result, events } = generate({ messages: c.messages }, options);
  assert.deepEqual(result.prompt_ids, c.prompt_ids);
  assert.deepEqual(result.token_ids, c.token_ids);
  assert.equal(result.finish_reason, "tool_calls");
  assert.deepEqual(strip(result.tool_calls), c.tool_calls);
  assert.match(result.tool_calls[0].id, /^call_[A-Za-z0-9]{24}$/);
  // The call's text is held back, never streamed.
  assert.equal(events.map((e) => e.text).join(""), c.content ?? "");
  const stepped = await stepAll({ messages: c.messages }, options);
  assert.deepEqual(stepped.result.token_ids, c.token_ids);
  assert.deepEqual(strip(stepped.result.tool_calls), c.tool_calls);
  assert.equal(stepped.tokens.map((t) => t.text).join(""), c.content ?? "");
  // Cut off by max_tokens: no call, "length", the partial call as text.
  const cut = generate({ messages: c.messages }, { ...options, max_tokens: 4 });
  assert.equal(cut.result.finish_reason, "length");
  assert.equal(cut.result.tool_calls, undefined);
  assert.equal(cut.events.map((e) => e.text).join(""), cut.result.text);

  const toolError = (pattern) => (e) => e instanceof Error && e.name === "ToolError" && pattern.test(e.message);
  const call = (tools, choice, prompt = { messages: c.messages }) =>
    engine.generate(JSON.stringify(prompt), JSON.stringify({ max_tokens: 2, tools, tool_choice: choice }), () => true);
  assert.throws(() => call([{ type: "retrieval" }]), toolError(/lean takes 'function' tools only/));
  assert.throws(
    () => call(fixture.tools, { type: "function", function: { name: "nope" } }),
    toolError(/names the function 'nope', which is not among 'tools'/),
  );
  assert.throws(
    () => call([{ type: "function", function: { name: "f", parameters: { type: "strng" } } }], "required"),
    toolError(/^a function's parameters schema is not usable: .*strng/),
  );
  assert.throws(() => call(fixture.tools, "auto", { raw: "Hi" }), toolError(/not to raw text or ids/));
  await assert.rejects(
    engine.begin(JSON.stringify({ messages: c.messages }), JSON.stringify({ tools: 3 })),
    toolError(/'tools' must be an array/),
  );
  // The engine goes on.
  const again = generate({ messages: c.messages }, { ...options, max_tokens: 4 });
  assert.deepEqual(again.result.token_ids, c.token_ids.slice(0, 4));
});

test("a draft model: the same greedy ids with guesses accepted; another vocabulary is refused, naming it", () => {
  const draftPath = join(models, "smollm2-135m-instruct-q8_0.gguf");
  if (!existsSync(draftPath)) {
    if (process.env.CI) throw new Error(`model missing: ${draftPath}`);
    return;
  }
  const target = loadInChunks(ggufBytes, 8 << 20);
  const run = (options) =>
    JSON.parse(target.generate(JSON.stringify({ ids: chatShort.prompt_ids }), JSON.stringify(options), () => true));
  const drafterOf = (bytes) => {
    const loader = new ModelLoader(bytes.length);
    loader.push(bytes);
    return loader;
  };
  const options = { max_tokens: chatShort.greedy_ids.length, stop_token_ids: [] };
  assert.throws(() => run({ ...options, draft: 4 }), /speculation by a draft model needs one: load it first/);
  assert.throws(() => run({ ...options, draft: 4, lookup: 4 }), /'draft' does not combine with 'lookup' or 'prediction'/);
  assert.throws(() => target.setDraftModel(drafterOf(ggufBytes.subarray(0, 1000))), /the draft model: .*GGUF/);
  // The Q4_0 file with one token of its list changed: the first difference is named.
  const renamed = Buffer.from(ggufBytes);
  const at = renamed.indexOf("<|endoftext|>");
  renamed[at + 10] = "T".charCodeAt(0);
  assert.throws(
    () => target.setDraftModel(drafterOf(renamed)),
    /the draft model's token 0 is "<\|endoftexT\|>", the model's "<\|endoftext\|>": a draft model must share the model's tokenizer/,
  );
  assert.equal(JSON.parse(target.info()).draft_model, null);

  const described = target.setDraftModel(drafterOf(readFileSync(draftPath)));
  assert.match(described, / on cpu \(simd128, 1 thread\)$/);
  assert.equal(JSON.parse(target.info()).draft_model, described);
  const drafted = run({ ...options, draft: 4 });
  assert.deepEqual(drafted.token_ids, chatShort.greedy_ids);
  assert.ok(drafted.speculation.accepted_tokens > 0, JSON.stringify(drafted.speculation));
  target.free();
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
