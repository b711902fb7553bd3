#!/usr/bin/env bash
# Browser tests: builds both WebAssembly packages (scripts/build.sh) and lean-js, installs the
# pinned Playwright (npm ci in playwright/; the browsers are the system's, from scripts/setup.sh),
# then checks greedy ids against the HF fixtures in Chromium and Firefox on the simd and threads
# backends for every test model (tests/parity.spec.js), lean-js's stopping and caching
# (tests/lean-js.spec.js), downloads that survive a cut connection, a lost network and a lying
# server (tests/downloads.spec.js), the demo's two pages (tests/demo.spec.js) and an app made with `npm create vite` on the packed lean-js
# (tests/vite-app.spec.js, built by scripts/test-vite-app.sh), and prints the speed table and
# one closing line `browser: N passed, N failed`.
# Arguments go to `playwright test` (e.g. --project chromium, -g threads).
# Env: LEAN_MODELS (default models/), LEAN_TEST_PORT (default 8787), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}

scripts/setup.sh
scripts/fetch-test-models.sh "$LEAN_MODELS"
scripts/build.sh
[ -x node_modules/.bin/tsc ] || npm ci --no-audit --no-fund
npm run build -w lean-js
npm run build -w lean-demo
node scripts/build-site.mjs   # _site/: the static site (tests/demo.spec.js serves it with scripts/serve-site.mjs)

# The Vite app, built before the one Playwright run so that its report holds every test. When
# building it fails (e.g. npm's registry unreachable with nothing cached), its tests fail.
vite_app=$(mktemp -d)
trap 'rm -rf "$vite_app"' EXIT
export LEAN_VITE_APP="$vite_app/app/dist"
scripts/test-vite-app.sh --build-only "$vite_app" || echo "building the Vite app failed" >&2

cd playwright
# Playwright's own browser downloads are neither possible nor needed here.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund
status=0
npx playwright test "$@" || status=$?
node summary.js test-results/results.json || status=$((status ? status : 1))
exit "$status"
