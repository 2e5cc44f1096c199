# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serve one model folder to the other nodes over the fabric, for as long as they copy from it.

Started by the weights role on a node (or the controller) that holds a verified copy; standard library only, so it
runs on any node Python from 3.9. GET and HEAD of a file's path under the folder, with byte ranges (a copy
that was cut off resumes where it stopped), sent with sendfile. Every request must carry the run's bearer token,
read from a root-only file (never from the command line, which every process can read). It ends by itself when
nothing has been asked for --idle seconds, or when killed through its PID file.

    python3 weights_server.py --bind ADDR --port PORT --root FOLDER --token-file FILE --pid-file FILE [--idle S]
"""

import argparse
import hmac
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpulab-weights"

    def log_message(self, *args):  # the play reports what matters; no per-request log
        pass

    def _fail(self, code, text):
        body = (text + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _file(self):
        """The file asked for, or None after an answer was sent."""
        self.server.touch()
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), ("Bearer " + self.server.token).encode()):
            self._fail(401, "a valid bearer token is required")
            return None
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        parts = rel.split("/")
        if not rel or any(p in ("", ".", "..") or p.startswith(".gpulab") for p in parts):
            self._fail(404, "no such file")
            return None
        full = os.path.realpath(os.path.join(self.server.root, *parts))
        if not full.startswith(self.server.root + os.sep) or not os.path.isfile(full):
            self._fail(404, "no such file")
            return None
        return full

    def do_HEAD(self):
        full = self._file()
        if full:
            self.send_response(200)
            self.send_header("Content-Length", str(os.path.getsize(full)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

    def do_GET(self):
        full = self._file()
        if not full:
            return
        size = os.path.getsize(full)
        start, end = 0, size - 1
        asked = self.headers.get("Range")
        if asked:
            match = RANGE.match(asked.strip())
            if not match or int(match.group(1)) > size:
                self._fail(416, "unsatisfiable range %s of %d bytes" % (asked, size))
                return
            start = int(match.group(1))
            end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        count = max(0, end - start + 1)
        self.send_response(206 if asked else 200)
        self.send_header("Content-Length", str(count))
        self.send_header("Accept-Ranges", "bytes")
        if asked:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        self.wfile.flush()
        self.server.busy(+1)
        try:
            with open(full, "rb") as stream:
                offset, left = start, count
                while left > 0:
                    sent = os.sendfile(self.connection.fileno(), stream.fileno(), offset, min(left, 1 << 30))
                    if sent == 0:
                        break
                    offset += sent
                    left -= sent
                    self.server.touch()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.server.busy(-1)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, root, token):
        super().__init__(address, Handler)
        self.root = os.path.realpath(root)
        self.token = token
        self.last = time.monotonic()
        self.active = 0
        self.lock = threading.Lock()

    def touch(self):
        self.last = time.monotonic()

    def busy(self, delta):
        with self.lock:
            self.active += delta
            self.last = time.monotonic()

    def idle_for(self):
        with self.lock:
            return 0.0 if self.active else time.monotonic() - self.last


def main(argv=None):
    parser = argparse.ArgumentParser(description="Serve a model folder to the other nodes")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--idle", type=float, default=120.0)
    args = parser.parse_args(argv)
    with open(args.token_file) as stream:
        token = stream.read().strip()
    if not token:
        sys.exit("weights_server: the token file %s is empty" % args.token_file)
    server = Server((args.bind, args.port), args.root, token)
    with open(args.pid_file, "w") as stream:
        stream.write("%d\n" % os.getpid())

    def watch():
        while server.idle_for() < args.idle:
            time.sleep(1.0)
        server.shutdown()

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        try:
            os.unlink(args.pid_file)
        except OSError:
            pass


if __name__ == "__main__":
    main()
