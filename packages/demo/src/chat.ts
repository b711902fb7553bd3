// The chat page: load a model (progress per file), chat with streamed tokens, stop, tok/s.
// A model is a catalog entry, or any GGUF alone (by file picker, drag and drop, or URL), which
// runs on the tokenizer and chat template in its own metadata.
// URL parameters preselect the form and can start loading: ?model=<id>&backend=<b>&autoload=1,
// or ?gguf=<url>&autoload=1 for a GGUF by URL.
// document.body.dataset.state says what the page is doing (for people and for tests), and
// dataset.tokenizer where the loaded model's tokenizer came from ("gguf" or "files").
import {
  catalog,
  createEngine,
  deleteCached,
  listCached,
  type BackendChoice,
  type ChatMessage,
  type Engine,
  type LoadProgress,
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

/** One <progress> per model file. */
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
  label.textContent = `${p.file} (${p.source}) ${mb(p.loaded)}${total ? ` / ${mb(total)}` : ""}`;
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
    document.body.dataset.tokenizer = engine.info.tokenizerFromGguf ? "gguf" : "files";
    chatSection.hidden = false;
    setState("ready");
    promptInput.focus();
  } catch (e) {
    engineStatus.textContent = `Could not load ${label}: ${errorText(e)}`;
    engineStatus.classList.add("error");
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
  item.textContent = text;
  messageList.append(item);
  return item;
}

async function send(): Promise<void> {
  const text = promptInput.value.trim();
  if (!engine || !text || generation) return;
  promptInput.value = "";
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  generation = new AbortController();
  sendButton.disabled = true;
  stopButton.disabled = false;
  setState("generating");
  const stream = engine.chat(history, {
    maxTokens: Number($<HTMLInputElement>("max-tokens").value) || 256,
    temperature: Number($<HTMLInputElement>("temperature").value) || 0,
    signal: generation.signal,
  });
  let count = 0;
  let firstAt = 0;
  try {
    for await (const token of stream) {
      reply.textContent += token.text;
      count++;
      const now = performance.now();
      firstAt ||= now;
      if (count > 1) stats.textContent = `${count} tokens · ${(((count - 1) * 1000) / (now - firstAt)).toFixed(1)} tok/s`;
    }
  } catch (e) {
    if (!(e instanceof Error && e.name === "AbortError")) reply.classList.add("error");
    if (!(e instanceof Error && e.name === "AbortError")) reply.textContent += `\n[${errorText(e)}]`;
  }
  // The stopped text stays in the conversation, as the model wrote it.
  history.push({ role: "assistant", content: reply.textContent ?? "" });
  try {
    const r = await stream.result;
    stats.textContent =
      `${r.finishReason} · prompt ${r.promptTokens} tokens` +
      (r.cachedTokens > 0 ? ` (${r.cachedTokens} from the cache)` : "") +
      ` · prefill ${r.promptTokens - r.cachedTokens} at ${r.prefillTokensPerSecond.toFixed(1)} tok/s · ` +
      `${r.tokenIds.length} generated at ${r.decodeTokensPerSecond.toFixed(1)} tok/s`;
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
    engineStatus.textContent = `${errorText(engine.failure)} — load the model again.`;
    setState("error");
  }
}

async function refreshCached(): Promise<void> {
  const list = $("cached");
  try {
    const files = await listCached();
    list.replaceChildren(
      ...files.map((f) => {
        const item = document.createElement("li");
        item.textContent = `${f.url} — ${f.bytes === null ? "?" : mb(f.bytes)}${f.models.length ? ` (${f.models.join(", ")})` : ""} `;
        const remove = document.createElement("button");
        remove.textContent = "Delete";
        remove.onclick = async () => {
          await deleteCached(f.url);
          await refreshCached();
        };
        item.append(remove);
        return item;
      }),
    );
    if (files.length === 0) list.textContent = "Nothing cached.";
  } catch (e) {
    list.textContent = errorText(e);
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
};
$("refresh-cache").onclick = () => void refreshCached();
$("clear-cache").onclick = async () => {
  await deleteCached();
  await refreshCached();
};

setState("idle");
void refreshCached();
if (params.get("autoload") === "1") {
  if (params.get("gguf")) loadUrl();
  else void load({ id: modelSelect.value });
}
