/*
 * lean demo: opt-in cross-origin isolation through a service worker, for static hosts that
 * cannot send the COOP/COEP headers (GitHub Pages and the like). The threads backend needs
 * SharedArrayBuffer, which browsers give only to cross-origin isolated pages.
 *
 * One file, two roles:
 * - In the page (a classic <script src="coi-sw.js"> in <head>): when the page is not already
 *   isolated and the opt-in is given (`?coi=1` in the URL, remembered in localStorage until
 *   `?coi=0`), it registers this file as a service worker and reloads the page once it controls
 *   it. `?coi=0` unregisters it and forgets the opt-in. It reloads at most once per tab session:
 *   if the page is still not isolated after that, it gives up and says why in the console and
 *   in `window.leanCoi`.
 * - In the service worker: same-origin responses get Cross-Origin-Opener-Policy: same-origin,
 *   Cross-Origin-Embedder-Policy: require-corp and Cross-Origin-Resource-Policy: same-origin
 *   (unless they carry their own). Cross-origin requests (e.g. model downloads from Hugging Face,
 *   CORS fetches, fine under COEP) are not touched.
 */
/* eslint-disable no-restricted-globals */
if (typeof window === "undefined") {
  self.addEventListener("install", () => self.skipWaiting());
  self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
  self.addEventListener("fetch", (event) => {
    const request = event.request;
    if (new URL(request.url).origin !== self.location.origin) return;
    if (request.cache === "only-if-cached" && request.mode !== "same-origin") return;
    event.respondWith(
      fetch(request).then((response) => {
        if (response.type === "opaque" || response.type === "opaqueredirect" || response.status === 0) return response;
        const headers = new Headers(response.headers);
        headers.set("Cross-Origin-Opener-Policy", "same-origin");
        headers.set("Cross-Origin-Embedder-Policy", "require-corp");
        if (!headers.has("Cross-Origin-Resource-Policy")) headers.set("Cross-Origin-Resource-Policy", "same-origin");
        headers.set("X-Lean-Coi", "service-worker");
        return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
      }),
    );
  });
} else {
  (() => {
    const KEY = "lean-coi";
    const RELOADED = "lean-coi-reloaded";
    const state = (window.leanCoi = { status: "off", reason: "" });
    const params = new URLSearchParams(location.search);
    const script = document.currentScript && document.currentScript.src;
    const container = navigator.serviceWorker;
    try {
      if (params.get("coi") === "0") {
        localStorage.removeItem(KEY);
        if (container) {
          container.getRegistrations().then((registrations) => {
            for (const registration of registrations) {
              if (registration.active && registration.active.scriptURL === script) registration.unregister();
            }
          });
        }
        state.reason = "turned off by ?coi=0";
        return;
      }
      if (params.get("coi") === "1") localStorage.setItem(KEY, "1");
      if (localStorage.getItem(KEY) !== "1") return;
    } catch {
      // No localStorage (sandboxed): only ?coi=1 counts.
      if (params.get("coi") !== "1") return;
    }
    if (window.crossOriginIsolated) {
      sessionStorage.removeItem(RELOADED);
      state.status = container && container.controller ? "service-worker" : "headers";
      return;
    }
    const giveUp = (reason) => {
      state.status = "failed";
      state.reason = reason;
      console.warn(`lean: cross-origin isolation through the service worker failed: ${reason}`);
    };
    if (!window.isSecureContext) return giveUp("service workers need a secure context (https, or localhost)");
    if (!container || !script) return giveUp("this browser offers no service workers here (a private window?)");
    let reloading = false;
    const reloadOnce = () => {
      if (reloading) return;
      if (sessionStorage.getItem(RELOADED)) {
        return giveUp("the page reloaded once under the service worker and is still not isolated");
      }
      reloading = true;
      sessionStorage.setItem(RELOADED, "1");
      state.status = "reloading";
      location.reload();
    };
    state.status = "registering";
    container.addEventListener("controllerchange", reloadOnce);
    container.register(script).then(
      (registration) => {
        // Already controlled but not isolated: this load came before the worker took over.
        if (container.controller) reloadOnce();
        else if (registration.active && !registration.installing && !registration.waiting) reloadOnce();
      },
      (error) => giveUp(`registering the service worker failed: ${error}`),
    );
  })();
}
