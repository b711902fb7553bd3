"""The HTTP server of scripts/device-browser.sh (the lent GPU machine has Python, no Node).

Serves bench.html and bench.js (this folder), the Playwright test page's harness and worker
(playwright/page), the wasm package at /pkg/ and the models at /models/, with COOP/COEP as the
test server does; a POST to /progress appends its JSON to OUT/browser-progress.jsonl, and one to
/result writes OUT/browser{TAG}.json and ends the server.

    python3 server.py PORT PKG_DIR MODELS_DIR OUT_DIR [TAG]
"""
import http.server
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, "..", "..", "playwright", "page")
PORT, PKG, MODELS, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
TAG = sys.argv[5] if len(sys.argv) > 5 else ""
TYPES = {".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm",
         ".json": "application/json", ".gguf": "application/octet-stream"}


def resolve(path):
    path = path.split("?")[0]
    if ".." in path:
        return None
    for prefix, root in (("/pkg/", PKG), ("/models/", MODELS)):
        if path.startswith(prefix):
            return os.path.join(root, path[len(prefix):])
    for root in (HERE, PAGE):
        candidate = os.path.join(root, path.lstrip("/"))
        if os.path.isfile(candidate):
            return candidate
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def headers_out(self, status, length, kind):
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", kind)
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()

    def do_GET(self):
        file = resolve(self.path)
        if file is None or not os.path.isfile(file):
            self.headers_out(404, 0, "text/plain")
            return
        size = os.path.getsize(file)
        self.headers_out(200, size, TYPES.get(os.path.splitext(file)[1], "application/octet-stream"))
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                self.wfile.write(chunk)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.headers_out(204, 0, "text/plain")
        if self.path == "/progress":
            with open(os.path.join(OUT, "browser-progress.jsonl"), "ab") as f:
                f.write(body + b"\n")
            print("progress:", body.decode()[:400], flush=True)
        elif self.path == "/result":
            with open(os.path.join(OUT, f"browser{TAG}.json"), "wb") as f:
                f.write(body)
            print("result:", body.decode()[:2000], flush=True)
            threading.Thread(target=self.server.shutdown).start()


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
