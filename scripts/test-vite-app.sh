#!/usr/bin/env bash
# An app made with `npm create vite` installs the packed lean-js tarball and generates: packs
# lean-js (npm pack builds it: run scripts/build.sh first), scaffolds a vanilla-ts app with a
# pinned create-vite, npm-installs the tarball and a pinned Vite, writes a src/main.ts that
# creates an engine from the local test model's URLs (/models/…) and generates greedily, builds
# it (`npm run build`: tsc, then vite build, with base /app/), and runs
# playwright/tests/vite-app.spec.js on it: playwright/server.js serves the app's dist/ under /app/
# with COOP/COEP, and the ids must equal the HF reference in Chromium and Firefox.
# Usage: scripts/test-vite-app.sh [playwright test args]   the whole test, in a temporary dir
#        scripts/test-vite-app.sh --build-only DIR         only the app, built into DIR/app/dist
#                                                          (scripts/test-browser.sh runs the spec)
# Needs npm's registry the first time; later runs take what they can from npm's cache.
# Env: LEAN_MODELS (default models/), LEAN_TEST_PORT (default 8787).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
create_vite_version=9.3.0 # its vanilla-ts template asks for vite ^8.3.4 and typescript ~7.0.2
vite_version=8.4.0
npm_flags=(--prefer-offline --no-audit --no-fund)

build_only=false
if [ "${1:-}" = --build-only ]; then
    [ $# -eq 2 ] || {
        echo "usage: scripts/test-vite-app.sh --build-only DIR" >&2
        exit 2
    }
    build_only=true
    work=$(mkdir -p "$2" && cd "$2" && pwd)
    shift 2
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

# --- lean-js, packed as it would be published -------------------------------------------------
[ -x node_modules/.bin/tsc ] || npm ci "${npm_flags[@]}"
rm -f "$work"/lean-js-*.tgz
npm pack -w lean-js --pack-destination "$work" --loglevel=warn >/dev/null
tarball=$(ls "$work"/lean-js-*.tgz)
echo "vite app: packed $(basename "$tarball")"

# --- the app -----------------------------------------------------------------------------------
rm -rf "$work/app"
(cd "$work" && npm create --yes "vite@$create_vite_version" app -- \
    --template vanilla-ts --no-interactive --no-immediate </dev/null >/dev/null)
cd "$work/app"
npm install "${npm_flags[@]}" "$tarball"
npm install "${npm_flags[@]}" --save-dev --save-exact "vite@$vite_version"

# The prompt is the chat_short case of the model's HF fixture, so the spec can check the ids.
node - "$repo/fixtures/hf/smollm2-135m-instruct-q4_0.json" >src/main.ts <<'EOF'
const { readFileSync } = require("node:fs");
const fixture = JSON.parse(readFileSync(process.argv[2], "utf8"));
const chatShort = fixture.cases.find((c) => c.name === "chat_short");
process.stdout.write(`// Generates greedily with lean-js from lean's test model, served by the page's server under
// /models/. ?backend=simd|threads|auto (default auto). The outcome goes on <body> for the
// Playwright test: data-result (JSON) or data-error.
import { createEngine, type BackendChoice } from 'lean-js'

const messages = ${JSON.stringify(chatShort.messages)}
const maxTokens = ${chatShort.greedy_ids.length}
const backend = (new URLSearchParams(location.search).get('backend') ?? 'auto') as BackendChoice

const output = document.querySelector<HTMLDivElement>('#app')!
try {
  const engine = await createEngine({
    backend,
    model: {
      gguf: '/models/smollm2-135m-instruct-q4_0.gguf',
      tokenizer: '/models/${fixture.tokenizer}/tokenizer.json',
      tokenizerConfig: '/models/${fixture.tokenizer}/tokenizer_config.json',
      chatTemplate: '/models/${fixture.tokenizer}/chat_template.jinja',
    },
    cache: false,
  })
  const ids: number[] = []
  let text = ''
  for await (const token of engine.chat(messages, { maxTokens, temperature: 0, stopTokenIds: [] })) {
    ids.push(token.tokenId)
    text += token.text
    output.textContent = text
  }
  document.body.dataset.result = JSON.stringify({ backend: engine.backend, crossOriginIsolated, ids, text })
} catch (e) {
  document.body.dataset.error = String(e)
}
`);
EOF
npm run build -- --base=/app/ >build.log 2>&1 || {
    cat build.log >&2
    exit 1
}
echo "vite app: built $work/app/dist (create-vite $create_vite_version, vite $vite_version)"
$build_only && exit 0

# --- the test ----------------------------------------------------------------------------------
cd "$repo/playwright"
[ -d node_modules/@playwright/test ] || PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund
LEAN_VITE_APP="$work/app/dist" npx playwright test tests/vite-app.spec.js "$@"
