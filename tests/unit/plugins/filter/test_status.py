"""gpulab.vllm.cluster_status on what status.yml read on the lab (tests/unit/fixtures/status, recorded by
tests/fixtures_record_status.py): the verdict, each node's Ray state cross-checked with its containers, and why a
container stopped."""

from __future__ import annotations

import base64
import json

import jinja2
import pytest
from ansible.plugins.filter import core, mathstuff

from conftest import REPO, load_fixture

from ansible_collections.gpulab.vllm.plugins.filter.status import cluster_status, first_failure, redact, with_supervisors
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


# --- each node's supervisor, with its fabric watch (tests/unit/fixtures/supervisor, recorded by molecule/reboot) -----

def slurped(states: dict) -> dict:
    """Each node's state.json as status.yml's slurp returns it."""
    return {host: {"content": base64.b64encode(json.dumps(state).encode()).decode()} for host, state in states.items()}


@pytest.mark.parametrize("name, change", [
    ("fabric_mtu_changed", "enP2p1s0f1np1 MTU 1400 (deployed with 1500)"),
    ("fabric_link_down", "enP2p1s0f1np1 link down (operstate down, no carrier)"),
])
def test_a_fabric_changed_under_the_deployment_is_named_first(name, change):
    record = load_fixture("supervisor", name)
    since = record["states"]["node2"]["fabric"]["since"]
    named = "node2: its fabric changed under the deployment (since %s): %s" % (since, change)
    # On a cluster that still answered (the moments before the supervisor stopped node2's part): not ok, degraded.
    status = with_supervisors(judge("serving"), slurped(record["states"]))
    assert (status["ok"], status["verdict"]) == (False, "degraded")
    assert status["problems"][0] == named and status["summary"] == "degraded: " + named
    assert status["supervisors"]["node2"]["fabric"]["changes"] == [change]
    assert status["supervisors"]["node1"]["fabric"]["ok"] and status["supervisors"]["node1"]["collective"]["ok"]
    # What the lab's status playbook wrote at that moment, the server down too: the change named first.
    assert record["status"]["summary"].startswith("down: " + named + "; ")
    assert not record["status"]["ok"]


def test_supervisors_with_the_fabric_as_deployed_change_nothing_else():
    record = load_fixture("supervisor", "fabric_mtu_changed")
    states = {host: dict(state, fabric=dict(state["fabric"], ok=True, changes=[])) for host, state in record["states"].items()}
    base = judge("serving")
    status = with_supervisors(base, slurped(states))
    assert {key: value for key, value in status.items() if key != "supervisors"} == base
    assert sorted(status["supervisors"]) == ["node1", "node2"]
    assert with_supervisors(base, {"node1": {"failed": True, "msg": "file not found"}})["supervisors"] == {}


def test_the_table_shows_the_fabric_change_and_the_last_collective():
    record = load_fixture("supervisor", "fabric_mtu_changed")
    template = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / "playbooks")), trim_blocks=True)
    for plugins in (core.FilterModule(), mathstuff.FilterModule()):  # the template's filters, as Ansible gives them
        template.filters.update(plugins.filters())
    lines = template.get_template("status_table.j2").render(gpulab_status=record["status"]).splitlines()
    node2 = next(line for line in lines if line.startswith("Supervisor node2:"))
    node1 = next(line for line in lines if line.startswith("Supervisor node1:"))
    assert node2.endswith("; fabric CHANGED since %s: enP2p1s0f1np1 MTU 1400 (deployed with 1500)"
                          % record["states"]["node2"]["fabric"]["since"])
    assert "; fabric as deployed; last collective at " in node1
    assert node1.endswith(": passed (%s)" % record["states"]["node1"]["collective"]["said"])
