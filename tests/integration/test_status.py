"""playbooks/status.yml on the lab: it tells the truth and exits non-zero unless the cluster serves as deployed.

In order, on one deployment: a healthy cluster (the table, the same as JSON, and metrics.yml's targets scraped);
the server killed (DOWN, and
why: SIGKILL, exit 137), and diagnose.yml on it (the first failing stage, one archive without a secret); the
worker's Ray container killed (that node lost at once, whatever Ray still says); a
Ray-only deployment (no server expected); nothing deployed. Status changes nothing and never prints a secret.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import urllib.request

import pytest
import yaml

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, in_node, lab_hosts, node_docker, playbook_env  # noqa: E402


def playbook(name: str, *extra: str, json_output: bool = False) -> subprocess.CompletedProcess:
    env = playbook_env()
    if json_output:
        env.update(ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1200)


def status(*extra: str) -> tuple[list[str], int, str, int]:
    """The table's lines, the sum of changed over the hosts, the whole output and the exit code."""
    run = playbook("status.yml", *extra, json_output=True)
    output = json.loads(run.stdout)
    task = next(t for t in output["plays"][0]["tasks"] if t["task"]["name"] == "Show the table")
    lines = next(result["msg"] for result in task["hosts"].values() if "msg" in result)
    return lines, sum(stats["changed"] for stats in output["stats"].values()), run.stdout + run.stderr, run.returncode


def line(lines: list[str], start: str) -> str:
    return next(item for item in lines if item.startswith(start))


@pytest.fixture(scope="module")
def secrets():
    run = playbook("deploy_qwen35.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    found = lab_hosts()["all"]["vars"]
    yield found["ray_cluster_auth_token"], found["vllm_server_api_key"]
    playbook("teardown.yml")


def test_status_tells_the_truth_after_each_failure(secrets, tmp_path):
    lines, changed, output, rc = status()
    assert rc == 0 and changed == 0, output[-3000:]
    assert lines[0].split() == ["NODE", "ROLE", "RAY", "RAY", "NODE", "GPUS", "IMAGE", "CONTAINERS"]
    node1, node2 = line(lines, "node1 "), line(lines, "node2 ")
    assert node1.split()[1:5] == ["head", "alive", "10.220.0.11", "1.0"], node1
    assert "gpulab-ray-head:running" in node1 and "gpulab-vllm:running" in node1, node1
    assert node2.split()[1:5] == ["worker", "alive", "10.220.0.12", "1.0"], node2
    assert "gpulab-ray-worker:running" in node2 and "gpulab-vllm" not in node2, node2
    # The image column is the short image ID the node has, the same on both nodes.
    assert node1.split()[5] == node2.split()[5] and re.fullmatch(r"[0-9a-f]{12}", node1.split()[5])
    assert line(lines, "Ray: ").startswith("Ray: 2 alive, 0 dead, 0 pending, 2.0 GPU(s), Ray 2.60.0"), lines
    assert line(lines, "vLLM: ").startswith("vLLM: answers (vLLM 0.32.0, model tiny-llama)"), lines
    assert "Endpoint: http://10.210.0.11:8000/v1" in lines
    assert "Firewall node1: in place" in lines and "Firewall node2: in place" in lines, lines
    assert line(lines, "Verdict: ") == "Verdict: serving: vLLM answers at http://10.210.0.11:8000/v1"

    # The same verdict as one JSON document, for a monitor: printed and written to a file.
    written = tmp_path / "status.json"
    run = playbook("status.yml", "-e", "status_format=json", "-e", f"status_file={written}")
    assert run.returncode == 0, run.stdout[-3000:]
    document = json.loads(written.read_text())
    assert document["verdict"] == "serving" and document["ok"] and document["problems"] == []
    assert [node["ray"]["state"] for node in document["nodes"]] == ["alive", "alive"]
    assert '"verdict": "serving"' in run.stdout and "Verdict: " not in run.stdout

    # metrics.yml: file_sd targets that answer, vLLM's with the key (this scraper is not in vllm_server_metrics_cidrs),
    # Ray's on every node, and closed to the controller until fabric_firewall_allow opens it, as the play says.
    key_file = tmp_path / "scraper.key"
    key_file.write_text(secrets[1])
    run = playbook("metrics.yml", "-e", f"metrics_dir={tmp_path / 'prometheus'}", "-e", f"metrics_key_file={key_file}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Ray's port is reachable only where fabric_firewall_allow opens it (not open yet)" in " ".join(run.stdout.split())
    scrape = yaml.safe_load((tmp_path / "prometheus" / "scrape.yml").read_text())["scrape_configs"]
    assert scrape[0]["authorization"] == {"type": "Bearer", "credentials_file": str(key_file)}
    vllm_targets = json.loads((tmp_path / "prometheus" / "vllm.json").read_text())
    ray_targets = json.loads((tmp_path / "prometheus" / "ray.json").read_text())
    assert [group["targets"] for group in vllm_targets] == [["10.210.0.11:8000"]]
    assert [group["labels"]["node"] for group in ray_targets] == ["node1", "node2"]
    request = urllib.request.Request(f"http://{vllm_targets[0]['targets'][0]}/metrics",
                                     headers={"Authorization": f"Bearer {secrets[1]}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200 and b"\nvllm:" in answer.read()
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    for group in ray_targets:
        node, target = group["labels"]["node"], group["targets"][0]
        assert "\nray_" in in_node(node, sys.executable, "-c", fetch, f"http://{target}/metrics").stdout, target
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{target}/metrics", timeout=3)

    # The server killed: DOWN, with Docker's own reason, and the exit code says so.
    node_docker("node1", "kill", "gpulab-vllm")
    lines, changed, output, rc = status()
    assert rc != 0 and changed == 0
    vllm = line(lines, "vLLM: ")
    assert vllm.startswith("vLLM: DOWN (") and "ended by SIGKILL (exit 137)" in vllm, vllm
    assert any(item.startswith("  node1 gpulab-vllm: ended by SIGKILL (exit 137)") for item in lines), lines
    assert line(lines, "Verdict: ").startswith("Verdict: down: "), lines
    assert "gpulab-vllm:exited" in line(lines, "node1 ")

    # diagnose.yml on the same failure: the first failing stage named, one archive, no secret in it, though a
    # gpulab container printed both secrets into its log and holds them in its environment.
    token, key = secrets
    node_docker("node1", "run", "--name", "gpulab-leak", "--label", "org.gpulab.vllm.role=leak", "-e", f"LEAKED={token}",
                "--entrypoint", "sh", lab_hosts()["all"]["vars"]["lab_ray_image"], "-c", f"echo ray token {token}; echo api key={key}")
    try:
        run = playbook("diagnose.yml", "-e", f"diagnose_dir={tmp_path}")
    finally:
        node_docker("node1", "rm", "-f", "gpulab-leak", check=False)
    assert run.returncode == 0, run.stdout[-3000:]
    said = " ".join(run.stdout.split())
    assert "first failing stage: vllm_server on node1: ended by SIGKILL (exit 137)" in said, run.stdout[-3000:]
    archives = list(tmp_path.glob("gpulab-diagnose-local_lab-*.tar.gz"))
    assert len(archives) == 1 and f"archive {archives[0]} (secrets redacted)" in said
    with tarfile.open(archives[0]) as tar:
        names = sorted(member.name.split("/", 1)[1] for member in tar.getmembers() if member.isfile())
        text = "".join(tar.extractfile(member).read().decode() for member in tar.getmembers() if member.isfile())
    assert {"node1/node.json", "node1/gpulab-ray-head.txt", "node1/gpulab-vllm.txt", "node1/gpulab-leak.txt",
            "node2/node.json", "node2/gpulab-ray-worker.txt", "cluster/ray.json", "cluster/vllm.json",
            "cluster/status.json", "cluster/first_failure.json"} <= set(names), names
    assert token not in text and key not in text
    assert "ray token <redacted ray_cluster_auth_token>" in text and "LEAKED=<redacted ray_cluster_auth_token>" in text
    # What a diagnosis needs is there: the fabric settings the Ray containers run with, the firewall, the log's cause.
    assert "NCCL_SOCKET_IFNAME=enP2p1s0f1np1" in text and "GPULAB-INPUT" in text

    # The worker's Ray container killed: node2 is lost at once, though Ray has not noticed yet.
    node_docker("node2", "kill", "gpulab-ray-worker")
    lines, changed, output, rc = status()
    assert rc != 0
    node2 = line(lines, "node2 ")
    assert node2.split()[1:3] == ["worker", "lost"] and "gpulab-ray-worker:exited" in node2, node2
    assert any(item.startswith("  node2 gpulab-ray-worker: ended by SIGKILL (exit 137)") for item in lines), lines
    assert "node2: lost" in line(lines, "Verdict: ") or "node2: gpulab-ray-worker" in line(lines, "Verdict: "), lines
    for secret in secrets:
        assert secret not in output


def test_status_knows_a_ray_only_deployment_and_nothing_deployed(secrets):
    assert playbook("teardown.yml").returncode == 0
    run = playbook("deploy.yml", "-e", '{"image_ref": "{{ lab_ray_image }}", "image_require_vllm": false, "gpulab_vllm_serve": false}')
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Ray cluster ready, without a vLLM server" in " ".join(run.stdout.split()), run.stdout[-2000:]
    lines, changed, output, rc = status("-e", '{"image_ref": "{{ lab_ray_image }}"}')
    assert rc == 0 and changed == 0, output[-3000:]
    assert line(lines, "vLLM: ") == "vLLM: none (a Ray-only deployment)", lines
    assert not any(item.startswith("Endpoint: ") for item in lines), lines
    assert line(lines, "Verdict: ").startswith("Verdict: ray ready"), lines
    assert "gpulab-vllm" not in line(lines, "node1 ")

    assert playbook("teardown.yml").returncode == 0
    lines, changed, _output, rc = status()
    assert rc != 0 and changed == 0
    for name in ("node1", "node2"):
        row = line(lines, name + " ")
        assert row.split()[2:5] == ["absent", "-", "-"] and row.endswith("absent"), row
    assert line(lines, "Ray: ").startswith("Ray: not readable: ") and "gpulab-ray-head" in line(lines, "Ray: "), lines
    assert line(lines, "vLLM: ") == "vLLM: none (nothing deployed)", lines
    assert "Firewall node1: none" in lines, lines
    assert line(lines, "Verdict: ") == "Verdict: not deployed: no gpulab container on any node", lines
