// The official `openai` client against `lean-cli serve`: a greedy reply, streamed or not, the
// cached prefix of a second turn, a refused request as the client's BadRequestError, and a
// forced tool call with its result sent back.
// LEAN_CLI names the lean-cli binary; LEAN_MODELS the test models (skipped when missing,
// except under CI).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import OpenAI, { BadRequestError } from "openai";

const repo = fileURLToPath(new URL("../../../../", import.meta.url));
const model = `${process.env.LEAN_MODELS ?? `${repo}models`}/smollm2-135m-instruct-q4_0.gguf`;
const binary = process.env.LEAN_CLI ?? `${repo}target/debug/lean-cli`;
const missing = [model, binary].filter((path) => !existsSync(path));
if (missing.length > 0 && process.env.CI) throw new Error(`missing: ${missing.join(", ")}`);
const skip = missing.length > 0 && `missing: ${missing.join(", ")}`;

let server;
let client;

before(async () => {
  if (skip) return;
  server = spawn(binary, ["serve", "--model", model, "--port", "0", "--threads", "2", "--ctx", "1024"], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const lines = createInterface({ input: server.stderr });
  const baseURL = await new Promise((resolve, reject) => {
    let seen = "";
    lines.on("line", (line) => {
      seen += `${line}\n`;
      const match = line.match(/^lean: listening on (http:\/\/\S+)$/);
      if (match) resolve(`${match[1]}/v1`);
    });
    server.on("exit", (code) => reject(new Error(`lean-cli serve exited (${code}): ${seen}`)));
  });
  client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
});

after(() => server?.kill());

const conversation = [
  { role: "system", content: "You are a concise assistant." },
  { role: "user", content: "Name three colors." },
];

test("a streamed reply equals the whole one, and the next turn reuses the cache", { skip }, async () => {
  const whole = await client.chat.completions.create({
    model: "smollm2", messages: conversation, max_tokens: 24, temperature: 0,
  });
  assert.equal(whole.object, "chat.completion");
  assert.equal(whole.choices[0].message.role, "assistant");
  const text = whole.choices[0].message.content;
  assert.ok(text.length > 0);
  assert.ok(["stop", "length"].includes(whole.choices[0].finish_reason));
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({
    model: "smollm2", messages: conversation, max_tokens: 24, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let streamed = "";
  let usage;
  let finish;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.choices.length === 0) usage = chunk.usage;
    else {
      streamed += chunk.choices[0].delta.content ?? "";
      finish ??= chunk.choices[0].finish_reason ?? undefined;
    }
  }
  assert.equal(streamed, text);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);

  const next = await client.chat.completions.create({
    model: "smollm2",
    messages: [...conversation, { role: "assistant", content: text }, { role: "user", content: "One more?" }],
    max_tokens: 8, temperature: 0,
  });
  const cached = next.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > whole.usage.prompt_tokens / 2 && cached < next.usage.prompt_tokens, `cached ${cached}`);
});

test("completions and models", { skip }, async () => {
  const completion = await client.completions.create({
    model: "smollm2", prompt: "The quick brown fox", max_tokens: 8, temperature: 0,
  });
  assert.equal(completion.object, "text_completion");
  assert.equal(completion.usage.completion_tokens, 8);
  const models = await client.models.list();
  assert.equal(models.data[0].id, "smollm2-135m-instruct-q4_0");
});

test("a refused request is the client's BadRequestError", { skip }, async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "m", messages: [{ role: "wizard", content: "hi" }] }),
    (e) => e instanceof BadRequestError && e.status === 400 && e.param === "messages[0].role",
  );
  await assert.rejects(
    client.chat.completions.create({ model: "m", messages: conversation, n: 2 }),
    (e) => e instanceof BadRequestError && e.param === "n" && /not supported/.test(e.message),
  );
});

test("a forced tool call, its result and the answer (SmolLM2: lean's fallback template)", { skip }, async () => {
  const tools = [{
    type: "function",
    function: {
      name: "get_weather", description: "Get the current weather in a city",
      parameters: {
        type: "object", properties: { city: { type: "string", maxLength: 20 } },
        required: ["city"], additionalProperties: false,
      },
    },
  }];
  const messages = [{ role: "user", content: "What is the weather like in Paris?" }];
  const reply = await client.chat.completions.create({
    model: "m", messages, tools, tool_choice: { type: "function", function: { name: "get_weather" } },
    max_tokens: 48, temperature: 0,
  });
  const choice = reply.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, null);
  const [call] = choice.message.tool_calls;
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, "get_weather");
  assert.equal(typeof JSON.parse(call.function.arguments).city, "string");

  // The call and its result go back as the client writes them; the reply is an answer.
  const answer = await client.chat.completions.create({
    model: "m", tools, max_tokens: 8, temperature: 0,
    messages: [...messages, choice.message, { role: "tool", tool_call_id: call.id, content: "22 C and sunny" }],
  });
  assert.ok(["stop", "length", "tool_calls"].includes(answer.choices[0].finish_reason));
  assert.ok(answer.usage.completion_tokens > 0);

  const stream = await client.chat.completions.create({
    model: "m", messages, tools, tool_choice: "required", max_tokens: 48, temperature: 0, stream: true,
  });
  const deltas = [];
  let finish;
  for await (const chunk of stream) {
    deltas.push(...(chunk.choices[0]?.delta.tool_calls ?? []));
    finish ??= chunk.choices[0]?.finish_reason ?? undefined;
  }
  assert.equal(finish, "tool_calls");
  assert.equal(deltas.length, 1);
  assert.equal(deltas[0].index, 0);
  assert.equal(deltas[0].function.name, "get_weather");
});
