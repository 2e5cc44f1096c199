"""The fabric on the lab: on nodes hardened as a site runs them (INPUT policy DROP: loopback, replies and SSH
admitted, nothing else), the collective check failing before the load, naming the node, when that node's fabric
link is throttled under the floor (the same check passing on hardened nodes, a deploy from nothing that serves and a
no-op re-run are links of the serving chain: test_serving_chain.py); then nodes shown as DGX Sparks (recorded sysfs
trees): the ports behind each fabric interface, an image without verbs, a node without verbs devices or a dead port."""

from __future__ import annotations

import re
import subprocess

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, playbook_env as _env

LABCTL = [str(BIN / "python"), str(ROOT / "lab" / "labctl.py")]


def _lab(*args: str) -> None:
    subprocess.run([*LABCTL, *args], check=True, capture_output=True, text=True)


def _play(name: str, *extra: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, check=False, timeout=timeout)


@pytest.fixture(scope="module")
def hardened():
    _play("teardown.yml")
    for node in ("node1", "node2"):
        _lab("input", node, "drop")
    try:
        yield
    finally:
        for node in ("node1", "node2"):
            _lab("input", node, "accept")
            _lab("rate", node, "off")
        _play("teardown.yml")


def test_a_throttled_node_is_named_before_the_load(hardened):
    # From nothing (the fixture's teardown), on hardened nodes.
    _lab("rate", "node2", "100mbit")
    try:
        run = _play("deploy_qwen35.yml")
    finally:
        _lab("rate", "node2", "off")
    assert run.returncode != 0
    assert re.search(r"node2 \(10\.220\.0\.12\): its link to the head carried [\d.]+ Gbit/s; floor 0\.5 Gbit/s", run.stdout), \
        run.stdout[-4000:]
    # Stopped before the model load: no server was started.
    assert "Run the vLLM server" not in run.stdout


RAY_ONLY = ["-e", '{"image_ref": "{{ lab_ray_image }}", "image_require_vllm": false, "gpulab_vllm_serve": false}']


def _container_env(node: str, name: str) -> dict:
    from labkit import node_docker  # noqa: PLC0415

    env = node_docker(node, "inspect", "-f", "{{json .Config.Env}}", name).stdout
    import json  # noqa: PLC0415

    return dict(item.split("=", 1) for item in json.loads(env))


@pytest.fixture()
def sparks():
    """node1 shown a DGX Spark with both ports cabled, node2 one with one cable (recorded sysfs trees), and the
    machine a /dev/infiniband; each node's fabric interface is one of the Spark's ConnectX-7 interfaces."""
    _play("teardown.yml")
    _lab("rdma", "node1", "dgx_spark_two_cables")
    _lab("rdma", "node2", "dgx_spark_one_cable")
    try:
        yield
    finally:
        _lab("rdma", "node1", "off")
        _lab("rdma", "node2", "off")
        _play("teardown.yml")


def test_each_spark_gets_the_ports_behind_its_fabric_interface(sparks):
    # The Ray image carries rdma-core (libibverbs and the mlx5 provider), as NGC images do.
    run = _play("deploy.yml", *RAY_ONLY)
    assert run.returncode == 0, run.stdout[-5000:]
    head = _container_env("node1", "gpulab-ray-head")
    worker = _container_env("node2", "gpulab-ray-worker")
    # enp1s0f0np0 (node1) sits on rocep1s0f0, whose twin roceP2p1s0f0 is ACTIVE too; enP2p1s0f1np1 (node2) on
    # roceP2p1s0f1 with its twin rocep1s0f1, the DOWN f0 functions left out. Exact match, PCI order on both.
    assert head["NCCL_IB_HCA"] == "=rocep1s0f0:1,roceP2p1s0f0:1"
    assert worker["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
    assert worker["UCX_NET_DEVICES"] == "rocep1s0f1:1,roceP2p1s0f1:1"
    assert "NCCL_IB_DISABLE" not in head and "NCCL_IB_DISABLE" not in worker
    assert "NCCL_IB_GID_INDEX" not in worker
    # Each node's presented GID table holds its own fabric address, as its kernel would list it: NCCL takes that
    # address's RoCE v2 GID on the interface's port, and a link-local one on the twin, which holds no address.
    said = " ".join(run.stdout.split())
    assert ("node2: NCCL takes rocep1s0f1 (twin) GID 0 (link-local fe80:0000:0000:0000:fe4c:eaff:fef9:4231, IB/RoCE v1); "
            "roceP2p1s0f1 (interface) GID 3 (10.220.0.12, RoCE v2)") in said, said[-3000:]
    from labkit import node_docker  # noqa: PLC0415

    devices = node_docker("node2", "inspect", "-f", "{{json .HostConfig.Devices}}", "gpulab-ray-worker").stdout
    assert "/dev/infiniband" in devices


def test_an_image_without_verbs_is_refused_before_anything_starts(sparks):
    # The lab vLLM image has no rdma-core: NCCL would take TCP in silence.
    run = _play("deploy_qwen35.yml")
    assert run.returncode != 0
    assert re.search(r"on node[12]: the fabric runs over RDMA but the image has no libibverbs\.so\.1, so NCCL would "
                     r"fall back to TCP in silence", run.stdout), run.stdout[-4000:]
    assert "Run gpulab-ray-head" not in run.stdout
    # On purpose over TCP, it serves, and NCCL is kept off the HCAs. The floor is given: the presented interfaces
    # report the Spark's 200 Gbit/s, while the veth beneath carries what two CPU cores move.
    run = _play("deploy_qwen35.yml", "-e", "fabric_transport=socket", "-e", "collective_min_gbps=0.5")
    assert run.returncode == 0, run.stdout[-5000:]
    assert _container_env("node2", "gpulab-ray-worker")["NCCL_IB_DISABLE"] == "1"


def test_a_node_without_verbs_devices_or_with_a_dead_port_is_refused(sparks):
    _lab("rdma", "node1", "dgx_spark_one_cable")  # node1's enp1s0f0np0 is the uncabled port there
    run = _play("deploy.yml", *RAY_ONLY)
    assert run.returncode != 0
    assert ("node1: the fabric interface enp1s0f0np0 sits on RDMA device rocep1s0f0 port 1, which is DOWN (Disabled); "
            "check the cable and the switch port") in run.stdout, run.stdout[-4000:]
    assert "Run gpulab-ray" not in run.stdout
    _lab("rdma", "node1", "dgx_spark_two_cables")
    import shutil  # noqa: PLC0415

    shutil.rmtree("/dev/infiniband")  # an HCA without the verbs driver loaded
    run = _play("deploy.yml", *RAY_ONLY)
    assert run.returncode != 0
    assert re.search(r"node[12]: the fabric interface \S+ sits on RDMA port\(s\) \S+:1, \S+:1 but the node has no "
                     r"/dev/infiniband; load the verbs driver", run.stdout), run.stdout[-4000:]
    assert "Run gpulab-ray" not in run.stdout
