/**
 * OpenAI's chat completions shape on a lean {@link Engine}: `engine.chat.completions.create`
 * takes the request body of OpenAI's API and returns a `ChatCompletion`, or with `stream: true`
 * an async iterable of `ChatCompletionChunk`s, with OpenAI's field names and finish reasons, so
 * that code written for OpenAI's or WebLLM's chat completions runs with few changes. It is a
 * layer over `engine.chat`: the KV cache carried across turns is reused the same way, and
 * `usage.prompt_tokens_details.cached_tokens` says how much of the prompt came from it. With
 * `tools` the reply's calls come back as `message.tool_calls` (streamed: one `delta.tool_calls`
 * chunk) with finish_reason "tool_calls"; tool results go back as `role: "tool"` messages.
 */
import type { Engine, GenerateOptions } from "./engine.js";
import type { ChatTurn, FinishReason, GenerationResult, ResponseFormat, Tool, ToolCall, ToolChoice } from "./protocol.js";
import { ErrorName, leanError } from "./errors.js";
import { toEngineConstraint, toEngineTools } from "./protocol.js";

/** A text part of a message's content (images and audio are not supported). */
export interface ChatCompletionContentPartText {
  type: "text";
  text: string;
}

export interface ChatCompletionMessageParam {
  role: "system" | "developer" | "user" | "assistant" | "tool" | (string & {});
  /** null only on an assistant message with `tool_calls`. */
  content: string | ChatCompletionContentPartText[] | null;
  name?: string;
  /** An assistant's calls, as a reply returned them (`arguments` a JSON text). */
  tool_calls?: ChatCompletionMessageToolCall[] | null;
  /** A tool result (role "tool"): the id of the call it answers. */
  tool_call_id?: string;
}

/** OpenAI's function tool (`tools`). */
export type ChatCompletionTool = Tool;
/** OpenAI's `tool_choice`. */
export type ChatCompletionToolChoiceOption = ToolChoice;
/** A call in a reply's `message.tool_calls`. */
export type ChatCompletionMessageToolCall = ToolCall;
/** A call in a stream chunk's `delta.tool_calls` (whole: lean sends each call in one chunk). */
export interface ChatCompletionChunkToolCall extends ToolCall {
  index: number;
}

export interface ChatCompletionCreateParamsBase {
  messages: ChatCompletionMessageParam[];
  /** Echoed in the response (the engine runs one model). */
  model?: string;
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  /** Default 1, as OpenAI's; 0 = greedy. */
  temperature?: number | null;
  top_p?: number | null;
  seed?: number | null;
  stop?: string | string[] | null;
  stream_options?: { include_usage?: boolean } | null;
  /** Must be 1 when given. */
  n?: number | null;
  /** lean: "auto" drops the oldest turns after the system messages until the prompt and max_tokens fit. */
  truncation?: "auto" | "disabled";
  /**
   * OpenAI's predicted outputs: text the reply is expected to resemble (e.g. the file being
   * edited). lean guesses from it with speculative decoding: the same reply, sooner.
   */
  prediction?: { type: "content"; content: string | ChatCompletionContentPartText[] } | null;
  /**
   * lean: speculative decoding for this request, as `engine.chat`'s option: `{ lookup: n }`
   * (prompt lookup, guesses of up to n tokens) or `{ draft: n }` (the draft model loaded with
   * `engine.loadDraft`). The reply is the same, sooner where guesses are kept. With
   * `prediction`, lookup searches the prediction first (not with `draft`). With
   * `response_format` or a required tool call, guesses are cut where the format refuses them.
   */
  speculative?: { lookup: number } | { draft: number } | null;
  /**
   * Structured output, OpenAI's shape: `{ type: "json_schema", json_schema: { name, schema,
   * strict } }`, `{ type: "json_object" }` or `{ type: "text" }`; lean adds `{ type: "regex",
   * pattern }` and `{ type: "grammar", lark }`. The reply always follows it (constrained
   * decoding); `finish_reason` is "length" when max_tokens ran out before it was complete. A
   * schema the constraint library rejects throws a `ConstraintError` naming the problem.
   */
  response_format?: ResponseFormat | null;
  /**
   * Functions the model may call: rendered through the model's chat template, or (a template
   * without tools, as SmolLM2's) described in the system message with the Hermes `<tool_call>`
   * syntax. A call comes back in `message.tool_calls` with finish_reason "tool_calls"; its
   * syntax is never streamed as content. A bad tool throws a `ToolError`.
   */
  tools?: ChatCompletionTool[] | null;
  /**
   * "auto" (default), "none", "required" or `{ type: "function", function: { name } }`: the last
   * two force exactly one call, its arguments constrained to the function's schema (not with
   * `response_format` or `prediction`); max_tokens reached first is finish_reason "length", no call.
   */
  tool_choice?: ChatCompletionToolChoiceOption | null;
  /** Aborting stops the generation within one token; the call (or the iterator) throws the reason. */
  signal?: AbortSignal;
}

export interface ChatCompletionCreateParamsNonStreaming extends ChatCompletionCreateParamsBase {
  stream?: false | null;
}

export interface ChatCompletionCreateParamsStreaming extends ChatCompletionCreateParamsBase {
  stream: true;
}

export type ChatCompletionCreateParams = ChatCompletionCreateParamsNonStreaming | ChatCompletionCreateParamsStreaming;

export type ChatCompletionFinishReason = "stop" | "length" | "tool_calls";

export interface CompletionUsage {
  prompt_tokens: number;
  /** Generated tokens, a final end-of-turn token included. */
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
  /** Speculative decoding's guesses from `prediction` (and prompt lookup) kept and refused. */
  completion_tokens_details: { accepted_prediction_tokens: number; rejected_prediction_tokens: number };
}

/** lean's additions to a response. */
export interface LeanCompletionExtras {
  /** Messages `truncation: "auto"` left out (0 when none). */
  dropped_messages: number;
}

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  system_fingerprint: null;
  choices: {
    index: number;
    /** `content`: null when the reply is only tool calls. */
    message: { role: "assistant"; content: string | null; refusal: null; tool_calls?: ChatCompletionMessageToolCall[] };
    finish_reason: ChatCompletionFinishReason;
    logprobs: null;
  }[];
  usage: CompletionUsage;
  lean: LeanCompletionExtras;
}

export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  system_fingerprint: null;
  choices: {
    index: number;
    delta: { role?: "assistant"; content?: string; tool_calls?: ChatCompletionChunkToolCall[] };
    finish_reason: ChatCompletionFinishReason | null;
    logprobs: null;
  }[];
  /** With `stream_options.include_usage`: null on every chunk but the last, which has no choices. */
  usage?: CompletionUsage | null;
  lean?: LeanCompletionExtras;
}

/** Parameters that would change the output and that lean does not implement. */
const UNSUPPORTED: Record<string, (value: unknown) => boolean> = {
  logprobs: (v) => v === true,
  top_logprobs: (v) => v !== 0,
  functions: () => true,
  function_call: (v) => v !== "none",
  logit_bias: (v) => typeof v === "object" && Object.keys(v as object).length > 0,
  presence_penalty: (v) => v !== 0,
  frequency_penalty: (v) => v !== 0,
  modalities: (v) => !(Array.isArray(v) && v.every((m) => m === "text")),
  audio: () => true,
};

function messageText(message: ChatCompletionMessageParam, i: number): ChatTurn {
  const { role: given, content, tool_calls: calls, tool_call_id: callId } = message ?? ({} as ChatCompletionMessageParam);
  if (typeof given !== "string") throw new TypeError(`messages[${i}].role must be a string`);
  const role = given === "developer" ? "system" : given;
  let text: string | null;
  if (typeof content === "string") text = content;
  else if ((content === null || content === undefined) && Array.isArray(calls) && calls.length > 0) text = null;
  else if (!Array.isArray(content)) throw new TypeError(`messages[${i}].content must be a string or an array of text parts`);
  else {
    text = content
      .map((part, j) => {
        if (part?.type !== "text" || typeof part.text !== "string") {
          throw new TypeError(`messages[${i}].content[${j}]: only text parts are supported, got type ${String(part?.type)}`);
        }
        return part.text;
      })
      .join("\n");
  }
  if (Array.isArray(calls) && calls.length > 0) {
    if (role !== "assistant") throw new TypeError(`messages[${i}] has tool_calls but role '${role}': only an assistant calls tools`);
    return { role: "assistant", content: text, tool_calls: calls };
  }
  if (calls !== undefined && calls !== null && !Array.isArray(calls)) throw new TypeError(`messages[${i}].tool_calls must be an array`);
  return {
    role,
    content: text ?? "",
    ...(callId === undefined || callId === null ? {} : { tool_call_id: callId }),
    ...(role === "tool" && typeof message.name === "string" ? { name: message.name } : {}),
  };
}

const finishReason = (reason: FinishReason): ChatCompletionFinishReason =>
  reason === "stop" || reason === "tool_calls" ? reason : "length";

function usage(result: GenerationResult): CompletionUsage {
  return {
    prompt_tokens: result.promptTokens,
    completion_tokens: result.tokenIds.length,
    total_tokens: result.promptTokens + result.tokenIds.length,
    prompt_tokens_details: { cached_tokens: result.cachedTokens },
    completion_tokens_details: {
      accepted_prediction_tokens: result.speculation.acceptedTokens,
      rejected_prediction_tokens: result.speculation.draftedTokens - result.speculation.acceptedTokens,
    },
  };
}

function completionId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return `chatcmpl-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** `engine.chat.completions`. */
export class ChatCompletions {
  readonly #engine: Engine;

  constructor(engine: Engine) {
    this.#engine = engine;
  }

  create(params: ChatCompletionCreateParamsNonStreaming): Promise<ChatCompletion>;
  create(params: ChatCompletionCreateParamsStreaming): Promise<AsyncIterable<ChatCompletionChunk>>;
  create(params: ChatCompletionCreateParams): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>>;
  async create(params: ChatCompletionCreateParams): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    if (typeof params !== "object" || params === null) throw new TypeError("create() takes the request body object");
    for (const [name, unsupported] of Object.entries(UNSUPPORTED)) {
      const value = (params as unknown as Record<string, unknown>)[name];
      if (value !== undefined && value !== null && unsupported(value)) {
        throw new TypeError(`parameter '${name}' is not supported by lean (it would change the output)`);
      }
    }
    if (params.n !== undefined && params.n !== null && params.n !== 1) {
      throw new TypeError(`n must be 1 (lean generates one choice), got ${params.n}`);
    }
    if (!Array.isArray(params.messages) || params.messages.length === 0) {
      throw new TypeError("messages must be a non-empty array of {role, content}");
    }
    let messages = params.messages.map(messageText);
    const maxTokens = params.max_completion_tokens ?? params.max_tokens ?? undefined;
    if (maxTokens !== undefined && !(Number.isInteger(maxTokens) && maxTokens >= 1)) {
      throw new TypeError(`max_tokens must be a whole number ≥ 1, got ${String(maxTokens)}`);
    }
    const stop = params.stop === undefined || params.stop === null ? undefined : [params.stop].flat();
    let prediction: string | undefined;
    if (params.prediction !== undefined && params.prediction !== null) {
      const { type, content } = params.prediction;
      if (type !== "content") throw new TypeError(`prediction.type must be "content", got ${String(type)}`);
      if (typeof content === "string") prediction = content;
      else if (Array.isArray(content) && content.every((p) => p?.type === "text" && typeof p.text === "string")) {
        prediction = content.map((p) => p.text).join("");
      } else throw new TypeError("prediction.content must be a string or an array of text parts");
    }
    const format = params.response_format ?? undefined;
    const constrained = toEngineConstraint(format, "response_format") !== null;
    const tools = toEngineTools(params.tools, params.tool_choice, { tools: "tools", toolChoice: "tool_choice" });
    const speculative = params.speculative ?? undefined;
    if (speculative !== undefined && (typeof speculative !== "object" || Array.isArray(speculative))) {
      throw new TypeError("speculative must be { lookup: n } or { draft: n }");
    }
    if (tools?.forced && constrained) {
      throw leanError(
        ErrorName.Tool,
        `a required tool call (tool_choice "required" or a function) does not combine with response_format`,
      );
    }
    const toolOptions = tools === null ? {} : { tools: params.tools!, ...(params.tool_choice ? { toolChoice: params.tool_choice } : {}) };
    const options: GenerateOptions = {
      // Without max_tokens, as OpenAI: until the end of turn or of the context.
      maxTokens: maxTokens ?? this.#engine.info.contextLength,
      temperature: params.temperature ?? 1,
      ...(params.top_p === undefined || params.top_p === null ? {} : { topP: params.top_p }),
      ...(params.seed === undefined || params.seed === null ? {} : { seed: params.seed }),
      ...(stop ? { stop } : {}),
      ...(params.signal ? { signal: params.signal } : {}),
      // Checked by the engine (lengths, draft with a prediction, a constraint).
      ...(prediction !== undefined || speculative !== undefined
        ? { speculative: { ...speculative, ...(prediction !== undefined ? { prediction } : {}) } }
        : {}),
      ...(constrained ? { responseFormat: format } : {}),
      ...toolOptions,
    };
    let dropped = 0;
    if (params.truncation === "auto") ({ messages, dropped } = await this.#fit(messages, maxTokens ?? 1, toolOptions));
    const stream = this.#engine.chat(messages, options);
    const head = {
      id: completionId(),
      created: Math.floor(Date.now() / 1000),
      model: params.model ?? this.#engine.info.description,
      system_fingerprint: null,
    };
    const lean = { dropped_messages: dropped };
    if (!params.stream) {
      for await (const token of stream) void token;
      const result = await stream.result;
      const calls = result.toolCalls;
      // With calls, the content is the text around them (trimmed, as lean-cli serve's), or null.
      const content = calls ? result.text.trim() || null : result.text;
      return {
        ...head,
        object: "chat.completion",
        choices: [
          {
            index: 0,
            message: { role: "assistant", content, refusal: null, ...(calls ? { tool_calls: calls } : {}) },
            finish_reason: finishReason(result.finishReason),
            logprobs: null,
          },
        ],
        usage: usage(result),
        lean,
      };
    }
    const includeUsage = params.stream_options?.include_usage === true;
    const chunk = (
      delta: ChatCompletionChunk["choices"][number]["delta"],
      finish: ChatCompletionFinishReason | null,
    ): ChatCompletionChunk => ({
      ...head,
      object: "chat.completion.chunk",
      choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
      ...(includeUsage ? { usage: null } : {}),
    });
    async function* chunks(): AsyncGenerator<ChatCompletionChunk> {
      // Leaving the loop early (break) stops the generation, as breaking out of engine.chat does.
      try {
        yield { ...chunk({ role: "assistant", content: "" }, null), lean };
        for await (const { text } of stream) if (text) yield chunk({ content: text }, null);
        const result = await stream.result;
        if (result.toolCalls) yield chunk({ tool_calls: result.toolCalls.map((call, index) => ({ index, ...call })) }, null);
        yield chunk({}, finishReason(result.finishReason));
        if (includeUsage) yield { ...head, object: "chat.completion.chunk", choices: [], usage: usage(result) };
      } finally {
        await stream.return();
      }
    }
    return chunks();
  }

  /** `messages` without the oldest turns after the system messages, until the prompt and `reserve` tokens fit the context. */
  async #fit(
    messages: ChatTurn[],
    reserve: number,
    tools: Pick<GenerateOptions, "tools" | "toolChoice">,
  ): Promise<{ messages: ChatTurn[]; dropped: number }> {
    const context = this.#engine.info.contextLength;
    let kept = messages;
    for (;;) {
      const { promptTokens = 0 } = await this.#engine.cacheInfo(kept, tools);
      if (promptTokens + reserve <= context) return { messages: kept, dropped: messages.length - kept.length };
      const first = kept.findIndex((m) => m.role !== "system");
      // The last message is the one being answered: it stays.
      if (first < 0 || first >= kept.length - 1) {
        throw new RangeError(
          `the prompt needs ${promptTokens} tokens and max_tokens ${reserve} more, but the context holds ${context}, ` +
            "even with every earlier turn dropped",
        );
      }
      // A whole turn: its first message and the replies (answers, tool calls and results) up to
      // the next user message, as lean-cli serve drops them.
      let end = first + 1;
      while (end < kept.length - 1 && kept[end]!.role !== "user") end++;
      kept = [...kept.slice(0, first), ...kept.slice(end)];
    }
  }
}
