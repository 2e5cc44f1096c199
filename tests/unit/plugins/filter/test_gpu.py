"""The GPU contract's pure logic, on what a real NVIDIA H200 and the lab answered.

tests/unit/fixtures/gpu/ holds the image probe's own output (roles/image/files/probe_image.py
--gpu) and `nvidia-smi -q -x`, recorded on a host with one H200 (driver 580.159.04, PyTorch
2.11.0+cu130): as it is, with CUDA_VISIBLE_DEVICES empty (CUDA sees no device, the driver
does), and with CUDA_VISIBLE_DEVICES empty and no nvidia-smi on the PATH (a container that got
no GPU). See the README there.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpulab.vllm.plugins.filter.gpu import NGC_ENTRYPOINT, entrypoint_prefix, gpu_problem
from ansible_collections.gpulab.vllm.plugins.filter.gpu import gpu_requests, kernels_for

REPO = Path(__file__).resolve().parents[4]
FIXTURES = REPO / "tests" / "unit" / "fixtures"
PROBE_FILE = REPO / "roles" / "image" / "files" / "probe_image.py"
HOOK = REPO / "lab" / "gpu" / "nvidia_hook.py"
IMAGE = "nvcr.io/nvidia/vllm:26.02-py3"


def _probe_module():
    spec = importlib.util.spec_from_file_location("probe_image", PROBE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / "gpu" / (name + ".json")).read_text())


def test_the_driver_view_from_nvidia_smi_xml():
    driver = _probe_module().parse_nvidia_smi_xml((FIXTURES / "gpu" / "h200_nvidia_smi_q.xml").read_text())
    assert driver["driver_version"] == "580.159.04" and driver["cuda_version"] == "13.0"
    assert driver["gpus"] == [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-5676af80-5039-da0d-94af-52dcb92e876a",
                               "memory_total_mib": 143771, "addressing_mode": "None"}]
    # The probe run on the same host parsed the same document.
    assert recorded("h200_probe")["gpu"]["driver"] == driver


def test_a_working_h200_passes_and_its_memory_is_its_own():
    gpu = recorded("h200_probe")["gpu"]
    assert (gpu["source"], gpu["count"], gpu["unified_memory"]) == ("cuda", 1, False)
    assert gpu["devices"][0]["compute_capability"] == "9.0"
    assert gpu["devices"][0]["memory_free_mib"] <= gpu["devices"][0]["memory_total_mib"]
    assert gpu_problem(gpu, "h200-1", IMAGE) == ""


def test_a_container_without_a_gpu_is_named_with_the_fix():
    message = gpu_problem(recorded("h200_probe_no_device")["gpu"], "spark-2", IMAGE)
    assert message == (
        "spark-2: a container of nvcr.io/nvidia/vllm:26.02-py3 started with a GPU request sees no GPU "
        "(No CUDA GPUs are available); install the NVIDIA container toolkit on the node and restart Docker "
        "(nvidia-ctk runtime configure --runtime=docker), or set ray_cluster_use_gpus: false for a node without GPUs")


def test_gpus_the_driver_lists_but_cuda_cannot_see_are_named():
    message = gpu_problem(recorded("h200_probe_hidden_from_cuda")["gpu"], "h200-1", IMAGE)
    assert message.startswith("h200-1: the driver lists 1 GPU(s) but CUDA in nvcr.io/nvidia/vllm:26.02-py3 sees none "
                              "(No CUDA GPUs are available); check CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize("capability, served", [
    ("9.0", True),    # H100/H200: sm_90
    ("8.9", True),    # L40S: runs sm_86 code
    ("12.1", True),   # GB10 (DGX Spark): runs sm_120 code
    ("10.3", True),   # B300: runs sm_100 code
    ("11.0", False),  # no sm_11x cubin and no PTX in this build
    ("7.0", False),   # V100: older than every cubin of this build
])
def test_kernels_of_the_recorded_pytorch_build(capability, served):
    arch_list = recorded("h200_probe")["gpu"]["torch"]["arch_list"]
    assert arch_list == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert kernels_for(arch_list, capability) is served


def test_ptx_and_arch_specific_cubins():
    assert kernels_for(["sm_80", "compute_80"], "12.1")       # the driver compiles PTX for newer GPUs
    assert not kernels_for(["sm_90a"], "9.1") and kernels_for(["sm_90a"], "9.0")
    assert not kernels_for(["sm_120"], "9.0")


def test_a_gpu_without_kernels_in_the_image_is_refused():
    # The H200 recording, read as if the image's PyTorch had been built only up to sm_90 and the GPU
    # were a GB10: the arch list is the recording's own, cut; the capability is GB10's published one.
    gpu = recorded("h200_probe")["gpu"]
    gpu["torch"]["arch_list"] = gpu["torch"]["arch_list"][:4]
    gpu["devices"][0].update(name="NVIDIA GB10", compute_capability="12.1")
    assert gpu_problem(gpu, "spark-1", IMAGE) == (
        "spark-1: nvcr.io/nvidia/vllm:26.02-py3 has no GPU kernels for the node's NVIDIA GB10 (compute capability 12.1, "
        "sm_121): its PyTorch 2.11.0+cu130 is built for sm_75, sm_80, sm_86, sm_90; use an image built for sm_121")


def _hook(tmp_path, env, visible):
    """Run the lab's hook as dockerd does: the OCI state on stdin, the bundle's config.json beside the root."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"},
                                                    "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=" + visible]}}))
    done = subprocess.run([sys.executable, str(HOOK), "prestart"], input=json.dumps({"bundle": str(bundle), "pid": 1}),
                          capture_output=True, text=True, env=env, check=False)
    return done, bundle / "rootfs" / "etc" / "gpulab-lab" / "gpus.json"


def test_the_lab_hook_and_the_probe_agree(tmp_path, monkeypatch):
    env = {"GPULAB_LAB_NODE": "node2", "GPULAB_LAB_GPUS": "2", "GPULAB_LAB_UNIFIED_MEMORY": "1"}
    done, marker = _hook(tmp_path, env, "all")
    assert done.returncode == 0, done.stderr
    probe = _probe_module()
    monkeypatch.setattr(probe, "LAB_GPU_MARKER", str(marker))
    gpu = probe.read_gpus()
    assert (gpu["source"], gpu["count"], gpu["unified_memory"]) == ("lab", 2, True)
    assert [d["uuid"] for d in gpu["devices"]] == ["GPU-gpulab-lab-node2-0", "GPU-gpulab-lab-node2-1"]
    assert gpu_problem(gpu, "node2", "lab") == ""


def test_the_lab_hook_refuses_a_gpu_the_node_lacks_and_marks_nothing_without_a_request(tmp_path):
    done, marker = _hook(tmp_path, {"GPULAB_LAB_GPUS": "1"}, "1")
    assert done.returncode == 1 and "unknown device 1: this lab node has 1 GPU(s)" in done.stderr
    done, marker = _hook(tmp_path / "none", {"GPULAB_LAB_GPUS": "1"}, "void")
    assert done.returncode == 0 and not marker.exists()


def test_gpu_requests_follow_the_node():
    # node_facts reports paths as {path: exists}; lab nodes have no /dev/nvidia0.
    gpu_node, lab_node = {"paths": {"/dev/nvidia0": True}}, {"paths": {"/dev/nvidia0": False}}
    every_gpu = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    assert gpu_requests("auto", lab_node) == [] and gpu_requests("auto", gpu_node) == every_gpu
    assert gpu_requests("true", lab_node) == gpu_requests(True, lab_node) == every_gpu
    assert gpu_requests("false", gpu_node) == gpu_requests(False, gpu_node) == []


def test_only_ngc_entrypoint_is_kept():
    node = json.loads((FIXTURES / "node" / "node1_nothing_deployed.json").read_text())
    entrypoints = [(body["body"].get("Config") or {}).get("Entrypoint") for body in node["docker"]["images"].values()
                   if body["status"] == 200]
    assert ["vllm", "serve"] in entrypoints and None in entrypoints
    assert all(entrypoint_prefix(entrypoint) == [] for entrypoint in entrypoints)
    assert entrypoint_prefix([NGC_ENTRYPOINT]) == [NGC_ENTRYPOINT] == entrypoint_prefix(NGC_ENTRYPOINT)
