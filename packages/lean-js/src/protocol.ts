/**
 * The message protocol between the main thread (engine.ts) and the Web Worker (worker.ts), and
 * the public data types both sides share. Every request carries an `id`; every reply names the
 * request it belongs to. Errors cross as `{name, message}` (errors.ts).
 */
import type { WireError } from "./errors.js";
import { ErrorName, leanError } from "./errors.js";

/** Where the model runs: WebGPU, WebAssembly with threads, or single-thread WebAssembly SIMD. */
export type Backend = "webgpu" | "threads" | "simd";
export type BackendChoice = Backend | "auto";

export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool" | (string & {});
  content: string;
  /** A tool result (role "tool"): the id of the call it answers. */
  tool_call_id?: string;
  /** A tool result: the function's name (some templates print it). */
  name?: string;
}

/** A call the model made to one of the request's tools (OpenAI's shape). */
export interface ToolCall {
  /** `call_` and 24 letters and digits, new for each call. */
  id: string;
  type: "function";
  function: {
    name: string;
    /** The arguments as the model wrote them: a JSON object's text, valid under the function's schema for a forced call. */
    arguments: string;
  };
}

/** An assistant turn that called tools (as a reply returned it): `content` is the text around the calls, or null. */
export interface ToolCallMessage {
  role: "assistant";
  content: string | null;
  tool_calls: ToolCall[];
}

/** A message of a conversation: text, an assistant's tool calls, or a tool's result (`role: "tool"`, `tool_call_id`). */
export type ChatTurn = ChatMessage | ToolCallMessage;

/** A function the model may call (OpenAI's function tool). */
export interface Tool {
  type: "function";
  function: {
    /** 1 to 64 letters, digits, `_` or `-`. */
    name: string;
    description?: string;
    /** The arguments' JSON schema (default: an object with no declared properties). */
    parameters?: JsonSchema;
    /** Accepted for OpenAI compatibility: a forced call's arguments always follow the schema. */
    strict?: boolean | null;
  };
}

/**
 * Whether and which tool the model calls: "auto" (the model decides; the default), "none" (the
 * tools are not shown), "required" (exactly one call, to any tool) or one named function (exactly
 * one call to it). A forced call is constrained to the function's parameters schema.
 */
export type ToolChoice = "auto" | "none" | "required" | { type: "function"; function: { name: string } };

/** One generated token: its id and the text it completes (may be empty, e.g. half a character). */
export interface Token {
  text: string;
  tokenId: number;
}

/**
 * Sampling and stopping. Defaults: greedy decoding (temperature 0) of at most 256 tokens,
 * stopping at the model's end-of-sequence tokens. Semantics are transformers' (repetition
 * penalty, then temperature → top-k → top-p → min-p).
 */
export interface GenerateParams {
  maxTokens?: number;
  /** 0 = greedy. */
  temperature?: number;
  /** 0 disables. */
  topK?: number;
  /** 1 disables. */
  topP?: number;
  /** 0 disables. */
  minP?: number;
  /** 1 disables. */
  repetitionPenalty?: number;
  seed?: number;
  /** Stop when the text contains one of these; the text from it on is not returned. */
  stop?: string[];
  /** Stop at these token ids instead of the model's end-of-sequence ids. */
  stopTokenIds?: number[];
  /**
   * Speculative decoding: `{ lookup: n }` guesses up to n tokens by finding the text's last
   * tokens earlier in the prompt and output (prompt lookup) and checks the guess in one batched
   * pass. Greedy tokens are the same as without it; sampled ones have the same distribution.
   * Code edits, summaries and extraction, which repeat their input, come faster. `prediction`:
   * text the output is expected to resemble (the file being edited), searched first (guesses of
   * up to `lookup` tokens, default 8). `{ draft: n }`: the engine's draft model
   * (`engine.loadDraft`, createEngine's `draft`) guesses up to n tokens greedily instead; not
   * with `lookup` or `prediction`.
   */
  speculative?: { lookup?: number; prediction?: string; draft?: number };
  /**
   * Structured output (constrained decoding): every token is chosen among those that keep the
   * output inside the format, so it always parses. `{ type: "json_object" }`: any JSON object;
   * `{ type: "json_schema", json_schema: { name, schema, strict? } }` (OpenAI's shape): JSON valid
   * under the schema; `{ type: "regex", pattern }`: text matching the regex in full;
   * `{ type: "grammar", lark }`: text of a Lark grammar (llguidance's dialect, `start` the top
   * rule). `{ type: "text" }` (or none): free text. The generation ends "stop" when the output is
   * complete, "length" when `maxTokens` ran out first (the output is then cut off). A format the
   * constraint library rejects fails the generation with a `ConstraintError` naming the
   * problem; the engine stays usable. With `speculative`, guesses are cut where the format
   * refuses them and each guessed row is checked under its own mask: the same tokens, sooner.
   */
  responseFormat?: ResponseFormat;
  /**
   * Tool calls (a chat only): the functions the model may call, rendered through the model's
   * chat template (Qwen2.5, Qwen3, Llama 3.x) or, for a template without tools (SmolLM2's),
   * described in the system message with the Hermes `<tool_call>` syntax. A call the model writes
   * comes back in `result.toolCalls` (finishReason "tool_calls") and its text is not streamed.
   * Feed it back as the assistant's `{ role: "assistant", content, tool_calls }` and each result as
   * `{ role: "tool", content, tool_call_id }`. Bad tools or `toolChoice` throw a `ToolError`.
   */
  tools?: Tool[];
  /**
   * Default "auto". "required" or a named function forces exactly one call whose arguments
   * follow the function's schema (constrained decoding: not with `responseFormat`); cut off by `maxTokens` it is no call (finishReason "length").
   */
  toolChoice?: ToolChoice;
}

/** A JSON schema, as a plain object (or `true`/`false`). */
export type JsonSchema = { [key: string]: unknown } | boolean;

/** The output's format: see {@link GenerateParams.responseFormat}. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | {
      type: "json_schema";
      json_schema: {
        /** A name for the schema (OpenAI requires one; lean does not use it). */
        name?: string;
        description?: string;
        /** Default `{ type: "object" }` (any object), as `json_object`. */
        schema?: JsonSchema;
        /** Accepted for OpenAI compatibility: lean's output always follows the schema. */
        strict?: boolean | null;
      };
    }
  | { type: "regex"; pattern: string }
  | { type: "grammar"; lark: string };

export type FinishReason = "stop" | "length" | "context_full" | "cancelled" | "tool_calls";

export interface GenerationResult {
  /** The text streamed out, cut before a matched stop string. */
  text: string;
  /** Every generated id, a final stop token included. */
  tokenIds: number[];
  promptTokens: number;
  /**
   * Prompt tokens whose keys/values came from the KV cache the previous generation left (the
   * conversation so far): the prefill ran only `promptTokens - cachedTokens`.
   */
  cachedTokens: number;
  finishReason: FinishReason;
  /** The stop string that ended the generation, if one did. */
  stopString: string | null;
  /** Tokenizing and running the prompt (its uncached part). */
  prefillMs: number;
  /** From the first generated token to the last. */
  decodeMs: number;
  prefillTokensPerSecond: number;
  /** Over the tokens after the first (which comes out of the prefill). */
  decodeTokensPerSecond: number;
  /**
   * Speculative decoding's batched passes and guesses, and the steps the cost check ran without
   * guessing because passes did not pay (zeros without speculation).
   */
  speculation: {
    verifications: number;
    draftedTokens: number;
    acceptedTokens: number;
    pausedSteps: number;
  };
  /**
   * With `tools`: the calls the reply made (finishReason "tool_calls"); `text` is then the text
   * around them (often empty). Absent when it made none.
   */
  toolCalls?: ToolCall[];
}

export interface ModelInfo {
  architecture: string;
  description: string;
  /** The compute session, in words. */
  session: string;
  contextLength: number;
  trainContextLength: number;
  vocabSize: number;
  fileBytes: number;
  kvCacheBytes: number;
  bosToken: string | null;
  eosToken: string | null;
  eosTokenIds: number[];
  hasChatTemplate: boolean;
  /** Whether the tokenizer (and chat template) came from the GGUF's metadata, no tokenizer.json given. */
  tokenizerFromGguf: boolean;
  /** The draft model (`engine.loadDraft`) and the session it runs on, in words; null without one. */
  draftModel: string | null;
  /**
   * Token ids the KV cache holds (the last conversation), kept current after each generation: a
   * next prompt that starts with them prefills only the rest (see `Engine.cacheInfo`).
   */
  cachedTokens: number;
}

/** What the engine holds in memory now (`Engine.memoryInfo`). */
export interface MemoryInfo {
  /**
   * The WebAssembly memory's size in bytes (the weights on the CPU backends, the KV cache,
   * scratch). It grows and never shrinks: flat across generations means no leak.
   */
  wasmMemoryBytes: number;
}

/** The KV cache carried across generations (`Engine.cacheInfo`). */
export interface CacheInfo {
  /** Ids the cache holds. */
  cachedTokens: number;
  /** With a prompt: its length in tokens, and how many of them the next generation would reuse. */
  promptTokens?: number;
  reusableTokens?: number;
}

/** A file of the model, or ("draft") the draft model's GGUF. */
export type ModelFileRole = "gguf" | "tokenizer" | "tokenizerConfig" | "chatTemplate" | "draft";

export interface LoadProgress {
  file: ModelFileRole;
  /** A URL or file name. */
  name: string;
  loaded: number;
  total: number | null;
  source: "network" | "cache" | "local";
}

/** A model file as the worker receives it. */
export interface WireFile {
  name: string;
  source: { url: string } | { blob: Blob } | { bytes: ArrayBuffer };
  /** Expected size and sha256 (hex), checked when given. */
  size: number | null;
  sha256: string | null;
}

/**
 * A model's files as the worker receives them. Without `tokenizer` (tokenizer.json) the engine
 * builds the tokenizer and chat template from the GGUF's metadata; `tokenizerConfig` and
 * `chatTemplate`, when given, win over what the GGUF says.
 */
export interface WireModel {
  gguf: WireFile;
  tokenizer: WireFile | null;
  tokenizerConfig: WireFile | null;
  chatTemplate: WireFile | null;
}

export type WirePrompt = { raw: string } | { messages: ChatTurn[] };

export interface LoadRequest {
  type: "load";
  id: number;
  model: WireModel;
  backend: BackendChoice;
  contextLength: number;
  /** Threads of the threads backend. */
  threads: number;
  /** Cache Storage name; null disables caching. */
  cacheName: string | null;
  /** The WebGPU limits the model needs (see capabilities.ts), when known. */
  gpuNeeds: GpuNeeds | null;
  /** For lean's own tests: make the failure this names happen. */
  testHooks?: TestHooks;
}

/** Failures lean's tests induce on purpose (never set by an app). */
export interface TestHooks {
  /** The threads backend's worker blocks for good where it would start its thread pool. */
  blockThreadPoolStart?: boolean;
  /**
   * On WebGPU, the device is destroyed (`GPUDevice.destroy()`, as a lost device) before the pass
   * after this many GPU passes (prefill chunks, decode passes) of the first generation.
   */
  loseDeviceAfterPasses?: number;
}

export type Request =
  | LoadRequest
  | { type: "generate"; id: number; prompt: WirePrompt; params: GenerateParams }
  /** Stops the generation `id` (a no-op when it already ended). */
  | { type: "cancel"; id: number }
  | { type: "tokenize"; id: number; text: string }
  /** `params`: a chat's tools, counted in the prompt. */
  | { type: "cacheInfo"; id: number; prompt: WirePrompt | null; params?: GenerateParams }
  /** Forgets the KV cache (the next generation prefills its whole prompt). */
  | { type: "resetCache"; id: number }
  /** Loads a draft model beside the model (replacing an earlier one): progress, then "draftLoaded". */
  | { type: "loadDraft"; id: number; draft: WireFile }
  | { type: "memoryInfo"; id: number };

export type Reply =
  | { type: "progress"; id: number; progress: LoadProgress }
  | { type: "warning"; id: number; message: string }
  /** The threads backend starts its pool of Web Workers (the load's one unbounded wait: timed by the engine). */
  | { type: "poolStarting"; id: number; threads: number }
  | { type: "poolStarted"; id: number }
  | { type: "loaded"; id: number; backend: Backend; backendReason: string; info: ModelInfo }
  /** The WebGPU device was lost during generation `id`: the engine runs on `backend` now. */
  | { type: "backendChange"; id: number; backend: Backend; backendReason: string; info: ModelInfo }
  | { type: "tokens"; id: number; tokens: Token[] }
  /** `cachedTokens`: the ids the KV cache holds now. */
  | { type: "done"; id: number; result: GenerationResult; cachedTokens: number }
  | { type: "tokenized"; id: number; ids: number[] }
  | { type: "cacheInfo"; id: number; info: CacheInfo }
  | { type: "cacheReset"; id: number }
  /** `draftModel`: the draft model and its session, in words. */
  | { type: "draftLoaded"; id: number; draftModel: string }
  | { type: "memoryInfo"; id: number; info: MemoryInfo }
  /** `fatal`: the worker cannot serve any further request. */
  | { type: "error"; id: number; error: WireError; fatal: boolean };

/** What the WebGPU backend needs of an adapter, when known from the model. */
export interface GpuNeeds {
  /** The largest weight tensor: bound whole when it fits one storage binding. */
  largestTensorBytes: number | null;
  /** The largest row of a weight matrix: the unit of the split-binding path. */
  largestRowBytes: number | null;
}

const PARAM_NAMES: ReadonlySet<string> = new Set<keyof GenerateParams>([
  "maxTokens",
  "temperature",
  "topK",
  "topP",
  "minP",
  "repetitionPenalty",
  "seed",
  "stop",
  "stopTokenIds",
  "speculative",
  "responseFormat",
  "tools",
  "toolChoice",
]);

const RESPONSE_FORMAT_KEYS: Record<string, readonly string[]> = {
  text: [],
  json_object: [],
  json_schema: ["json_schema"],
  regex: ["pattern"],
  grammar: ["lark"],
};

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * The wasm engine's `constraint` option from a {@link ResponseFormat} (null: free text). Its shape
 * is checked here (a TypeError naming the field); the schema, regex or grammar itself is checked
 * by the constraint library in the worker (a `ConstraintError`).
 */
export function toEngineConstraint(format: ResponseFormat | undefined | null, name = "responseFormat"): Record<string, unknown> | null {
  if (format === undefined || format === null) return null;
  const types = Object.keys(RESPONSE_FORMAT_KEYS).map((t) => `"${t}"`).join(", ");
  if (!isPlainObject(format) || typeof format.type !== "string") {
    throw new TypeError(`${name} must be an object with a string 'type' (${types})`);
  }
  const allowed = RESPONSE_FORMAT_KEYS[format.type];
  if (allowed === undefined) throw new TypeError(`${name}.type must be one of ${types}, got "${format.type}"`);
  for (const key of Object.keys(format)) {
    if (key !== "type" && !allowed.includes(key)) {
      throw new TypeError(`unknown field '${key}' in ${name} of type "${format.type}" (known: ${["type", ...allowed].join(", ")})`);
    }
  }
  switch (format.type) {
    case "text":
      return null;
    case "json_object":
      return { type: "json_object" };
    case "json_schema": {
      const spec = (format as { json_schema?: unknown }).json_schema;
      if (!isPlainObject(spec)) {
        throw new TypeError(`${name}.json_schema must be an object { name, schema, strict? }`);
      }
      if (spec.name !== undefined && typeof spec.name !== "string") throw new TypeError(`${name}.json_schema.name must be a string`);
      if (spec.description !== undefined && typeof spec.description !== "string") {
        throw new TypeError(`${name}.json_schema.description must be a string`);
      }
      if (spec.strict !== undefined && spec.strict !== null && typeof spec.strict !== "boolean") {
        throw new TypeError(`${name}.json_schema.strict must be a boolean`);
      }
      for (const key of Object.keys(spec)) {
        if (!["name", "description", "schema", "strict"].includes(key)) {
          throw new TypeError(`unknown field '${key}' in ${name}.json_schema (known: name, description, schema, strict)`);
        }
      }
      const schema = spec.schema;
      if (schema === undefined || schema === null) return { type: "json_object" };
      if (!isPlainObject(schema) && typeof schema !== "boolean") {
        throw new TypeError(`${name}.json_schema.schema must be a JSON schema object, got ${JSON.stringify(schema)}`);
      }
      let json: string | undefined;
      try {
        json = JSON.stringify(schema);
      } catch (e) {
        throw new TypeError(`${name}.json_schema.schema is not JSON: ${(e as Error).message}`);
      }
      return { type: "json_schema", schema: JSON.parse(json) as unknown };
    }
    case "regex": {
      const pattern = (format as { pattern?: unknown }).pattern;
      if (typeof pattern !== "string" || !pattern) throw new TypeError(`${name}.pattern must be a non-empty string`);
      return { type: "regex", pattern };
    }
    case "grammar": {
      const lark = (format as { lark?: unknown }).lark;
      if (typeof lark !== "string" || !lark) throw new TypeError(`${name}.lark must be a non-empty string (a Lark grammar)`);
      return { type: "grammar", lark };
    }
  }
  throw new TypeError(`${name}.type must be one of ${types}`);
}

const TOOL_NAME = /^[a-zA-Z0-9_-]{1,64}$/;

/**
 * The wasm engine's `tools` and `tool_choice` options (null: no tools), checked as lean checks
 * them (rust/lean/src/tools.rs `parse_tools`): a `ToolError` names the field. `names` are the
 * fields as the caller spells them (`tools`/`toolChoice`, or OpenAI's `tool_choice`). `forced`:
 * the reply must be a call (constrained decoding).
 */
export function toEngineTools(
  tools: readonly Tool[] | undefined | null,
  toolChoice: ToolChoice | undefined | null,
  names: { tools: string; toolChoice: string } = { tools: "tools", toolChoice: "toolChoice" },
): { tools: unknown[]; tool_choice?: unknown; forced: boolean } | null {
  const fail = (message: string) => leanError(ErrorName.Tool, message);
  const n = names.tools;
  const c = names.toolChoice;
  if (tools !== undefined && tools !== null && !Array.isArray(tools)) {
    throw fail(`${n} must be an array of { type: "function", function: { name, description?, parameters? } }`);
  }
  const list = tools ?? [];
  const seen = new Set<string>();
  const wire = list.map((tool: unknown, i) => {
    if (!isPlainObject(tool)) throw fail(`${n}[${i}] must be an object`);
    if (tool.type !== "function") {
      throw fail(`${n}[${i}] has type ${JSON.stringify(tool.type)}: lean takes "function" tools only`);
    }
    const fn = tool.function;
    if (!isPlainObject(fn)) throw fail(`${n}[${i}].function must be an object with a 'name'`);
    if (typeof fn.name !== "string" || !TOOL_NAME.test(fn.name)) {
      throw fail(`${n}[${i}].function.name must be 1 to 64 letters, digits, '_' or '-', got ${JSON.stringify(fn.name)}`);
    }
    if (seen.has(fn.name)) throw fail(`${n}[${i}]: the function name '${fn.name}' is given twice`);
    seen.add(fn.name);
    if (fn.description !== undefined && fn.description !== null && typeof fn.description !== "string") {
      throw fail(`${n}[${i}].function.description must be a string`);
    }
    const parameters = fn.parameters;
    if (parameters !== undefined && parameters !== null && !isPlainObject(parameters)) {
      throw fail(`${n}[${i}].function.parameters must be a JSON schema object, got ${JSON.stringify(parameters)}`);
    }
    try {
      return JSON.parse(JSON.stringify(tool)) as unknown;
    } catch (e) {
      throw fail(`${n}[${i}] is not JSON: ${(e as Error).message}`);
    }
  });
  let choice: unknown;
  let forced = false;
  if (toolChoice === undefined || toolChoice === null) {
    choice = undefined;
  } else if (typeof toolChoice === "string") {
    if (!["auto", "none", "required"].includes(toolChoice)) {
      throw fail(`${c} must be "auto", "none", "required" or { type: "function", function: { name } }, got "${toolChoice}"`);
    }
    if (toolChoice === "none") return null;
    choice = toolChoice;
    forced = toolChoice === "required";
  } else if (isPlainObject(toolChoice)) {
    const fn = (toolChoice as { function?: unknown }).function;
    const name = isPlainObject(fn) ? fn.name : undefined;
    if (toolChoice.type !== "function" || typeof name !== "string") {
      throw fail(`${c} as an object must be { type: "function", function: { name } }`);
    }
    if (!seen.has(name)) throw fail(`${c} names the function '${name}', which is not among ${n}`);
    choice = { type: "function", function: { name } };
    forced = true;
  } else {
    throw fail(`${c} must be a string or an object, got ${JSON.stringify(toolChoice)}`);
  }
  if (wire.length === 0) {
    if (forced) throw fail(`${c} requires ${n} (a call is required, but no function is given)`);
    return null;
  }
  return { tools: wire, ...(choice === undefined ? {} : { tool_choice: choice }), forced };
}

/**
 * The options JSON of the wasm engine (snake_case), from lean-js's parameters. Unknown names
 * are refused (e.g. `max_tokens` from a Python habit) rather than silently ignored.
 */
export function toEngineOptions(params: GenerateParams): Record<string, unknown> {
  for (const name of Object.keys(params)) {
    if (!PARAM_NAMES.has(name)) {
      throw new TypeError(
        `unknown generation option '${name}' (known: ${[...PARAM_NAMES, "signal"].join(", ")})`,
      );
    }
  }
  const checkNumber = (name: string, value: number | undefined) => {
    if (value !== undefined && (typeof value !== "number" || !Number.isFinite(value))) {
      throw new TypeError(`${name} must be a finite number, got ${String(value)}`);
    }
  };
  const checkCount = (name: string, value: number | undefined) => {
    checkNumber(name, value);
    if (value !== undefined && (!Number.isInteger(value) || value < 0)) {
      throw new TypeError(`${name} must be a whole number ≥ 0, got ${value}`);
    }
  };
  checkCount("maxTokens", params.maxTokens);
  checkNumber("temperature", params.temperature);
  checkCount("topK", params.topK);
  checkNumber("topP", params.topP);
  checkNumber("minP", params.minP);
  checkNumber("repetitionPenalty", params.repetitionPenalty);
  checkCount("seed", params.seed);
  if (params.seed !== undefined && params.seed > Number.MAX_SAFE_INTEGER) {
    throw new TypeError(`seed must be at most ${Number.MAX_SAFE_INTEGER}, got ${params.seed}`);
  }
  params.stopTokenIds?.forEach((id, i) => checkCount(`stopTokenIds[${i}]`, id));
  if (params.stop !== undefined && (!Array.isArray(params.stop) || params.stop.some((s) => typeof s !== "string" || !s))) {
    throw new TypeError("stop must be an array of non-empty strings");
  }
  let lookup: number | undefined;
  let prediction: string | undefined;
  let draft: number | undefined;
  if (params.speculative !== undefined) {
    const spec = params.speculative as unknown;
    const keys = spec !== null && typeof spec === "object" ? Object.keys(spec) : [];
    if (keys.length === 0 || keys.some((k) => k !== "lookup" && k !== "prediction" && k !== "draft")) {
      throw new TypeError(
        "speculative must be { lookup?: n, prediction?: text } (prompt lookup with guesses of up to n tokens) " +
          "or { draft: n } (the draft model's guesses of up to n tokens)",
      );
    }
    ({ lookup, prediction, draft } = params.speculative);
    checkCount("speculative.lookup", lookup);
    if (lookup !== undefined && lookup < 1) throw new TypeError("speculative.lookup must be at least 1");
    if (prediction !== undefined && typeof prediction !== "string") {
      throw new TypeError("speculative.prediction must be a string");
    }
    checkCount("speculative.draft", draft);
    if (draft !== undefined && draft < 1) throw new TypeError("speculative.draft must be at least 1");
    if (draft !== undefined && (lookup !== undefined || prediction !== undefined)) {
      throw new TypeError(
        "speculative.draft does not combine with lookup or prediction: the draft model or prompt lookup guesses, not both",
      );
    }
    if (lookup === undefined && prediction === undefined && draft === undefined) {
      throw new TypeError("speculative needs lookup, prediction or draft");
    }
  }
  const constraint = toEngineConstraint(params.responseFormat);
  const tools = toEngineTools(params.tools, params.toolChoice);
  if (tools?.forced && constraint !== null) {
    throw leanError(
      ErrorName.Tool,
      "a required tool call (toolChoice \"required\" or a function) does not combine with responseFormat: the call's arguments follow the function's schema",
    );
  }
  const options: Record<string, unknown> = {
    max_tokens: params.maxTokens,
    temperature: params.temperature,
    top_k: params.topK,
    top_p: params.topP,
    min_p: params.minP,
    repetition_penalty: params.repetitionPenalty,
    seed: params.seed,
    stop_token_ids: params.stopTokenIds,
    lookup,
    prediction,
    draft,
    constraint: constraint ?? undefined,
    tools: tools?.tools,
    tool_choice: tools?.tool_choice,
  };
  for (const key of Object.keys(options)) if (options[key] === undefined) delete options[key];
  return options;
}
