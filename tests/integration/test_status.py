"""playbooks/status.yml on the lab: the table of a healthy cluster, then of a torn-down one; it changes nothing."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, lab_hosts, playbook_env  # noqa: E402


def playbook(name: str, *extra: str, json_output: bool = False) -> subprocess.CompletedProcess:
    env = playbook_env()
    if json_output:
        env.update(ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1200)


def status() -> tuple[list[str], int, str]:
    """The table's lines, the sum of changed over the hosts, and the whole output."""
    run = playbook("status.yml", json_output=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    output = json.loads(run.stdout)
    task = next(t for t in output["plays"][0]["tasks"] if t["task"]["name"] == "Show the table")
    lines = next(result["msg"] for result in task["hosts"].values() if "msg" in result)
    return lines, sum(stats["changed"] for stats in output["stats"].values()), run.stdout + run.stderr


@pytest.fixture(scope="module")
def deployed():
    run = playbook("deploy_qwen35.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    return lab_hosts()["all"]["vars"]


def test_status_of_a_healthy_cluster(deployed):
    lines, changed, output = status()
    assert changed == 0
    assert lines[0].split() == ["NODE", "ROLE", "RAY", "NODE", "GPUS", "IMAGE", "CONTAINERS"]
    node1 = next(line for line in lines if line.startswith("node1 "))
    node2 = next(line for line in lines if line.startswith("node2 "))
    assert node1.split()[1:4] == ["head", "10.220.0.11", "1.0"], node1
    assert "gpulab-ray-head:running" in node1 and "gpulab-vllm:running" in node1, node1
    assert node2.split()[1:4] == ["worker", "10.220.0.12", "1.0"], node2
    assert "gpulab-ray-worker:running" in node2 and "gpulab-vllm" not in node2, node2
    # The image column is the short image ID the node has, the same on both nodes.
    assert node1.split()[4] == node2.split()[4] and re.fullmatch(r"[0-9a-f]{12}", node1.split()[4])
    assert any(line.startswith("Ray: 2 alive, 0 dead, 0 pending, 2.0 GPU(s), Ray 2.60.0") for line in lines), lines
    assert any(line.startswith("vLLM: answers (vLLM 0.32.0, model tiny-llama)") for line in lines), lines
    assert "Endpoint: http://10.210.0.11:8000/v1" in lines
    for secret in (deployed["ray_cluster_auth_token"], deployed["vllm_server_api_key"]):
        assert secret not in output


def test_status_after_teardown_says_what_is_missing(deployed):
    assert playbook("teardown.yml").returncode == 0
    lines, changed, _output = status()
    assert changed == 0
    for name in ("node1", "node2"):
        line = next(line for line in lines if line.startswith(name + " "))
        assert line.split()[2:4] == ["-", "-"] and line.endswith("none"), line
    ray = next(line for line in lines if line.startswith("Ray: "))
    assert ray.startswith("Ray: not readable: ") and "gpulab-ray-head" in ray, ray
    vllm = next(line for line in lines if line.startswith("vLLM: "))
    assert vllm.startswith("vLLM: DOWN (unreachable)"), vllm
