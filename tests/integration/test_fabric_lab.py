"""The fabric on the lab as a hardened site runs it: both nodes with INPUT policy DROP (loopback, replies and
SSH admitted, nothing else), a deploy from nothing that serves a completion, the collective check across both
nodes before the load, a no-op re-run, and the same check failing, naming the node, when that node's fabric link
is throttled under the floor."""

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


def _input(node: str) -> list[str]:
    return subprocess.run(["nsenter", f"--net=/run/netns/{_ns(node)}", "--", "iptables", "-S", "INPUT"],
                          check=True, capture_output=True, text=True).stdout.splitlines()


def _ns(node: str) -> str:
    sys_path = ROOT / "lab"
    import sys  # noqa: PLC0415 - the lab's own naming, loaded on demand

    if str(sys_path) not in sys.path:
        sys.path.insert(0, str(sys_path))
    from gpulab_lab.common import ns_name  # noqa: PLC0415

    return ns_name(node)


def _recap(output: str) -> dict:
    return {host: {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}
            for host, line in re.findall(r"^(node\d+)\s+:\s+(.*)$", output, re.M)}


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


def test_hardened_nodes_serve_after_the_collective_check(hardened):
    run = _play("deploy_qwen35.yml")
    assert run.returncode == 0, run.stdout[-5000:]
    for node in ("node1", "node2"):
        assert "-P INPUT DROP" in _input(node), f"{node} is no longer hardened"
    # The collective ran across both nodes before vLLM started, and said what it saw per node.
    report = re.search(r"gloo all-reduce of \d+ MiB over 2 ranks: bus bandwidth ([\d.]+) Gbit/s.*?node2 \(10\.220\.0\.12\): "
                       r"TCP on enP2p1s0f1np1, link to the head ([\d.]+) Gbit/s", run.stdout, re.S)
    assert report, run.stdout[-5000:]
    assert float(report.group(1)) > 0 and float(report.group(2)) > 0
    assert run.stdout.index("Prove the fabric with one collective") < run.stdout.index("Run the vLLM server")
    # The host firewall comes first in INPUT and admits the fabric subnet on the fabric interface.
    for node, iface in (("node1", "enp1s0f0np0"), ("node2", "enP2p1s0f1np1")):
        rules = _input(node)
        assert [rule for rule in rules if rule.startswith("-A")][0] == \
            '-A INPUT -m comment --comment "gpulab: default deny" -j GPULAB-INPUT', rules
        chain = subprocess.run(["nsenter", f"--net=/run/netns/{_ns(node)}", "--", "iptables", "-S", "GPULAB-INPUT"],
                               check=True, capture_output=True, text=True).stdout.splitlines()
        assert f'-A GPULAB-INPUT -s 10.220.0.0/24 -i {iface} -m comment --comment "gpulab: the fabric subnet" -j ACCEPT' \
            in chain, chain

    again = _play("deploy_qwen35.yml")
    assert again.returncode == 0, again.stdout[-3000:]
    assert all(counts["changed"] == 0 for counts in _recap(again.stdout).values()), again.stdout[-3000:]
    # Nothing is about to load on a healthy cluster: the check stands aside (skipped steps are not printed: neither
    # its task nor its report may appear).
    assert "Run one all-reduce across every GPU" not in again.stdout and "bus bandwidth" not in again.stdout
    assert "Run one all-reduce across every GPU" in run.stdout


def test_a_throttled_node_is_named_before_the_load(hardened):
    _play("teardown.yml")
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
