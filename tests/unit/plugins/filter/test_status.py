"""gpulab.vllm.cluster_status on what status.yml read on the lab (tests/unit/fixtures/status, recorded by
tests/fixtures_record_status.py): the verdict, each node's Ray state cross-checked with its containers, and why a
container stopped."""

from __future__ import annotations

import pytest

from conftest import load_fixture

from ansible_collections.gpulab.vllm.plugins.filter.status import cluster_status, first_failure, redact
from ansible_collections.gpulab.vllm.plugins.module_utils._node import stop_reason

EXPECT = {"ray_head_container": "gpulab-ray-head", "ray_worker_container": "gpulab-ray-worker",
          "vllm_container": "gpulab-vllm", "firewall": True, "serve": None}


def judge(name: str, **expect) -> dict:
    """The filter on a recording, with its inputs built as status.yml builds them."""
    record = load_fixture("status", name)
    reads = {}
    for host in record["hosts"]:
        node = record["reads"][host].get("node")
        reads[host] = None if node is None else (
            {"node": node["ansible_facts"]["gpulab_node"]} if "ansible_facts" in node else {"error": node.get("msg")})
    head = record["reads"][record["head"]]
    return cluster_status(reads, record["head"], head.get("ray"), head.get("vllm"),
                          {**EXPECT, "endpoint": record["endpoint"], **expect})


def by_host(status: dict) -> dict:
    return {row["host"]: row for row in status["nodes"]}


def test_a_serving_cluster_is_ok_and_agrees_with_the_playbook():
    status = judge("serving")
    assert status["verdict"] == "serving" and status["ok"] and status["problems"] == []
    rows = by_host(status)
    assert [rows[h]["ray"]["state"] for h in ("node1", "node2")] == ["alive", "alive"]
    assert rows["node1"]["ray"]["node_ip"] == "10.220.0.11" and rows["node1"]["ray"]["gpus"] == 1.0
    assert [c["name"] for c in rows["node1"]["containers"]] == ["gpulab-ray-head", "gpulab-vllm"]
    assert [c["name"] for c in rows["node2"]["containers"]] == ["gpulab-ray-worker"]
    assert status["vllm"]["state"] == "answers" and status["vllm"]["models"] == ["tiny-llama"]
    assert rows["node1"]["firewall"]["state"] == "in place"
    assert load_fixture("status", "serving")["playbook_rc"] == 0


def test_a_killed_server_is_down_with_its_signal():
    status = judge("server_killed")
    assert status["verdict"] == "down" and not status["ok"]
    assert status["vllm"]["state"] == "down"
    assert status["vllm"]["reason"].startswith("ended by SIGKILL (exit 137)"), status["vllm"]
    server = by_host(status)["node1"]["containers"][1]
    assert server["state"] == "exited" and server["exit_code"] == 137
    assert any(problem.startswith("node1: gpulab-vllm ended by SIGKILL") for problem in status["problems"])
    assert load_fixture("status", "server_killed")["playbook_rc"] != 0


def test_a_node_without_its_ray_container_is_lost_though_ray_counts_it_alive():
    record = load_fixture("status", "server_and_worker_killed")
    # The recording caught Ray before its heartbeat timeout: the GCS still said both nodes were alive.
    assert record["reads"]["node1"]["ray"]["ansible_facts"]["ray_cluster"]["alive_nodes"] == 2
    status = judge("server_and_worker_killed")
    node2 = by_host(status)["node2"]
    assert node2["ray"]["state"] == "lost" and node2["ray"]["ray_says"] == "alive"
    assert node2["ray"]["gpus"] is None
    assert "node2: lost (Ray still counts it alive until its heartbeat times out)" in status["problems"]
    assert status["verdict"] == "down"


def test_a_ray_only_deployment_expects_no_server():
    status = judge("ray_only")
    assert status["deployment"] == "ray_only" and status["verdict"] == "ray ready" and status["ok"], status["problems"]
    assert status["vllm"] == {"state": "none", "reason": "a Ray-only deployment"}
    assert [c["name"] for c in by_host(status)["node1"]["containers"]] == ["gpulab-ray-head"]
    # Told that a server was deployed, the same read is a server missing.
    told = judge("ray_only", serve=True)
    assert told["verdict"] == "down"
    assert told["vllm"]["reason"] == "its container gpulab-vllm is not there"


def test_nothing_deployed_is_not_ok():
    status = judge("nothing_deployed")
    assert status["verdict"] == "not deployed" and not status["ok"] and status["deployment"] == "none"
    assert [row["ray"]["state"] for row in status["nodes"]] == ["absent", "absent"]
    # Nothing to judge beyond that: no problem is invented for containers that were never meant to exist.
    assert status["problems"] == []
    assert status["summary"] == "not deployed: no gpulab container on any node"


def test_a_node_not_reached_is_named():
    record = load_fixture("status", "serving")
    reads = {"node1": {"node": record["reads"]["node1"]["node"]["ansible_facts"]["gpulab_node"]}, "node2": None}
    status = cluster_status(reads, "node1", record["reads"]["node1"]["ray"], record["reads"]["node1"]["vllm"],
                            {**EXPECT, "endpoint": record["endpoint"]})
    assert status["verdict"] == "degraded" and "node2: not read (not reached)" in status["problems"]


@pytest.mark.parametrize("name", ["server_killed", "server_and_worker_killed"])
def test_stop_reason_of_recorded_containers(name):
    record = load_fixture("status", name)
    server = record["reads"]["node1"]["node"]["ansible_facts"]["gpulab_node"]["containers"]["gpulab-vllm"]
    said = stop_reason(server)
    assert said.startswith("ended by SIGKILL (exit 137): killed") and server["finished_at"][:4] in said


@pytest.mark.parametrize("name, stage, where, why", [
    ("serving", "none", None, "serving: vLLM answers"),
    ("server_killed", "vllm_server", "node1", "ended by SIGKILL (exit 137)"),
    # Both killed: the deploy's order puts the worker's Ray container before the server.
    ("server_and_worker_killed", "ray_cluster", "node2", "gpulab-ray-worker ended by SIGKILL (exit 137)"),
    ("ray_only", "none", None, "ray ready"),
    ("nothing_deployed", "nothing deployed", None, "not deployed"),
])
def test_the_first_failing_stage(name, stage, where, why):
    found = first_failure(judge(name), 2)
    assert (found["stage"], found["where"]) == (stage, where) and found["why"].startswith(why), found


def test_redact_hides_the_secrets_and_secret_settings_but_not_where_they_live():
    secrets = {"ray_cluster_auth_token": "0123456789abcdef", "vllm_server_api_key": "fedcba9876543210", "hf_token": ""}
    text = ('"Env": ["RAY_AUTH_TOKEN_PATH=/run/gpulab/ray_token", "HF_TOKEN=hf_not_listed", "LEAKED=0123456789abcdef"]\n'
            "api key=fedcba9876543210\n")
    out = redact(text, secrets)
    assert "0123456789abcdef" not in out and "fedcba9876543210" not in out and "hf_not_listed" not in out
    assert "RAY_AUTH_TOKEN_PATH=/run/gpulab/ray_token" in out
    assert "LEAKED=<redacted ray_cluster_auth_token>" in out and "HF_TOKEN=<redacted>" in out
    # An empty secret (no hf_token) redacts nothing.
    assert redact("plain text", secrets) == "plain text"
