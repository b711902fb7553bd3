// Tool calls through the worker (src/worker.ts) and the real single-thread wasm build, in Node:
// a forced call on SmolLM2 (whose template takes no tools: lean's fallback system message) gives
// exactly lean-cli's native call (fixtures/tools, scripts/gen_tool_fixtures.py), whole and
// streamed, through engine.chat and chat.completions; its arguments follow the schema; the tool's
// result fed back gives lean-cli's answer; a forced call cut off by maxTokens is no call; a bad
// tool is a ToolError and the engine goes on. Needs `npm run build` (src/wasm/) and the test
// models.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { findModel } from "../src/catalog.js";
import { Engine } from "../src/engine.js";
import type { ChatTurn, Tool, ToolChoice } from "../src/protocol.js";
import { inProcessWorker, installFileFetch } from "./in-process-worker.js";
import { modelsDir, repo, wireModel } from "./models.js";

const wasmFile = join(import.meta.dirname, "../src/wasm/simd/lean_wasm_bg.wasm");
const modelId = "smollm2-135m-instruct-q4_0";

interface ToolCase {
  name: string;
  messages: ChatTurn[];
  tool_choice: string;
  max_tokens: number;
  prompt_ids: number[];
  token_ids: number[];
  text: string;
  finish_reason: string;
  content: string | null;
  tool_calls: { type: "function"; function: { name: string; arguments: string } }[];
}
const fixture = JSON.parse(readFileSync(join(repo, "fixtures/tools", `${modelId}.json`), "utf8")) as { tools: Tool[]; cases: ToolCase[] };
const forced = fixture.cases.find((c) => c.name === "forced")!;
const roundTrip = fixture.cases.find((c) => c.name === "round_trip")!;
const tools = fixture.tools;
/** lean-cli's `--tool-choice NAME` as OpenAI's tool_choice. */
const choiceOf = (c: ToolCase): ToolChoice =>
  ["auto", "none", "required"].includes(c.tool_choice)
    ? (c.tool_choice as ToolChoice)
    : { type: "function", function: { name: c.tool_choice } };

/** The errors of `value` under `schema` for the keywords the fixture's schema uses: [] when valid. */
function schemaErrors(schema: Record<string, unknown>, value: unknown, path = "$"): string[] {
  const errors: string[] = [];
  const known = ["type", "properties", "required", "additionalProperties", "enum", "maxLength"];
  for (const key of Object.keys(schema)) if (!known.includes(key)) errors.push(`${path}: the test's validator lacks '${key}'`);
  if (schema.type === "string" && typeof value !== "string") return [`${path}: not a string`];
  if (schema.type === "object" && (typeof value !== "object" || value === null || Array.isArray(value))) return [`${path}: not an object`];
  if (Array.isArray(schema.enum) && !schema.enum.includes(value)) errors.push(`${path}: ${JSON.stringify(value)} not in the enum`);
  if (typeof schema.maxLength === "number" && [...(value as string)].length > schema.maxLength) errors.push(`${path}: too long`);
  if (schema.type === "object") {
    const object = value as Record<string, unknown>;
    const properties = (schema.properties ?? {}) as Record<string, Record<string, unknown>>;
    for (const key of (schema.required as string[] | undefined) ?? []) if (!(key in object)) errors.push(`${path}: '${key}' missing`);
    for (const [key, item] of Object.entries(object)) {
      if (properties[key]) errors.push(...schemaErrors(properties[key], item, `${path}.${key}`));
      else if (schema.additionalProperties === false) errors.push(`${path}: '${key}' not allowed`);
    }
  }
  return errors;
}

const missing = [wasmFile, join(modelsDir, `${modelId}.gguf`)].filter((f) => !existsSync(f));
if (missing.length > 0 && process.env.CI) throw new Error(`missing: ${missing.join(", ")} (run npm run build; set LEAN_MODELS)`);

describe.skipIf(missing.length > 0)("tool calls with the wasm engine", () => {
  let engine: Engine;

  beforeAll(async () => {
    installFileFetch();
    const model = findModel(modelId)!;
    engine = await Engine.start(await inProcessWorker(), {
      model: wireModel(model, pathToFileURL(modelsDir + "/")),
      backend: "simd",
      contextLength: 1024,
      threads: 1,
      cacheName: null,
      gpuNeeds: model.gpu,
    });
  }, 120_000);

  it("the fixture's forced call follows the schema", () => {
    expect(forced.finish_reason).toBe("tool_calls");
    const [call] = forced.tool_calls;
    const tool = tools.find((t) => t.function.name === call!.function.name)!;
    expect(schemaErrors(tool.function.parameters as Record<string, unknown>, JSON.parse(call!.function.arguments))).toEqual([]);
  });

  it("a forced call gives lean-cli's call, and streams none of its syntax", async () => {
    const stream = engine.chat(forced.messages, { maxTokens: forced.max_tokens, tools, toolChoice: choiceOf(forced) });
    let streamed = "";
    const ids: number[] = [];
    for await (const token of stream) {
      streamed += token.text;
      ids.push(token.tokenId);
    }
    const result = await stream.result;
    expect(result.promptTokens).toBe(forced.prompt_ids.length);
    expect(result.tokenIds).toEqual(forced.token_ids);
    expect(result.finishReason).toBe("tool_calls");
    expect(result.toolCalls?.map(({ type, function: f }) => ({ type, function: f }))).toEqual(forced.tool_calls);
    expect(result.toolCalls?.[0]?.id).toMatch(/^call_[A-Za-z0-9]{24}$/);
    expect(streamed).toBe(forced.content ?? "");
    expect(streamed).not.toContain("tool_call");
  }, 60_000);

  it("chat.completions: the same call, whole and streamed", async () => {
    const request = { messages: forced.messages, max_tokens: forced.max_tokens, temperature: 0, tools, tool_choice: choiceOf(forced) };
    const whole = await engine.chat.completions.create(request);
    const [choice] = whole.choices;
    expect(choice!.finish_reason).toBe("tool_calls");
    expect(choice!.message.content).toBe(forced.content);
    expect(choice!.message.tool_calls?.map(({ type, function: f }) => ({ type, function: f }))).toEqual(forced.tool_calls);
    expect(whole.usage.completion_tokens).toBe(forced.token_ids.length);

    let content = "";
    const calls = [];
    let finish = null;
    for await (const chunk of await engine.chat.completions.create({ ...request, stream: true })) {
      content += chunk.choices[0]?.delta.content ?? "";
      calls.push(...(chunk.choices[0]?.delta.tool_calls ?? []));
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(content).toBe(forced.content ?? "");
    expect(calls.map(({ index, type, function: f }) => ({ index, type, function: f }))).toEqual(
      forced.tool_calls.map((c, index) => ({ index, ...c })),
    );
    expect(finish).toBe("tool_calls");
  }, 60_000);

  it("the tool's result fed back gives lean-cli's answer", async () => {
    const stream = engine.chat(roundTrip.messages, { maxTokens: roundTrip.max_tokens, tools, toolChoice: choiceOf(roundTrip) });
    for await (const _ of stream);
    const result = await stream.result;
    expect(result.promptTokens).toBe(roundTrip.prompt_ids.length);
    expect(result.tokenIds).toEqual(roundTrip.token_ids);
    expect(result.finishReason).toBe(roundTrip.finish_reason);
    if (roundTrip.tool_calls.length === 0) expect(result.text).toBe(roundTrip.content);
  }, 60_000);

  it("a forced call cut off by maxTokens is no call: finishReason length", async () => {
    const stream = engine.chat(forced.messages, { maxTokens: 5, tools, toolChoice: choiceOf(forced) });
    let text = "";
    for await (const token of stream) text += token.text;
    const result = await stream.result;
    expect(result.finishReason).toBe("length");
    expect(result.toolCalls).toBeUndefined();
    expect(result.tokenIds).toEqual(forced.token_ids.slice(0, 5));
    // The cut-off call is the reply's text.
    expect(text).toBe(result.text);
    expect(text.length).toBeGreaterThan(0);
  }, 60_000);

  it("a schema the constraint library rejects is a ToolError; the engine goes on", async () => {
    const bad: Tool[] = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: "strng" } } } } }];
    await expect(engine.chat(forced.messages, { maxTokens: 4, tools: bad, toolChoice: "required" }).result).rejects.toMatchObject({
      name: "ToolError",
      message: expect.stringMatching(/^a function's parameters schema is not usable: .*strng/),
    });
    // A tool result whose call is malformed JSON: named by the engine.
    const history: ChatTurn[] = [
      { role: "user", content: "x" },
      { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{nope" } }] },
    ];
    await expect(engine.chat(history, { maxTokens: 1 }).result).rejects.toMatchObject({
      name: "ToolError",
      message: expect.stringMatching(/^messages\[1\]\.tool_calls\[0\]\.function\.arguments is not valid JSON/),
    });
    expect(engine.usable).toBe(true);
    const again = engine.chat(forced.messages, { maxTokens: forced.max_tokens, tools, toolChoice: choiceOf(forced) });
    for await (const _ of again);
    expect((await again.result).tokenIds).toEqual(forced.token_ids);
  }, 60_000);
});
