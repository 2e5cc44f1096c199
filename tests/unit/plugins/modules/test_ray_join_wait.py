"""gpulab.vllm.ray_join_wait on what a lab node's Docker Engine answered while a Ray worker joined, or failed to
(tests/unit/fixtures/join, recorded by tests/fixtures_record_join.py): the recorded bytes are served again on a
loopback port, read by read at their recorded pace, and the module follows them as it follows a node's daemon."""

from __future__ import annotations

import base64
import json
import socketserver
import threading
import time

import pytest

from conftest import load_fixture
from test_modules import run_main
from vllm_replay import closed_loopback_port

from ansible_collections.gpulab.vllm.plugins.module_utils import _node, _ray_join
from ansible_collections.gpulab.vllm.plugins.modules import ray_join_wait


class EngineReplay(socketserver.ThreadingTCPServer):
    """A recorded join served again: `docker inspect` as before the wait, then as after; the followed log read by
    read. `hold` keeps the log's connection open after the recorded reads (a worker that says nothing more)."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, record, reads=None, hold=False):
        self.record = record
        self.reads = record["reads"] if reads is None else reads
        self.hold = hold
        self.inspected = 0
        self.requests = []
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def docker_host(self):
        return "tcp://127.0.0.1:%d" % self.server_address[1]


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        request = b""
        while b"\r\n\r\n" not in request:
            data = self.request.recv(4096)
            if not data:
                return
            request += data
        line = request.split(b"\r\n", 1)[0].decode()
        server = self.server
        server.requests.append(line)
        path = line.split(" ")[1]
        if path.endswith("/json"):
            document = server.record["inspect_before"] if server.inspected == 0 else server.record["inspect_after"]
            server.inspected += 1
            body = json.dumps(document).encode()
            self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))
            return
        started = time.monotonic()
        for read in server.reads:
            # In the recorded order, a moment apart (the recorded pace, at most 0.05 s: the tests stay quick).
            time.sleep(max(0.0, min(read["at_s"] - (time.monotonic() - started), 0.05)))
            self.request.sendall(base64.b64decode(read["bytes"]))
        if server.hold:
            self.request.settimeout(10)
            try:
                self.request.recv(1)  # until the module closes its end
            except OSError:
                pass


def arguments(docker_host, timeout=30):
    return {"container": "gpulab-ray-worker", "node": "node2", "head": "10.220.0.11:6379", "timeout": timeout,
            "node_manager_port": 6381, "object_manager_port": 6382, "docker_host": docker_host}


def run_module(capsys, server, timeout=30):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return run_main(ray_join_wait, arguments(server.docker_host, timeout), capsys)
    finally:
        server.shutdown()
        server.server_close()


def body(record) -> bytes:
    raw = b"".join(base64.b64decode(read["bytes"]) for read in record["reads"])
    return raw.split(b"\r\n\r\n", 1)[1]


def test_a_worker_that_joins_is_seen_at_ray_s_own_line(capsys, monkeypatch):
    record = load_fixture("join", "worker_joined")
    server = EngineReplay(record)
    result = run_module(capsys, server)
    assert result["joined"] and not result.get("failed")
    assert result["state"] == "running" and result["cause"] is None
    # Asked from the container's last start on, as HTTP/1.0 (the stream unchunked, closed at the stop): the request
    # the recording made, the same the module makes.
    follow = [line for line in server.requests if "/logs?" in line]
    assert follow == ["GET %s HTTP/1.0" % record["request"]]
    assert record["request"] == "/containers/gpulab-ray-worker/logs?follow=1&stdout=1&stderr=1&since=" + _ray_join.since_of(
        record["inspect_before"]["State"]["StartedAt"])


def test_a_worker_the_head_refuses_is_named_with_the_token_at_its_stop(capsys, monkeypatch):
    record = load_fixture("join", "worker_wrong_token")
    assert record["stream_ended"] and record["inspect_after"]["State"]["Status"] == "exited"
    result = run_module(capsys, EngineReplay(record), timeout=600)
    assert result["failed"] and not result["joined"] and result["state"] == "exited"
    assert result["msg"].startswith("gpulab-ray-worker on node2 stopped before it joined the Ray head at 10.220.0.11:6379 "
                                    "(state=exited): ")
    assert result["msg"].endswith("; read `docker logs gpulab-ray-worker` on node2; a token the head refuses means "
                                  "ray_cluster_auth_token differs on this node")
    assert result["cause"] == _node.cause_line(_node.split_log_stream(body(record)))
    assert result["cause"].startswith("ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: ")
    # Named when the stream ended (the container's stop), not at the timeout.
    assert result["seconds"] < 300


def test_a_worker_that_says_nothing_more_is_named_with_its_ray_ports_at_the_timeout(capsys, monkeypatch):
    # The recorded join's reads before Ray's own line, the connection then held open: a worker whose Ray never says
    # it started.
    record = load_fixture("join", "worker_joined")
    kept, text = [], b""
    for read in record["reads"]:
        text += base64.b64decode(read["bytes"])
        if _ray_join.STARTED.encode() in text:
            break
        kept.append(read)
    result = run_module(capsys, EngineReplay(record, reads=kept, hold=True), timeout=2)
    assert result["failed"] and not result["joined"] and result["state"] == "running"
    assert "gpulab-ray-worker on node2 did not say that its Ray started within 2 s of joining the Ray head at " \
           "10.220.0.11:6379 (state=running): " in result["msg"]
    assert result["msg"].endswith("check that the head reaches this node's Ray ports on the fabric "
                                  "(ray_cluster_node_manager_port 6381, ray_cluster_object_manager_port 6382): another "
                                  "firewall or a raw-table rule may drop them")


@pytest.mark.parametrize("name", ["worker_joined", "worker_wrong_token"])
@pytest.mark.parametrize("size", [1, 7, 8, 9, 4096])
def test_the_framed_log_is_the_same_text_however_it_is_split(name, size):
    raw = body(load_fixture("join", name))
    frames = _node.LogFrames()
    for offset in range(0, len(raw), size):
        frames.feed(raw[offset:offset + size])
    assert frames.text == _node.split_log_stream(raw)
    assert frames.pending == b""


@pytest.mark.parametrize("started_at, since", [
    ("2026-12-07T13:59:42.123456789Z", "1796651982.123456789"),
    ("2026-12-07T13:59:42Z", "1796651982.000000000"),
    ("2026-12-07T14:59:42.5+01:00", "1796651982.500000000"),
    ("0001-01-01T00:00:00Z", None),
    ("", None),
])
def test_since_is_the_containers_last_start(started_at, since):
    assert _ray_join.since_of(started_at) == since


def test_since_of_each_recorded_start():
    for name in ("worker_joined", "worker_wrong_token"):
        started_at = load_fixture("join", name)["inspect_before"]["State"]["StartedAt"]
        seconds = float(_ray_join.since_of(started_at))
        assert abs(seconds - time.mktime(time.strptime(started_at[:19], "%Y-%m-%dT%H:%M:%S")) + time.timezone) < 1


def test_a_bad_timeout_is_refused_before_anything(capsys):
    result = run_main(ray_join_wait, arguments("tcp://127.0.0.1:9", timeout=0), capsys)
    assert result["msg"] == "timeout must be at least 1 second, got 0"


def test_a_node_whose_daemon_does_not_answer_is_named(capsys):
    result = run_main(ray_join_wait, arguments("tcp://127.0.0.1:%d" % closed_loopback_port(), timeout=5), capsys)
    assert result["msg"].startswith("gpulab-ray-worker on node2: the node's Docker daemon did not answer the join wait: ")
