// npm postinstall: lets Playwright 1.64.1 drive Debian's Firefox ESR 140 over WebDriver BiDi.
// Playwright sends a few BiDi commands that ESR 140 does not know yet and treats the "unknown
// command" answer as fatal, so even launching fails ("network.addDataCollector: unknown
// command"). None of them matters to these tests (response bodies, downloads, emulation of
// locale, screen and the like, which the tests do not ask for), so this answers them as
// succeeded. Idempotent; it refuses any other Playwright version, whose code it has not been
// checked against.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const expectedVersion = "1.64.1";
const optionalCommands = [
  "network.addDataCollector",
  "browser.setDownloadBehavior",
  "emulation.setGeolocationOverride",
  "emulation.setLocaleOverride",
  "emulation.setNetworkConditions",
  "emulation.setScreenOrientationOverride",
  "emulation.setScreenSettingsOverride",
  "emulation.setTimezoneOverride",
  "emulation.setUserAgentOverride",
];

const { version } = require("playwright-core/package.json");
if (version !== expectedVersion) {
  throw new Error(`patch-firefox-esr.js is written for playwright-core ${expectedVersion}, not ${version}`);
}
const file = require.resolve("playwright-core/lib/coreBundle");
const source = readFileSync(file, "utf8");
const marker = "/* lean: Firefox ESR optional BiDi commands */";
if (!source.includes(marker)) {
  // BidiSession.dispatchMessage's error branch.
  const errorBranch = `          if (object.type === "error") {\n            if (object.error === "no such frame")`;
  const at = source.indexOf(errorBranch);
  if (at < 0 || source.indexOf(errorBranch, at + 1) >= 0) {
    throw new Error(`patch-firefox-esr.js: BidiSession's error branch not found once in ${file}`);
  }
  const optional =
    `          if (${marker} object.type === "error" && object.error === "unknown command" && ` +
    `${JSON.stringify(optionalCommands)}.includes(callback.error.method)) {\n` +
    `            callback.resolve({});\n` +
    `          } else `;
  writeFileSync(file, source.slice(0, at) + optional + source.slice(at).trimStart());
}
