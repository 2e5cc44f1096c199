"""_vllm_probe on HTTP exchanges recorded from the lab's vLLM server (tests/fixtures_record.py vllm ...)."""

from __future__ import annotations

import json

import pytest

from conftest import load_fixture
from vllm_replay import ReplayServer, closed_loopback_port, exchanges_by_route, recorded_send
from ansible_collections.gpulab.vllm.plugins.module_utils import _vllm_probe

BASE = "http://10.210.0.11:8001"


def recorded(name, method, path):
    return exchanges_by_route(load_fixture("vllm", name))[(method, path)]


# The same server recorded on vLLM 0.32 and on 0.17.1 (the seed's version).
HEALTHY = {"0.32.0": "vllm_healthy", "0.17.1": "vllm-0.17.1_healthy"}


@pytest.mark.parametrize("version", sorted(HEALTHY))
def test_healthy_server_passes_every_stage_with_the_recorded_answers(version):
    name = HEALTHY[version]
    send = recorded_send(load_fixture("vllm", name))
    report = _vllm_probe.probe_server(send, BASE, model="tiny", metrics=True)
    assert report["healthy"] and report["failed_stage"] is None and report["error"] is None
    assert report["served_models"] == ["tiny"]
    assert report["vllm_version"] == version
    completion = recorded(name, "POST", "/v1/completions")
    assert report["generated_text"] == json.loads(completion["body"])["choices"][0]["text"]
    assert report["time_to_first_token_s"] == completion["latency_s"]
    assert set(report["probes"]) == {"health", "models", "version", "generation", "metrics"}
    assert all(probe["ok"] and probe["status"] == 200 for probe in report["probes"].values())
    assert [call[:2] for call in send.calls] == [
        ("GET", "/health"), ("GET", "/v1/models"), ("GET", "/version"), ("POST", "/v1/completions"),
        ("GET", "/metrics")]
    assert send.calls[3][2] == {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}


def test_chat_generation_reads_the_message_content():
    send = recorded_send(load_fixture("vllm", "vllm_healthy"))
    report = _vllm_probe.probe_server(send, BASE, model="tiny", generation_api="chat")
    chat = json.loads(recorded("vllm_healthy", "POST", "/v1/chat/completions")["body"])
    assert report["healthy"]
    assert report["generated_text"] == chat["choices"][0]["message"]["content"]
    assert send.calls[-1][1] == "/v1/chat/completions"
    assert send.calls[-1][2]["messages"] == [{"role": "user", "content": "Hello"}]
    assert "metrics" not in report["probes"]


def test_without_a_model_name_the_first_served_model_generates():
    send = recorded_send(load_fixture("vllm", "vllm_healthy"))
    report = _vllm_probe.probe_server(send, BASE)
    assert report["healthy"]
    assert send.calls[3][2]["model"] == "tiny"


def test_expected_model_absent_is_model_missing_and_names_what_is_served():
    send = recorded_send(load_fixture("vllm", "vllm_healthy"))
    report = _vllm_probe.probe_server(send, BASE, model="Qwen/Qwen3.5-27B")
    assert (report["healthy"], report["failed_stage"]) == (False, "model_missing")
    assert report["error"] == (
        "GET http://10.210.0.11:8001/v1/models: expected model 'Qwen/Qwen3.5-27B' is not served; served: tiny")
    assert "generation" not in report["probes"]
    assert report["probes"]["models"]["ok"] is False


def test_dead_engine_names_the_servers_own_reason():
    # vLLM 0.32 in the lab: /health 503 with an empty body, /v1/models 200, generation 500.
    record = load_fixture("vllm", "vllm_dead_engine")
    assert recorded("vllm_dead_engine", "GET", "/health")["status"] == 503
    assert recorded("vllm_dead_engine", "GET", "/v1/models")["status"] == 200
    assert recorded("vllm_dead_engine", "POST", "/v1/completions")["status"] == 500
    report = _vllm_probe.probe_server(recorded_send(record), BASE, model="tiny")
    assert (report["healthy"], report["failed_stage"]) == (False, "unhealthy")
    assert report["probes"]["models"]["ok"] and not report["probes"]["health"]["ok"]
    assert report["probes"]["generation"]["status"] == 500
    assert report["error"] == (
        "GET http://10.210.0.11:8001/health answered HTTP 503; then POST http://10.210.0.11:8001/v1/completions "
        "answered HTTP 500: EngineCore encountered an issue. See stack trace (above) for the root cause.")
    message = _vllm_probe.failure_message(report, BASE)
    assert message.startswith("vLLM at http://10.210.0.11:8001: stage unhealthy: GET ")
    assert "\n" not in message


def test_generation_catches_a_dead_engine_that_health_misses():
    # vLLM 0.17.1 in the lab, its engine core killed (at TP 1 it runs the model itself): /health still
    # answers 200 and /v1/models lists the model; only a generation shows that the engine is gone.
    record = load_fixture("vllm", "vllm-0.17.1_engine_killed")
    assert recorded("vllm-0.17.1_engine_killed", "GET", "/health")["status"] == 200
    assert recorded("vllm-0.17.1_engine_killed", "POST", "/v1/completions")["status"] == 500
    report = _vllm_probe.probe_server(recorded_send(record), BASE, model="tiny")
    assert (report["healthy"], report["failed_stage"]) == (False, "generation_failed")
    assert report["probes"]["health"]["ok"] and report["probes"]["models"]["ok"]
    assert report["error"] == ("POST http://10.210.0.11:8001/v1/completions answered HTTP 500: EngineCore encountered "
                               "an issue. See stack trace (above) for the root cause.")
    # Without the generation it looks healthy; that is why the generation is on by default.
    assert _vllm_probe.probe_server(recorded_send(record), BASE, model="tiny", generation=False)["healthy"]


def test_dead_engine_chat_fails_the_same_way():
    report = _vllm_probe.probe_server(recorded_send(load_fixture("vllm", "vllm_dead_engine")), BASE,
                                      model="tiny", generation_api="chat")
    assert report["probes"]["generation"]["status"] == 500
    assert report["error"].endswith("/v1/chat/completions answered HTTP 500: EngineCore encountered an issue. "
                                    "See stack trace (above) for the root cause.")


def test_chat_without_a_chat_template_is_a_generation_failure_with_the_servers_text():
    report = _vllm_probe.probe_server(recorded_send(load_fixture("vllm", "vllm_no_chat_template")), BASE,
                                      model="tiny", generation_api="chat")
    assert (report["healthy"], report["failed_stage"]) == (False, "generation_failed")
    assert report["error"].startswith("POST http://10.210.0.11:8001/v1/chat/completions answered HTTP 400: ")
    assert "chat template" in report["error"]
    completions = _vllm_probe.probe_server(recorded_send(load_fixture("vllm", "vllm_no_chat_template")), BASE)
    assert completions["healthy"]


def test_killed_engine_core_takes_the_server_down():
    report = _vllm_probe.probe_server(recorded_send(load_fixture("vllm", "vllm_engine_killed_server_exited")), BASE)
    assert report["failed_stage"] == "unreachable"


def test_first_answer_after_start_is_already_healthy():
    # The API server starts listening only once the engine is up.
    report = _vllm_probe.probe_server(recorded_send(load_fixture("vllm", "vllm_first_answer")), BASE, model="tiny")
    assert report["healthy"]


def test_server_still_starting_is_unreachable():
    report = _vllm_probe.probe_server(recorded_send(load_fixture("vllm", "vllm_starting_unreachable")), BASE)
    assert (report["healthy"], report["failed_stage"]) == (False, "unreachable")
    assert report["error"] == (
        "GET http://10.210.0.11:8001/health got no answer: ConnectionRefusedError: [Errno 111] Connection refused")
    assert list(report["probes"]) == ["health"]
    assert report["probes"]["health"] == {
        "status": None, "latency_s": recorded("vllm_starting_unreachable", "GET", "/health")["latency_s"],
        "ok": False, "error": report["error"]}
    wait = {"waited": True, "elapsed": 900.02, "polls": 301}
    assert _vllm_probe.failure_message(report, BASE, wait).startswith(
        "vLLM at http://10.210.0.11:8001 not healthy after 900.0s (301 polls): stage unreachable: GET ")


def test_server_error_text_prefers_the_servers_message():
    body = recorded("vllm_dead_engine", "POST", "/v1/completions")["body"]
    assert _vllm_probe.server_error_text(body) == " ".join(
        _message_of(json.loads(body)).split())
    assert _vllm_probe.server_error_text("plain text\nerror") == "plain text error"
    assert _vllm_probe.server_error_text("x" * 1000).endswith("...")


def _message_of(document):
    error = document.get("error")
    return error["message"] if isinstance(error, dict) else document["message"]


# The real transport, on loopback, replaying the recorded answers.

def test_http_exchange_over_loopback_returns_the_recorded_answer_and_sends_the_key():
    with ReplayServer(load_fixture("vllm", "vllm_dead_engine")) as server:
        answer = _vllm_probe.http_exchange("POST", server.base_url + "/v1/completions", {"model": "tiny"},
                                           api_key="s3cret", timeout=5)
        health = _vllm_probe.http_exchange("GET", server.base_url + "/health", timeout=5)
    assert answer["status"] == 500 and answer["error"] is None
    assert answer["body"] == recorded("vllm_dead_engine", "POST", "/v1/completions")["body"]
    assert health["status"] == 503
    assert server.requests[0]["headers"]["authorization"] == "Bearer s3cret"
    assert server.requests[0]["body"] == {"model": "tiny"}
    assert "authorization" not in server.requests[1]["headers"]


def test_http_exchange_connection_refused_is_an_error_not_an_exception():
    url = "http://127.0.0.1:%d/health" % closed_loopback_port()
    answer = _vllm_probe.http_exchange("GET", url, timeout=2)
    assert answer["status"] is None and answer["body"] is None
    assert "Connection refused" in answer["error"]
    assert answer["latency_s"] >= 0


def test_full_probe_over_loopback_matches_the_replayed_probe():
    record = load_fixture("vllm", "vllm_healthy")
    with ReplayServer(record) as server:
        def send(method, url, body):
            return _vllm_probe.http_exchange(method, url, body, timeout=5)
        report = _vllm_probe.probe_server(send, server.base_url, model="tiny", metrics=True)
    replayed = _vllm_probe.probe_server(recorded_send(record), server.base_url, model="tiny", metrics=True)
    assert report["healthy"]
    for key in ("served_models", "vllm_version", "generated_text"):
        assert report[key] == replayed[key]


def test_exited_report_ends_with_the_crash_cause():
    from ansible_collections.gpulab.vllm.plugins.module_utils._vllm_probe import exited_report, last_error_line

    log = "\n".join([
        "(APIServer pid=1) INFO 12-02 13:07:49 [api_utils.py:286] non-default args: {'host': '0.0.0.0'}",
        "(EngineCore pid=23) ERROR 12-02 13:09:08 [core.py:1510]   File \"/opt/venv/lib/python3.11/site-packages/ray/_private/worker.py\"",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
        "",
    ])
    assert last_error_line(log).startswith("RuntimeError: Engine core initialization failed")
    assert last_error_line("INFO all good\n") is None
    report = exited_report("container gpulab-vllm exited with code 1; RuntimeError: boom")
    assert report["failed_stage"] == "server_exited" and not report["healthy"]
    assert "exited with code 1" in report["error"]


def test_the_key_goes_only_to_the_v1_routes():
    with ReplayServer(load_fixture("vllm", "vllm_healthy")) as server:
        for path in ("/health", "/version", "/metrics", "/v1/models"):
            _vllm_probe.http_exchange("GET", server.base_url + path, api_key="s3cret", timeout=5)
    sent = {request["path"]: request["headers"].get("authorization") for request in server.requests}
    assert sent == {"/health": None, "/version": None, "/metrics": None, "/v1/models": "Bearer s3cret"}
    assert _vllm_probe.key_belongs("http://h:8000/v1/chat/completions")
    assert not _vllm_probe.key_belongs("http://h:8000/v1")
    assert not _vllm_probe.key_belongs("http://h:8000/health?next=/v1/models")


def test_the_key_never_follows_a_redirect():
    """A server that answers the API route with a redirect elsewhere: the keyed request stops at the 3xx."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/v1/"):
                self.send_response(307)
                self.send_header("Location", "/elsewhere/v1/models")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        answer = _vllm_probe.http_exchange("GET", "http://127.0.0.1:%d/v1/models" % server.server_port,
                                           api_key="s3cret", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    assert answer["status"] == 307
    assert seen == [("/v1/models", "Bearer s3cret")]


def test_the_load_stages_of_a_recorded_start_come_in_order():
    """The whole log of a lab server's start (vLLM 0.32, TP 2 over Ray), read as it grows, line by line."""
    from ansible_collections.gpulab.vllm.plugins.module_utils._vllm_probe import load_progress

    log = load_fixture("vllm", "vllm_start_log")["log"]
    lines = log.splitlines()
    seen = []
    for count in range(len(lines) + 1):
        stage = load_progress("\n".join(lines[:count]))["stage"]
        if not seen or seen[-1] != stage:
            seen.append(stage)
    # torch.compile is off in the lab (eager mode), and a CPU has no CUDA graphs: those stages never show.
    assert seen == ["starting", "engine start", "weights", "weights loaded", "memory profiling", "warmup done",
                    "API server starting", "ready"]
    whole = load_progress(log)
    assert (whole["shards_done"], whole["shards_total"]) == (1, 1) and whole["lines"] >= len(lines)
    # While weights load, the detail is the shard count the loader's progress bar printed last.
    upto = next(i for i, line in enumerate(lines) if "Loading safetensors checkpoint shards:   0%" in line)
    during = load_progress("\n".join(lines[:upto + 1]))
    assert during["stage"] in ("weights", "weights loaded") and during["shards_total"] == 1
