"""ASGI middleware for vLLM's API server: every route asks for the API key, not only the /v1 ones.

vLLM's own --api-key guards the routes under /v1 only; /invocations, /tokenize, /detokenize, /pooling, /score,
/rerank, /metrics and the control routes answer anyone. Loaded with --middleware gpulab_vllm_auth.RequireKey, this
lets through, without a key, only /health, /ping and /version (liveness and version, no model access) and
/metrics from the scrapers' networks; everything else needs `Authorization: Bearer KEY`. The key is read once
from a root-only file (GPULAB_API_KEY_FILE), so it is in no environment and no `docker inspect`.
"""

import hmac
import ipaddress
import json
import os

OPEN_PATHS = frozenset(("/health", "/ping", "/version"))


def _networks(text):
    return [ipaddress.ip_network(item.strip(), strict=False) for item in (text or "").split(",") if item.strip()]


class RequireKey:
    def __init__(self, app):
        self.app = app
        path = os.environ.get("GPULAB_API_KEY_FILE", "/run/gpulab/vllm_api_key")
        with open(path, "rb") as handle:
            self.key = handle.read().strip()
        if not self.key:
            raise RuntimeError("the API key file %s is empty" % path)
        self.scrapers = _networks(os.environ.get("GPULAB_METRICS_CIDRS"))

    def _keyed(self, scope):
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                scheme, unused_sep, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        return False

    def _scraper(self, scope):
        client = scope.get("client")
        if not client or not self.scrapers:
            return False
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        return any(address in network for network in self.scrapers if network.version == address.version)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path") or ""
        if (scope["type"] == "http" and scope.get("method") == "OPTIONS") or path in OPEN_PATHS \
                or (path == "/metrics" and self._scraper(scope)) or self._keyed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": {"message": "Unauthorized: this route needs the API key "
                                                "(Authorization: Bearer KEY)", "type": "Unauthorized", "code": 401}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
