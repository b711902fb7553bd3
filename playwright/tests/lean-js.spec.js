// lean-js in a real browser (its build, packages/lean-js/dist, on playwright/lean-js-page/):
// - a generation stopped midway, by aborting its AbortSignal or by breaking out of `for await`,
//   leaves the engine ready: the same prompt then gives exactly the HF greedy ids, on the simd
//   and the threads backend;
// - a model loaded from URLs is kept in Cache Storage: after dispose, the second load makes no
//   request for any model file (server.js counts requests per path, the worker's included) and
//   still generates exactly.
// - engine.chat.completions carries the KV cache across turns: the second turn reports cached
//   tokens and replies exactly what HF transformers does (and what a fresh engine does), whole
//   and streamed, on simd and threads;
// - a thread pool that never starts (the worker blocks, as Firefox under automation has made it
//   do) is bounded: backend "auto" falls back to simd and is exact, "threads" fails clearly;
// - structured output: a chat under a JSON schema (responseFormat, and chat.completions'
//   response_format, whole and streamed) gives exactly lean-cli's native output
//   (fixtures/constraint, scripts/gen_constraint_fixtures.py), which parses and validates; a
//   schema the constraint library rejects is a ConstraintError and the engine goes on; max_tokens
//   reached first is finish_reason "length"; with speculative decoding (prompt lookup from a
//   prediction of the reply) the same ids; on simd, threads and (Firefox) webgpu;
// - tool calls: a call forced by tool_choice through chat.completions (whole and streamed) gives
//   exactly lean-cli's native call (fixtures/tools, scripts/gen_tool_fixtures.py; SmolLM2's
//   template takes no tools: lean's fallback), its syntax never streamed as content; on simd
//   and threads; the call's result sent back as a "tool" message gives lean-cli's answer;
// Model: smollm2-135m-instruct-q4_0, case chat_short of its fixture (fixtures/hf). Needs
// `npm run build -w lean-js` (scripts/test-browser.sh does it) and $LEAN_MODELS (default
// models/); a missing model skips, or fails when $CI is set.
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modelsDir = process.env.LEAN_MODELS ?? join(repo, "models");
const modelName = "smollm2-135m-instruct-q4_0";
const fixture = JSON.parse(readFileSync(join(repo, "fixtures", "hf", `${modelName}.json`), "utf8"));
const chatShort = fixture.cases.find((c) => c.name === "chat_short");
const greedy = chatShort.greedy_ids;
const constraintFixture = JSON.parse(readFileSync(join(repo, "fixtures", "constraint", `${modelName}.json`), "utf8"));
const toolFixture = JSON.parse(readFileSync(join(repo, "fixtures", "tools", `${modelName}.json`), "utf8"));
const threads = 2;
/** Tokens a stopped generation may make after the stop (each is one wasm call in the worker). */
const slack = 3;

/** The model's files as lean-js takes them: URLs (relative to the page's origin). */
const modelUrls = {
  gguf: `/models/${modelName}.gguf`,
  tokenizer: `/models/${fixture.tokenizer}/tokenizer.json`,
  tokenizerConfig: `/models/${fixture.tokenizer}/tokenizer_config.json`,
  chatTemplate: `/models/${fixture.tokenizer}/chat_template.jinja`,
};

/** Skips the test when the model or lean-js's build is missing, unless $CI is set. */
function requireFiles() {
  const files = [join(modelsDir, `${modelName}.gguf`), join(repo, "packages/lean-js/dist/index.js")];
  const missing = files.filter((f) => !existsSync(f));
  if (missing.length === 0) return;
  const why = `missing ${missing.join(", ")} (set LEAN_MODELS; run npm run build -w lean-js)`;
  if (process.env.CI) throw new Error(why);
  test.skip(true, why);
}

async function openPage(page) {
  await page.goto("/lean-js-page/index.html");
  await page.waitForFunction(() => window.leanJs !== undefined);
}

const call = (page, method, ...args) =>
  page.evaluate(([method, args]) => window.leanJs[method](...args), [method, args]);

/** Requests per path that server.js answered since the last reset. */
async function requestCounts(request) {
  const response = await request.get("/__stats");
  expect(response.ok()).toBe(true);
  return response.json();
}

for (const backend of ["simd", "threads"]) {
  test(`${backend}: after a stopped generation the same prompt gives the reference ids`, async ({ page }) => {
    requireFiles();
    await openPage(page);
    const loaded = await call(page, "load", { model: modelUrls, backend, threads, cache: false });
    expect(loaded).toMatchObject({ backend, crossOriginIsolated: true, warnings: [] });

    // Abort after 3 tokens: the iterator throws the signal's reason and the generation ends
    // "cancelled" within a few tokens (the cancel message gets in between two tokens), its ids
    // a prefix of the reference.
    const aborted = await call(page, "generateAborted", chatShort.messages, greedy.length, 3);
    expect(aborted.streamedIds).toEqual(greedy.slice(0, 3));
    expect(aborted.error?.name).toBe("AbortError");
    expect(aborted.finishReason).toBe("cancelled");
    expect(aborted.tokenIds.length).toBeLessThanOrEqual(3 + slack);
    expect(aborted.tokenIds).toEqual(greedy.slice(0, aborted.tokenIds.length));

    const afterAbort = await call(page, "generate", chatShort.messages, greedy.length);
    expect(afterAbort).toEqual({ streamedIds: greedy, error: null, finishReason: "length", tokenIds: greedy });

    // `break` out of `for await` after 5 tokens: no error, the generation ends "cancelled".
    const broken = await call(page, "generateBroken", chatShort.messages, greedy.length, 5);
    expect(broken.streamedIds).toEqual(greedy.slice(0, 5));
    expect(broken.error).toBeNull();
    expect(broken.finishReason).toBe("cancelled");
    expect(broken.tokenIds.length).toBeLessThanOrEqual(5 + slack);
    expect(broken.tokenIds).toEqual(greedy.slice(0, broken.tokenIds.length));

    const afterBreak = await call(page, "generate", chatShort.messages, greedy.length);
    expect(afterBreak).toEqual({ streamedIds: greedy, error: null, finishReason: "length", tokenIds: greedy });
    console.log(
      `${test.info().project.name} ${backend}: aborted after 3 streamed tokens with ` +
        `${aborted.tokenIds.length} generated, broke after 5 with ${broken.tokenIds.length}`,
    );
    await call(page, "dispose");
  });
}

test("a second load comes from Cache Storage, without a request, and is still exact", async ({ page, request }) => {
  requireFiles();
  await openPage(page);
  // A clean start: an entry left by an earlier run would make the first load a cache hit.
  await call(page, "deleteCached");
  expect(await call(page, "listCached")).toEqual([]);
  await request.delete("/__stats");

  const first = await call(page, "load", { model: modelUrls, backend: "simd" });
  expect(first.sources).toEqual({ gguf: "network", tokenizer: "network", tokenizerConfig: "network", chatTemplate: "network" });
  expect(first.warnings).toEqual([]);
  const firstCounts = await requestCounts(request);
  for (const url of Object.values(modelUrls)) expect(firstCounts[url], url).toBe(1);
  const ggufBytes = statSync(join(modelsDir, `${modelName}.gguf`)).size;
  const origin = new URL(page.url()).origin;
  expect(await call(page, "listCached")).toContainEqual({ url: origin + modelUrls.gguf, bytes: ggufBytes });
  const firstRun = await call(page, "generate", chatShort.messages, greedy.length);
  expect(firstRun.tokenIds).toEqual(greedy);
  await call(page, "dispose");

  const second = await call(page, "load", { model: modelUrls, backend: "simd" });
  expect(second.sources).toEqual({ gguf: "cache", tokenizer: "cache", tokenizerConfig: "cache", chatTemplate: "cache" });
  expect(second.warnings).toEqual([]);
  const secondCounts = await requestCounts(request);
  for (const url of Object.values(modelUrls)) expect(secondCounts[url], `${url} requested again`).toBe(1);
  const secondRun = await call(page, "generate", chatShort.messages, greedy.length);
  expect(secondRun).toEqual({ streamedIds: greedy, error: null, finishReason: "length", tokenIds: greedy });
  console.log(
    `${test.info().project.name}: load from the network ${(first.loadMs / 1000).toFixed(2)} s, ` +
      `from Cache Storage ${(second.loadMs / 1000).toFixed(2)} s`,
  );

  await call(page, "dispose");
  await call(page, "deleteCached");
});

// lean-js on WebGPU: forced, the model streamed into GPU buffers. Software WebGPU takes seconds
// a token, so a few tokens only: a generation aborted after 2 (with decode passes queued ahead),
// then the same prompt, exactly. Firefox only: its lavapipe runs this in seconds where
// Chromium's SwiftShader took 3.6 minutes of CI (Chromium's WebGPU runs in parity.spec.js).
test("webgpu: after a stopped generation the same prompt gives the reference ids", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name === "chromium", "SwiftShader: too slow for CI; runs in Firefox");
  test.setTimeout(15 * 60_000);
  requireFiles();
  await openPage(page);
  const missing = await page.evaluate(async () => {
    try {
      return (await navigator.gpu?.requestAdapter()) ? null : "no WebGPU adapter";
    } catch (e) {
      return `requestAdapter failed: ${e.message}`;
    }
  });
  if (missing !== null) {
    if (process.env.CI) throw new Error(`WebGPU unavailable: ${missing}`);
    test.skip(true, `WebGPU unavailable in this browser: ${missing}`);
  }
  const loaded = await call(page, "load", { model: modelUrls, backend: "webgpu", cache: false });
  expect(loaded).toMatchObject({ backend: "webgpu", warnings: [] });
  const tokens = 4;
  // The aborted run may go on to 2 + 4 queued passes before the cancel gets in, so it asks for
  // more tokens than that: with max_tokens 4 it sometimes ended "length" first (CI, stop 30).
  const abortedMax = 12;
  const aborted = await call(page, "generateAborted", chatShort.messages, abortedMax, 2);
  expect(aborted.streamedIds).toEqual(greedy.slice(0, 2));
  expect(aborted.error?.name).toBe("AbortError");
  expect(aborted.finishReason).toBe("cancelled");
  expect(aborted.tokenIds.length).toBeLessThan(abortedMax);
  expect(aborted.tokenIds).toEqual(greedy.slice(0, aborted.tokenIds.length));
  const again = await call(page, "generate", chatShort.messages, tokens);
  expect(again).toEqual({
    streamedIds: greedy.slice(0, tokens),
    error: null,
    finishReason: "length",
    tokenIds: greedy.slice(0, tokens),
  });
  await call(page, "dispose");
});

test("threads: a pool that never starts falls back to simd (auto), exactly, or fails clearly (threads)", async ({ page }) => {
  requireFiles();
  await openPage(page);
  const blocked = { model: modelUrls, threads, cache: false, threadPoolTimeoutMs: 3000, testHooks: { blockThreadPoolStart: true } };
  const started = Date.now();
  const loaded = await call(page, "load", { ...blocked, backend: "auto" });
  expect(loaded).toMatchObject({
    backend: "simd",
    backendReason: "the threads backend's pool of 2 Web Workers did not start within 3 s, twice, so lean fell back to simd",
    warnings: [],
  });
  const fellBackMs = Date.now() - started;
  const generated = await call(page, "generate", chatShort.messages, greedy.length);
  expect(generated).toEqual({ streamedIds: greedy, error: null, finishReason: "length", tokenIds: greedy });
  await call(page, "dispose");

  const error = await call(page, "loadError", { ...blocked, backend: "threads" });
  expect(error).toEqual({
    name: "BackendUnavailableError",
    message:
      "the threads backend's pool of 2 Web Workers did not start within 3 s, twice: " +
      'choose backend "simd" (or "auto", which falls back to it)',
  });
  console.log(`${test.info().project.name}: a blocked pool start fell back to simd after ${fellBackMs} ms`);
});

for (const backend of ["simd", "threads"]) {
  test(`${backend}: chat.completions carries the KV cache across turns and replies exactly`, async ({ page }) => {
    requireFiles();
    await openPage(page);
    await call(page, "load", { model: modelUrls, backend, threads, cache: false });
    const multiturn = fixture.cases.find((c) => c.name === "chat_multiturn");
    // The reference generated past the end of turn; the API stops there.
    const reference = multiturn.greedy_text.split("<|im_end|>")[0];
    const r = await call(page, "conversation", { first: multiturn.messages.slice(0, 1), second: multiturn.messages, maxTokens: 32 });
    const promptTokens = multiturn.prompt_ids.length;
    expect(r.turn2).toMatchObject({ content: reference, finishReason: "stop", usage: { prompt_tokens: promptTokens } });
    const cached = r.turn2.usage.prompt_tokens_details.cached_tokens;
    expect(cached).toBeGreaterThan(0);
    expect(cached).toBeLessThan(promptTokens);
    expect(r.cachedAfterTurn2).toBe(promptTokens + r.turn2.usage.completion_tokens - 1);
    expect(r.fresh).toMatchObject({ content: reference, finishReason: "stop" });
    expect(r.fresh.usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect(r.streamed).toBe(reference);
    expect(r.streamedUsage.prompt_tokens_details.cached_tokens).toBe(promptTokens - 1);
    console.log(`${test.info().project.name} ${backend}: turn 2 took ${cached} of ${promptTokens} prompt tokens from the cache`);
    await call(page, "dispose");
  });
}

/**
 * The errors of `value` under `schema`, for the keywords fixtures/constraint uses (type, enum,
 * properties, required, additionalProperties, maxLength, minimum, maximum): [] when valid.
 */
function schemaErrors(schema, value, path = "$") {
  const errors = [];
  const types = { object: (v) => v !== null && typeof v === "object" && !Array.isArray(v), string: (v) => typeof v === "string",
    boolean: (v) => typeof v === "boolean", integer: Number.isInteger, number: (v) => typeof v === "number" };
  const known = ["type", "enum", "properties", "required", "additionalProperties", "maxLength", "minimum", "maximum"];
  for (const key of Object.keys(schema)) if (!known.includes(key)) errors.push(`${path}: the test's validator lacks '${key}'`);
  if (schema.type && !types[schema.type](value)) return [...errors, `${path}: not a ${schema.type}: ${JSON.stringify(value)}`];
  if (schema.enum && !schema.enum.includes(value)) errors.push(`${path}: ${JSON.stringify(value)} not in the enum`);
  if (schema.maxLength !== undefined && [...value].length > schema.maxLength) errors.push(`${path}: longer than ${schema.maxLength}`);
  if (schema.minimum !== undefined && value < schema.minimum) errors.push(`${path}: below ${schema.minimum}`);
  if (schema.maximum !== undefined && value > schema.maximum) errors.push(`${path}: above ${schema.maximum}`);
  if (schema.type === "object") {
    for (const key of schema.required ?? []) if (!(key in value)) errors.push(`${path}: '${key}' missing`);
    for (const [key, item] of Object.entries(value)) {
      const sub = schema.properties?.[key];
      if (sub) errors.push(...schemaErrors(sub, item, `${path}.${key}`));
      else if (schema.additionalProperties === false) errors.push(`${path}: '${key}' not allowed`);
    }
  }
  return errors;
}

/** A schema llguidance rejects ("strng" is no JSON type): the error must name it. */
const badSchema = { type: "object", properties: { answer: { type: "strng" } } };

/** Loads `backend` and checks structured output on fixture case `caseName` (see `constrained` in page.js). */
async function checkConstrained(page, backend, caseName, { fast = false } = {}) {
  const c = constraintFixture.cases.find((k) => k.name === caseName);
  await openPage(page);
  const loaded = await call(page, "load", { model: modelUrls, backend, threads, cache: false });
  expect(loaded).toMatchObject({ backend, warnings: [] });
  const cutTokens = 3;
  const started = Date.now();
  const r = await call(page, "constrained", { messages: c.messages, schema: c.schema, maxTokens: c.max_tokens, badSchema, cutTokens, fast });
  const ms = Date.now() - started;
  // lean-cli's native output, token for token; it parses and follows the schema.
  expect(r.chat).toMatchObject({ error: null, tokenIds: c.token_ids, streamedIds: c.token_ids, finishReason: c.finish_reason, text: c.text });
  expect(schemaErrors(c.schema, JSON.parse(r.chat.text))).toEqual([]);
  // The same ids with speculative decoding under the schema, guesses kept.
  expect(r.guessed).toMatchObject({ error: null, tokenIds: c.token_ids });
  expect(r.guessed.accepted).toBeGreaterThan(0);
  expect(r.badError?.name).toBe("ConstraintError");
  expect(r.badError?.message).toMatch(/^invalid json_schema: .*strng/);
  expect(r.usable).toBe(true);
  if (fast) {
    // After the rejected schema the engine goes on.
    expect(r.after).toMatchObject({ error: null, finishReason: "length", tokenIds: [expect.any(Number)] });
  } else {
    // After the rejected schema the engine goes on; max_tokens first: "length", the same start.
    expect(r.streamed).toEqual({ content: c.text, finishReason: "stop" });
    expect(r.cut.finishReason).toBe("length");
    expect(c.text.startsWith(r.cut.content)).toBe(true);
  }
  console.log(
    `${test.info().project.name} ${backend}: constrained chat of ${c.token_ids.length} tokens and the checks around it ` +
      `in ${ms} ms (${Object.entries(r.ms).map(([k, v]) => `${k} ${v}`).join(", ")})`,
  );
  await call(page, "dispose");
}

for (const backend of ["simd", "threads"]) {
  test(`${backend}: a JSON-schema-constrained chat gives lean-cli's output; a rejected schema is a ConstraintError`, async ({ page }) => {
    requireFiles();
    await checkConstrained(page, backend, "city");
  });
}

// WebGPU takes each constrained greedy token on the device (the mask is uploaded, the masked
// argmax reads back 4 bytes). As above, Firefox's lavapipe only, and the shortest case.
test("webgpu: a JSON-schema-constrained chat gives lean-cli's output; a rejected schema is a ConstraintError", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name === "chromium", "SwiftShader: too slow for CI; runs in Firefox");
  test.setTimeout(15 * 60_000);
  requireFiles();
  await openPage(page);
  const missing = await page.evaluate(async () => {
    try {
      return (await navigator.gpu?.requestAdapter()) ? null : "no WebGPU adapter";
    } catch (e) {
      return `requestAdapter failed: ${e.message}`;
    }
  });
  if (missing !== null) {
    if (process.env.CI) throw new Error(`WebGPU unavailable: ${missing}`);
    test.skip(true, `WebGPU unavailable in this browser: ${missing}`);
  }
  await checkConstrained(page, "webgpu", "country", { fast: true });
});

// The forced call on WebGPU (a constrained generation through the masked argmax on the device):
// Firefox's lavapipe only, as above, and whole only (39 tokens at about 1 a second).
test("webgpu: a forced tool call through chat.completions gives lean-cli's call", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name === "chromium", "SwiftShader: too slow for CI; runs in Firefox");
  test.setTimeout(15 * 60_000);
  requireFiles();
  const c = toolFixture.cases.find((k) => k.name === "forced");
  await openPage(page);
  const missing = await page.evaluate(async () => {
    try {
      return (await navigator.gpu?.requestAdapter()) ? null : "no WebGPU adapter";
    } catch (e) {
      return `requestAdapter failed: ${e.message}`;
    }
  });
  if (missing !== null) {
    if (process.env.CI) throw new Error(`WebGPU unavailable: ${missing}`);
    test.skip(true, `WebGPU unavailable in this browser: ${missing}`);
  }
  expect(await call(page, "load", { model: modelUrls, backend: "webgpu", cache: false })).toMatchObject({ backend: "webgpu", warnings: [] });
  const toolChoice = { type: "function", function: { name: c.tool_choice } };
  const r = await call(page, "toolCall", { messages: c.messages, tools: toolFixture.tools, toolChoice, maxTokens: c.max_tokens, wholeOnly: true });
  expect(r.whole).toEqual({ content: c.content, toolCalls: c.tool_calls, finishReason: "tool_calls" });
  console.log(`${test.info().project.name} webgpu: forced tool call, whole ${r.ms.whole} ms`);
  await call(page, "dispose");
});

for (const backend of ["simd", "threads"]) {
  test(`${backend}: a forced tool call through chat.completions gives lean-cli's call, whole and streamed; its result goes back`, async ({ page }) => {
    requireFiles();
    const c = toolFixture.cases.find((k) => k.name === "forced");
    await openPage(page);
    expect(await call(page, "load", { model: modelUrls, backend, threads, cache: false })).toMatchObject({ backend, warnings: [] });
    const toolChoice = { type: "function", function: { name: c.tool_choice } };
    const r = await call(page, "toolCall", { messages: c.messages, tools: toolFixture.tools, toolChoice, maxTokens: c.max_tokens });
    expect(r.whole).toEqual({ content: c.content, toolCalls: c.tool_calls, finishReason: "tool_calls" });
    expect(r.ids).toEqual([expect.stringMatching(/^call_[A-Za-z0-9]{24}$/)]);
    expect(r.streamed).toEqual({ content: c.content ?? "", toolCalls: c.tool_calls.map((k, index) => ({ index, ...k })), finishReason: "tool_calls" });
    const parameters = toolFixture.tools.find((t) => t.function.name === c.tool_choice).function.parameters;
    expect(schemaErrors(parameters, JSON.parse(r.whole.toolCalls[0].function.arguments))).toEqual([]);
    console.log(`${test.info().project.name} ${backend}: forced tool call, whole ${r.ms.whole} ms, streamed ${r.ms.streamed} ms`);

    // The round trip: the call and its result (role "tool") go back; the model answers in text,
    // as lean-cli does with the same messages.
    const back = toolFixture.cases.find((k) => k.name === "round_trip");
    const answer = await call(page, "toolCall", { messages: back.messages, tools: toolFixture.tools, toolChoice: back.tool_choice, maxTokens: back.max_tokens });
    expect(answer.whole).toEqual({ content: back.content, toolCalls: undefined, finishReason: back.finish_reason });
    expect(answer.streamed).toEqual({ content: back.content, toolCalls: [], finishReason: back.finish_reason });
    await call(page, "dispose");
  });
}
