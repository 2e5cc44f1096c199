"""The key check in front of every vLLM route (roles/vllm_server/files/gpulab_vllm_auth.py), as Starlette calls an
ASGI middleware: scopes in, messages out."""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest

from conftest import REPO

SPEC = importlib.util.spec_from_file_location("gpulab_vllm_auth", REPO / "roles/vllm_server/files/gpulab_vllm_auth.py")
auth = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(auth)

KEY = "k" * 64


@pytest.fixture()
def guarded(tmp_path, monkeypatch):
    key_file = tmp_path / "vllm_api_key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("GPULAB_API_KEY_FILE", str(key_file))
    monkeypatch.setenv("GPULAB_METRICS_CIDRS", "10.210.0.0/24, fd00::/64")
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return auth.RequireKey(app), reached


def call(middleware, path, method="POST", key=None, client=("10.99.0.5", 40000), kind="http"):
    headers = [(b"host", b"node1:8000")]
    if key is not None:
        headers.append((b"authorization", ("Bearer " + key).encode()))
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    asyncio.run(middleware({"type": kind, "path": path, "method": method, "headers": headers, "client": client},
                           receive, send))
    return sent


ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/invocations", "/tokenize", "/detokenize",
          "/pooling", "/score", "/rerank", "/scale_elastic_ep", "/metrics", "/reset_prefix_cache", "/sleep",
          "/collective_rpc", "/health/", "//health", "/HEALTH"]


@pytest.mark.parametrize("path", ROUTES)
def test_every_route_but_liveness_needs_the_key(guarded, path):
    middleware, reached = guarded
    refused = call(middleware, path)
    assert refused[0]["status"] == 401 and not reached
    assert json.loads(refused[1]["body"])["error"]["code"] == 401
    assert call(middleware, path, key="wrong")[0]["status"] == 401 and not reached
    assert call(middleware, path, key=KEY)[0]["status"] == 200 and reached == [path]


@pytest.mark.parametrize("path", ["/health", "/ping", "/version"])
def test_liveness_and_version_answer_anyone(guarded, path):
    middleware, reached = guarded
    assert call(middleware, path, method="GET")[0]["status"] == 200 and reached == [path]


def test_metrics_for_the_scrapers_networks_only(guarded):
    middleware, reached = guarded
    assert call(middleware, "/metrics", "GET", client=("10.210.0.7", 5000))[0]["status"] == 200
    assert call(middleware, "/metrics", "GET", client=("fd00::7", 5000))[0]["status"] == 200
    assert call(middleware, "/metrics", "GET", client=("10.211.0.7", 5000))[0]["status"] == 401
    # A scraper's network opens /metrics, nothing else.
    assert call(middleware, "/v1/models", "GET", client=("10.210.0.7", 5000))[0]["status"] == 401
    assert reached == ["/metrics", "/metrics"]


def test_a_websocket_without_the_key_is_closed(guarded):
    middleware, reached = guarded
    assert call(middleware, "/v1/realtime", kind="websocket") == [{"type": "websocket.close", "code": 1008}]
    assert not reached


def test_an_empty_key_file_stops_the_server(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    monkeypatch.setenv("GPULAB_API_KEY_FILE", str(empty))
    with pytest.raises(RuntimeError, match="is empty"):
        auth.RequireKey(None)
