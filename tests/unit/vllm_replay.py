"""Replay HTTP exchanges recorded from the lab's vLLM server on a loopback port."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


def exchanges_by_route(record):
    """{(method, path): exchange} of a vllm fixture."""
    return dict(((e["method"], urlsplit(e["url"]).path), e) for e in record["exchanges"])


def recorded_send(record, base_url=None):
    """A `send` for probe_server that answers with the recorded exchanges (no network)."""
    routes = exchanges_by_route(record)
    calls = []

    def send(method, url, body):
        calls.append((method, urlsplit(url).path, body))
        exchange = routes[(method, urlsplit(url).path)]
        return {k: exchange[k] for k in ("status", "body", "latency_s", "error")}

    send.calls = calls
    return send


class ReplayServer(object):
    """Serves a fixture's recorded answers; remembers each request it got."""

    def __init__(self, record):
        self.routes = exchanges_by_route(record)
        self.requests = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                replay.requests.append({
                    "method": self.command,
                    "path": self.path,
                    "headers": dict((k.lower(), v) for k, v in self.headers.items()),
                    "body": json.loads(body) if body else None,
                })
                exchange = replay.routes.get((self.command, urlsplit(self.path).path))
                if exchange is None or exchange["status"] is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                payload = (exchange["body"] or "").encode("utf-8")
                self.send_response(exchange["status"])
                self.send_header("Content-Type", exchange.get("content_type") or "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _answer
            do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def closed_loopback_port():
    """A loopback port nothing listens on (connection refused, like a server still loading)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
