// The chat page: load a model (progress per file: bytes, speed, time left), chat with streamed
// tokens rendered as Markdown (marked, then sanitized by DOMPurify), a system prompt, sampling
// settings, Stop, live prefill and decode tok/s. Each turn sends the whole conversation through
// the model's chat template; lean-js keeps the KV cache across turns, so only the new messages
// are prefilled (the stats say how many prompt tokens came from the cache).
// A model is a catalog entry, or any GGUF alone (by file picker, drag and drop, or URL), which
// runs on the tokenizer and chat template in its own metadata.
// URL parameters preselect the form and can start loading: ?model=<id>&backend=<b>&autoload=1,
// or ?gguf=<url>&autoload=1 for a GGUF by URL.
// document.body.dataset.state says what the page is doing (for people and for tests), and
// dataset.tokenizer where the loaded model's tokenizer came from ("gguf" or "files").
import DOMPurify from "dompurify";
import { marked } from "marked";
import {
  catalog,
  createEngine,
  deleteCached,
  listCached,
  type BackendChoice,
  type ChatMessage,
  type Engine,
  type LoadProgress,
  type GenerateOptions,
  type ModelFiles,
} from "lean-js";

/** Works offline: the dev server serves lean's test models under /models/. */
const DEFAULT_MODEL = "smollm2-135m-instruct-q4_0";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;
const modelSelect = $<HTMLSelectElement>("model");
const backendSelect = $<HTMLSelectElement>("backend");
const contextInput = $<HTMLInputElement>("context");
const loadButton = $<HTMLButtonElement>("load");
const ggufFileInput = $<HTMLInputElement>("gguf-file");
const ggufUrlInput = $<HTMLInputElement>("gguf-url");
const loadUrlButton = $<HTMLButtonElement>("load-url");
const dropOverlay = $("drop-overlay");
const progressBox = $("progress");
const engineStatus = $("engine-status");
const backendBadge = $("backend-badge");
const loadError = $("load-error");
const pageError = $("page-error");
const chatSection = $("chat");
const messageList = $("messages");
const composer = $<HTMLFormElement>("composer");
const promptInput = $<HTMLTextAreaElement>("prompt");
const sendButton = $<HTMLButtonElement>("send");
const stopButton = $<HTMLButtonElement>("stop");
const stats = $("stats");

let engine: Engine | null = null;
let history: ChatMessage[] = [];
let generation: AbortController | null = null;

const setState = (state: "idle" | "loading" | "ready" | "generating" | "error") => {
  document.body.dataset.state = state;
};
const mb = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`;
const errorText = (e: unknown) => (e instanceof Error ? `${e.name}: ${e.message}` : String(e));
const duration = (seconds: number) =>
  !Number.isFinite(seconds) ? "?" : seconds < 60 ? `${Math.ceil(seconds)} s` : `${Math.floor(seconds / 60)} min ${Math.ceil(seconds % 60)} s`;

/** What a person can do about an error, by its name (lean-js's ErrorName) or message. */
export function advice(e: unknown): string {
  const name = e instanceof Error ? e.name : "";
  const message = e instanceof Error ? e.message : String(e);
  if (name === "BackendUnavailableError")
    return "Pick another backend (auto picks one this browser can run), or open the Device check page to see what is missing.";
  if (name === "ModelFileError" || /fetch|network/i.test(message))
    return "Check the URL and your connection (a file on another site must allow cross-origin requests, CORS). A file that failed its size or checksum check is not kept: load it again.";
  if (name === "LeanPanicError")
    return "The engine stopped (out of memory, or a bug): load the model again, with a smaller context or a smaller model.";
  if (name === "EngineDisposedError") return "The engine is gone: load the model again.";
  if (name === "QuotaExceededError" || /quota/i.test(message))
    return "This browser's storage is full: delete cached models below, then load again.";
  if (/context/i.test(message)) return "Clear the chat, or load the model with a larger context.";
  if (/chat template/i.test(message)) return "This model has no chat template: pick an instruct (chat) model.";
  if (/gguf|magic|tensor|truncat/i.test(message))
    return "The file is not a GGUF lean can read: check that it is a complete .gguf file of a supported architecture (llama, qwen2, qwen3, gemma3).";
  return "Reload the page and try again; the Device check page shows what this browser supports.";
}

/** Shows an error in `box`: what happened, then what to do. */
function showError(box: HTMLElement, what: string, e: unknown, withDetail = true): void {
  const head = document.createElement("strong");
  head.textContent = what;
  const detail = document.createElement("p");
  detail.textContent = errorText(e);
  const todo = document.createElement("p");
  todo.className = "advice";
  todo.textContent = `What to do: ${advice(e)}`;
  box.replaceChildren(head, ...(withDetail ? [detail] : []), todo);
  box.hidden = false;
}

// Links in model output open in a new tab, never with access to this page.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

/**
 * Model output (untrusted) as HTML: Markdown by marked (GitHub-flavoured), then sanitized by
 * DOMPurify (no scripts, event handlers, javascript: URLs, forms or styles).
 */
export function renderMarkdown(element: HTMLElement, text: string): void {
  const html = marked.parse(text, { async: false, gfm: true, breaks: true });
  element.innerHTML = DOMPurify.sanitize(html, { FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"], FORBID_ATTR: ["style"] });
}
// For tests and the curious: the page's own renderer.
(globalThis as unknown as { leanDemo: object }).leanDemo = { renderMarkdown };

window.addEventListener("error", (event) => showError(pageError, "Something went wrong on this page.", event.error ?? event.message));
window.addEventListener("unhandledrejection", (event) => showError(pageError, "Something went wrong on this page.", event.reason));

for (const model of catalog) {
  const option = new Option(
    `${model.name} — ${mb(model.approxBytes)}${model.local ? "" : " (Hugging Face)"}`,
    model.id,
  );
  modelSelect.add(option);
}
const params = new URLSearchParams(location.search);
modelSelect.value = params.get("model") ?? DEFAULT_MODEL;
backendSelect.value = params.get("backend") ?? "auto";
ggufUrlInput.value = params.get("gguf") ?? "";

/** What to load: a catalog id, or a GGUF alone (a File or a URL) with a name to show. */
type ModelSource = { id: string } | { gguf: File | string; label: string };

/** Per file: when its bytes started coming, for the speed and time left. */
const progressStarts = new Map<string, { at: number; loaded: number }>();

/** One <progress> per model file: bytes, speed and time left. */
function showProgress(p: LoadProgress): void {
  let row = progressBox.querySelector<HTMLDivElement>(`[data-file="${p.file}"]`);
  if (!row) {
    row = document.createElement("div");
    row.dataset.file = p.file;
    row.append(document.createElement("span"), document.createElement("progress"));
    progressBox.append(row);
  }
  const [label, bar] = row.children as unknown as [HTMLSpanElement, HTMLProgressElement];
  const total = p.total ?? 0;
  const now = performance.now();
  const start = progressStarts.get(p.file) ?? { at: now, loaded: p.loaded };
  progressStarts.set(p.file, start);
  const seconds = (now - start.at) / 1000;
  const speed = seconds > 0.2 ? (p.loaded - start.loaded) / seconds : 0;
  const where = p.source === "network" ? "downloading" : p.source === "cache" ? "from the cache" : "local file";
  let rate = "";
  if (speed > 0) {
    rate = ` · ${mb(speed)}/s`;
    if (total && p.loaded < total) rate += ` · ${duration((total - p.loaded) / speed)} left`;
  }
  if (total && p.loaded >= total) rate += " · done";
  label.textContent = `${p.file} (${where}) ${mb(p.loaded)}${total ? ` / ${mb(total)}` : ""}${rate}`;
  if (total) {
    bar.max = total;
    bar.value = p.loaded;
  } else {
    bar.removeAttribute("value");
  }
}

async function load(source: ModelSource): Promise<void> {
  generation?.abort();
  engine?.dispose();
  engine = null;
  history = [];
  messageList.replaceChildren();
  chatSection.hidden = true;
  progressBox.replaceChildren();
  progressStarts.clear();
  loadError.hidden = true;
  backendBadge.hidden = true;
  backendBadge.textContent = "";
  setLoadButtons(true);
  setState("loading");
  delete document.body.dataset.tokenizer;
  engineStatus.classList.remove("error");
  const label = "id" in source ? source.id : source.label;
  engineStatus.textContent = `Loading ${label}…`;
  const started = performance.now();
  try {
    const model: string | ModelFiles = "id" in source ? source.id : { gguf: source.gguf };
    engine = await createEngine({
      model,
      backend: backendSelect.value as BackendChoice,
      contextLength: contextInput.value ? Number(contextInput.value) : undefined,
      onProgress: showProgress,
      onWarning: (message) => {
        const warning = document.createElement("p");
        warning.className = "warning";
        warning.textContent = message;
        progressBox.append(warning);
      },
    });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const tokenizer = engine.info.tokenizerFromGguf
      ? "tokenizer and chat template from the GGUF's metadata"
      : "tokenizer files";
    engineStatus.textContent =
      `${label}: ${engine.backend} backend (${engine.backendReason}). ${engine.info.description}; ` +
      `context ${engine.info.contextLength} tokens; ${tokenizer}` +
      `${engine.info.hasChatTemplate ? "" : " (no chat template: chat needs one)"}; loaded in ${seconds} s.`;
    document.body.dataset.backend = engine.backend;
    backendBadge.textContent = engine.backend;
    backendBadge.className = `badge ${engine.backend}`;
    backendBadge.title = `${engine.backend} backend: ${engine.backendReason}`;
    backendBadge.hidden = false;
    document.body.dataset.tokenizer = engine.info.tokenizerFromGguf ? "gguf" : "files";
    chatSection.hidden = false;
    setState("ready");
    promptInput.focus();
  } catch (e) {
    engineStatus.textContent = `Could not load ${label}: ${errorText(e)}`;
    engineStatus.classList.add("error");
    // (The status line above says what failed.)
    showError(loadError, `Could not load ${label}`, e, false);
    setState("error");
  } finally {
    setLoadButtons(false);
    void refreshCached();
  }
}

function setLoadButtons(disabled: boolean): void {
  loadButton.disabled = disabled;
  loadUrlButton.disabled = disabled;
  ggufFileInput.disabled = disabled;
}

/** A file picked or dropped: loaded at once (nothing else is needed). */
function loadFile(file: File): void {
  void load({ gguf: file, label: file.name });
}

function loadUrl(): void {
  const url = ggufUrlInput.value.trim();
  if (!url) {
    engineStatus.textContent = "Enter the URL of a .gguf file (absolute, or relative to this page).";
    engineStatus.classList.add("error");
    ggufUrlInput.focus();
    return;
  }
  void load({ gguf: url, label: url });
}

/** Drag and drop anywhere on the page: a .gguf file, or a link to one. */
function setUpDrop(): void {
  let depth = 0;
  const carriesModel = (event: DragEvent) =>
    event.dataTransfer?.types.some((t) => t === "Files" || t === "text/uri-list") ?? false;
  const hide = () => {
    depth = 0;
    dropOverlay.hidden = true;
  };
  document.addEventListener("dragenter", (event) => {
    if (!carriesModel(event)) return;
    event.preventDefault();
    depth++;
    dropOverlay.hidden = false;
  });
  document.addEventListener("dragover", (event) => {
    if (!carriesModel(event)) return;
    event.preventDefault();
    if (event.dataTransfer) event.dataTransfer.dropEffect = "copy";
  });
  document.addEventListener("dragleave", () => {
    if (--depth <= 0) hide();
  });
  document.addEventListener("drop", (event) => {
    hide();
    const data = event.dataTransfer;
    if (!data) return;
    event.preventDefault();
    if (document.body.dataset.state === "loading") return;
    const file = data.files[0];
    if (file) return loadFile(file);
    const url = data.getData("text/uri-list").split(/\r?\n/).find((line) => line && !line.startsWith("#"));
    if (url) {
      ggufUrlInput.value = url;
      loadUrl();
    }
  });
}

function addMessage(role: string, text: string): HTMLElement {
  const item = document.createElement("li");
  item.className = role;
  if (role === "assistant") {
    const body = document.createElement("div");
    body.className = "markdown";
    renderMarkdown(body, text);
    item.append(body);
  } else {
    item.textContent = text;
  }
  messageList.append(item);
  item.scrollIntoView({ block: "nearest" });
  return item;
}

const numberField = (id: string) => {
  const value = $<HTMLInputElement>(id).value.trim();
  return value === "" || !Number.isFinite(Number(value)) ? undefined : Number(value);
};

/** The sampling settings of the form (empty fields: lean-js's defaults). */
function samplingOptions(): GenerateOptions {
  const seed = numberField("seed");
  return {
    maxTokens: numberField("max-tokens") ?? 256,
    temperature: numberField("temperature") ?? 0,
    topP: numberField("top-p"),
    topK: numberField("top-k"),
    minP: numberField("min-p"),
    repetitionPenalty: numberField("repetition-penalty"),
    ...(seed === undefined ? {} : { seed: Math.trunc(seed) }),
  };
}

/** The conversation as the model sees it: the system prompt (if any) first. */
function conversation(): ChatMessage[] {
  const system = $<HTMLTextAreaElement>("system-prompt").value.trim();
  return system ? [{ role: "system", content: system }, ...history] : [...history];
}

async function send(): Promise<void> {
  const text = promptInput.value.trim();
  if (!engine || !text || generation) return;
  promptInput.value = "";
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  const body = reply.querySelector<HTMLElement>(".markdown")!;
  generation = new AbortController();
  sendButton.disabled = true;
  stopButton.disabled = false;
  setState("generating");
  const messages = conversation();
  document.body.dataset.lastMessages = JSON.stringify(messages);
  const options = { ...samplingOptions(), signal: generation.signal };
  const started = performance.now();
  // How much of the prompt is new (to prefill) and how much comes from the KV cache.
  let prefillTokens = 0;
  let cachedTokens = 0;
  try {
    const info = await engine.cacheInfo(messages);
    cachedTokens = info.reusableTokens ?? 0;
    prefillTokens = (info.promptTokens ?? 0) - cachedTokens;
  } catch {
    // Only for the live stats: the generation below reports its own error.
  }
  const stream = engine.chat(messages, options);
  let count = 0;
  let firstAt = 0;
  let replyText = "";
  let pending = 0;
  const render = () => {
    pending = 0;
    renderMarkdown(body, replyText);
  };
  const liveStats = () => {
    const now = performance.now();
    if (!firstAt) {
      const cached = cachedTokens > 0 ? ` (${cachedTokens} from the cache)` : "";
      stats.textContent = `prefilling ${prefillTokens} tokens${cached} · ${((now - started) / 1000).toFixed(1)} s`;
      return;
    }
    const prefill = `prefill ${((prefillTokens * 1000) / Math.max(firstAt - started, 1)).toFixed(1)} tok/s`;
    const decode = count > 1 ? ` · decode ${(((count - 1) * 1000) / Math.max(now - firstAt, 1)).toFixed(1)} tok/s` : "";
    stats.textContent = `${count} tokens · ${prefill}${decode}`;
  };
  const ticker = setInterval(liveStats, 250);
  liveStats();
  let failed: unknown = null;
  try {
    for await (const token of stream) {
      replyText += token.text;
      count++;
      firstAt ||= performance.now();
      // Re-render the Markdown at most once a frame, as tokens stream.
      pending ||= requestAnimationFrame(render);
      if (count === 1 || count % 4 === 0) liveStats();
    }
  } catch (e) {
    if (!(e instanceof Error && e.name === "AbortError")) failed = e;
  }
  clearInterval(ticker);
  if (pending) cancelAnimationFrame(pending);
  render();
  // The stopped text stays in the conversation, as the model wrote it.
  history.push({ role: "assistant", content: replyText });
  if (failed) {
    reply.classList.add("error");
    const box = document.createElement("div");
    box.className = "error-box";
    showError(box, "The reply stopped with an error", failed);
    reply.append(box);
  }
  try {
    const r = await stream.result;
    stats.textContent =
      `${r.finishReason} · prompt ${r.promptTokens} tokens` +
      (r.cachedTokens > 0 ? ` (${r.cachedTokens} from the cache)` : "") +
      ` · prefill ${r.promptTokens - r.cachedTokens} at ${r.prefillTokensPerSecond.toFixed(1)} tok/s · ` +
      `${r.tokenIds.length} generated at ${r.decodeTokensPerSecond.toFixed(1)} tok/s`;
    if (r.finishReason === "context_full") {
      const note = document.createElement("p");
      note.className = "warning";
      note.textContent = "The conversation filled the model's context: Clear the chat to go on, or load the model with a larger context.";
      reply.append(note);
    }
    document.body.dataset.lastTokenIds = JSON.stringify(r.tokenIds);
  } catch (e) {
    stats.textContent = errorText(e);
  }
  generation = null;
  sendButton.disabled = false;
  stopButton.disabled = true;
  if (engine.usable) {
    setState("ready");
  } else {
    engineStatus.textContent = "The engine stopped.";
    showError(loadError, "The engine stopped", engine.failure);
    setState("error");
  }
}

async function refreshCached(): Promise<void> {
  const list = $("cached");
  try {
    const files = await listCached();
    // Grouped by catalog model, for each model whose GGUF is cached (a tokenizer shared by two
    // models shows under both, and goes with either); other files alone.
    const byModel = new Map<string, typeof files>();
    for (const f of files) {
      for (const id of f.models) byModel.set(id, [...(byModel.get(id) ?? []), f]);
    }
    for (const [id, modelFiles] of byModel) {
      if (!modelFiles.some((f) => /\.gguf$/i.test(f.url))) byModel.delete(id);
    }
    const grouped = new Set([...byModel.values()].flat());
    const loose = files.filter((f) => !grouped.has(f));
    const entry = (label: string, bytes: number | null, detail: string, target: string) => {
      const item = document.createElement("li");
      item.dataset.target = target;
      const name = document.createElement("span");
      name.textContent = `${label} — ${bytes === null ? "size unknown" : mb(bytes)}`;
      name.title = detail;
      const remove = document.createElement("button");
      remove.textContent = "Delete";
      remove.className = "delete";
      remove.onclick = async () => {
        remove.disabled = true;
        try {
          await deleteCached(target);
        } catch (e) {
          showError(pageError, `Could not delete ${label}`, e);
        }
        await refreshCached();
      };
      item.append(name, " ", remove);
      return item;
    };
    const items = [
      ...[...byModel].map(([id, modelFiles]) =>
        entry(
          catalog.find((m) => m.id === id)?.name ?? id,
          modelFiles.reduce<number | null>((sum, f) => (sum === null || f.bytes === null ? null : sum + f.bytes), 0),
          modelFiles.map((f) => f.url).join("\n"),
          id,
        ),
      ),
      ...loose.map((f) => entry(decodeURIComponent(f.url.split("/").pop() ?? f.url), f.bytes, f.url, f.url)),
    ];
    list.replaceChildren(...items);
    const total = files.reduce((sum, f) => sum + (f.bytes ?? 0), 0);
    if (files.length === 0) list.textContent = "Nothing cached.";
    else list.dataset.totalBytes = String(total);
  } catch (e) {
    list.textContent = `${errorText(e)} — Cache Storage may be unavailable here (a private window, or a page that is not a secure context).`;
  }
}

loadButton.onclick = () => void load({ id: modelSelect.value });
ggufFileInput.onchange = () => {
  const file = ggufFileInput.files?.[0];
  if (file) loadFile(file);
  // Picking the same file again loads it again.
  ggufFileInput.value = "";
};
loadUrlButton.onclick = loadUrl;
ggufUrlInput.onkeydown = (event) => {
  if (event.key === "Enter") {
    event.preventDefault();
    loadUrl();
  }
};
setUpDrop();
composer.onsubmit = (event) => {
  event.preventDefault();
  void send();
};
promptInput.onkeydown = (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    void send();
  }
};
stopButton.onclick = () => generation?.abort();
$("clear").onclick = () => {
  history = [];
  messageList.replaceChildren();
  stats.textContent = "";
  // A new conversation: the next turn prefills from scratch.
  if (engine?.usable && !generation) void engine.resetChat().catch(() => undefined);
};
$("refresh-cache").onclick = () => void refreshCached();
$("clear-cache").onclick = async () => {
  try {
    await deleteCached();
  } catch (e) {
    showError(pageError, "Could not delete the cached models", e);
  }
  await refreshCached();
};

setState("idle");
void refreshCached();
if (params.get("autoload") === "1") {
  if (params.get("gguf")) loadUrl();
  else void load({ id: modelSelect.value });
}
