"""A gate in front of a real server, for the end-to-end kill-and-resume test.

    python tests/e2e_gate.py --port P --upstream-port Q --answer K -- SERVER COMMAND ...

Starts SERVER COMMAND (which must listen on 127.0.0.1:Q) as its child and serves HTTP on
127.0.0.1:P, passing every request through to the server unchanged, except that only the first K
generation requests (POST .../completions) go through: later ones are held unanswered until the
gate stops. So a harness run against the gate commits exactly K answers and then waits,
whatever the machine's speed, and a test can kill it part-way without racing the server.

The gate exits when its child does, with its code; SIGTERM to the process group (how the harness
and the test stop a launched server) stops both.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HELD = threading.Event()  # never set: held requests wait until the process ends
PASSED_HEADERS = ("Content-Type", "Authorization", "Accept")


def make_handler(upstream: str, answers: int):
    lock = threading.Lock()
    asked = [0]

    class Gate(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            return

        def _forward(self, body: bytes | None) -> None:
            headers = {k: self.headers[k] for k in PASSED_HEADERS if self.headers[k]}
            request = urllib.request.Request(
                upstream + self.path, data=body, headers=headers, method=self.command
            )
            try:
                with urllib.request.urlopen(request, timeout=600) as resp:  # noqa: S310
                    status, ctype, payload = resp.status, resp.headers["Content-Type"], resp.read()
            except urllib.error.HTTPError as exc:
                status, ctype, payload = exc.code, exc.headers["Content-Type"], exc.read()
            except OSError:  # the server is not listening yet (or has gone)
                status, ctype, payload = 503, "text/plain", b"gate: server not answering"
            self.send_response(status)
            self.send_header("Content-Type", ctype or "application/octet-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):  # noqa: N802 - the base class's name
            self._forward(None)

        def do_POST(self):  # noqa: N802 - the base class's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.rstrip("/").endswith("completions"):
                with lock:
                    asked[0] += 1
                    passes = asked[0] <= answers
                if not passes:
                    HELD.wait()
                    return
            self._forward(body)

    return Gate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--answer", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    child = subprocess.Popen(command)  # same process group: a signal to the group reaches it
    handler = make_handler(f"http://127.0.0.1:{args.upstream_port}", args.answer)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = child.wait()
    sys.stdout.flush()
    os._exit(code)  # held handler threads never return


if __name__ == "__main__":
    raise SystemExit(main())
