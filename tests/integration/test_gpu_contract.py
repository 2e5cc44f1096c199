"""The lab keeps the GPU contract of a real NVIDIA host, shown on the lab's own Docker daemons.

A container has a (lab) GPU only when it was started with a GPU request, because each node's
dockerd runs the lab's stand-in for the NVIDIA container hook (lab/gpu/), exactly where the
real toolkit's hook runs. vLLM in a container without one finds no device, as on a real host,
and the deploy's server would stop with it: the last test runs the deploy with the server's
GPU request taken away and sees it fail for that reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, lab_hosts, node_docker, playbook_env

sys.path.insert(0, str(ROOT / "plugins" / "filter"))
from gpu import gpu_problem  # noqa: E402  (the filter the image role applies to the probe's answer)

PROBE = (ROOT / "roles" / "image" / "files" / "probe_image.py").read_text()
DEVICE = ("from vllm.config import DeviceConfig\n"
          "from vllm.platforms import current_platform\n"
          "print('device', DeviceConfig().device_type, 'ray key', repr(current_platform.ray_device_key))\n")


def _vllm_image() -> str:
    return lab_hosts()["all"]["vars"]["lab_vllm_image"]


def _run(node: str, *args: str) -> subprocess.CompletedProcess:
    return node_docker(node, "run", "--rm", "--network", "none", *args, check=False)


def _probe(node: str, *gpus: str) -> dict:
    done = _run(node, *gpus, "--entrypoint", "python3", _vllm_image(), "-c", PROBE, "--gpu")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["gpu"]


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_a_container_sees_the_lab_gpu_only_with_a_gpu_request(node):
    hosts = lab_hosts()["all"]
    host = {**hosts["children"]["ray_head"]["hosts"], **hosts["children"]["ray_workers"]["hosts"]}[node]
    with_gpu = _probe(node, "--gpus", "all")
    assert with_gpu["source"] == "lab" and with_gpu["count"] == hosts["vars"]["lab_gpus_per_node"], with_gpu
    assert with_gpu["unified_memory"] is host["lab_unified_memory"], with_gpu
    assert [gpu["uuid"] for gpu in with_gpu["devices"]] == [f"GPU-gpulab-lab-{node}-0"]
    assert gpu_problem(with_gpu, node, "the lab image") == ""

    without = _probe(node)
    assert without["count"] == 0 and without["source"] != "lab", without
    assert gpu_problem(without, node, "the lab image").startswith(
        f"{node}: a container of the lab image started with a GPU request sees no GPU")


def test_vllm_infers_no_device_without_a_gpu_request():
    with_gpu = _run("node1", "--gpus", "all", "--entrypoint", "python3", _vllm_image(), "-c", DEVICE)
    assert with_gpu.returncode == 0, with_gpu.stderr[-2000:]
    assert "device cpu ray key 'GPU'" in with_gpu.stdout

    without = _run("node1", "--entrypoint", "python3", _vllm_image(), "-c", DEVICE)
    assert without.returncode != 0
    assert "Failed to infer device type" in without.stderr, without.stderr[-2000:]


def test_a_gpu_the_node_lacks_is_refused_by_the_hook():
    done = _run("node1", "--gpus", "device=3", "--entrypoint", "true", _vllm_image())
    assert done.returncode != 0
    assert "unknown device 3: this lab node has 1 GPU(s)" in done.stderr, done.stderr


def _playbook(name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=playbook_env(), capture_output=True, text=True, check=False, timeout=1200)


def test_a_server_without_the_gpu_request_fails_as_on_a_real_host():
    """The first wave's server role gave the server container no GPU request: in the lab it now fails,
    naming vLLM's own reason, as it would on a GPU host whose default runtime is not nvidia."""
    _playbook("teardown.yml")
    try:
        run = _playbook("deploy_qwen35.yml", "-e", json.dumps({"vllm_server_device_requests": []}))
        assert run.returncode != 0, run.stdout[-3000:]
        assert "exited with code" in run.stdout and "Failed to infer device type" in run.stdout, run.stdout[-3000:]
    finally:
        _playbook("teardown.yml")
