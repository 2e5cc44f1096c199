"""The fabric interface's own RDMA ports, read from sysfs trees of real host types (tests/unit/fixtures/sysfs)."""

from __future__ import annotations

import copy
import json
import sys

import pytest
from ansible.errors import AnsibleFilterError

from conftest import FIXTURES, REPO

sys.path.insert(0, str(REPO / "lab"))

from ansible_collections.gpulab.vllm.plugins.filter.fabric import fabric_env, fabric_rdma  # noqa: E402
from ansible_collections.gpulab.vllm.plugins.module_utils._node import read_rdma  # noqa: E402
from gpulab_lab.sysfs import materialize  # noqa: E402

TREES = sorted(path.stem for path in (FIXTURES / "sysfs").glob("*.json"))


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / "sysfs" / f"{name}.json").read_text())


def read(tmp_path, tree: dict) -> dict:
    return read_rdma(str(materialize(tree, tmp_path / "sys")))


def ports(found: list) -> list:
    return [f"{item['device']}:{item['port']}" for item in found]


CASES = [(name, interface) for name in TREES for interface in fixture(name)["expected"]]


@pytest.mark.parametrize("name,interface", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_each_fabric_interface_maps_to_its_own_ports(tmp_path, name, interface):
    doc = fixture(name)
    found = fabric_rdma(read(tmp_path, doc["tree"]), interface, "node1")
    assert sorted(ports(found)) == sorted(doc["expected"][interface])


def test_spark_one_cable_twins_in_pci_order_with_roles(tmp_path):
    rdma = read(tmp_path, fixture("dgx_spark_one_cable")["tree"])
    assert sorted(rdma["devices"]) == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    assert rdma["netdevs"]["enP2p1s0f1np1"]["rdma_devices"] == ["roceP2p1s0f1"]
    found = fabric_rdma(rdma, "enP2p1s0f1np1", "spark2")
    # Sorted by PCI address, so that both Sparks list the same physical paths in the same order.
    assert [(item["device"], item["pci"], item["role"]) for item in found] == [
        ("rocep1s0f1", "0000:01:00.1", "twin"), ("roceP2p1s0f1", "0002:01:00.1", "interface")]
    env = fabric_env({"interface": "enP2p1s0f1np1", "address": "192.168.177.12"}, "192.168.177.11", found)
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
    assert env["UCX_NET_DEVICES"] == "rocep1s0f1:1,roceP2p1s0f1:1"
    assert "NCCL_IB_DISABLE" not in env and "NCCL_IB_GID_INDEX" not in env


def test_spark_one_cable_uncabled_port_is_refused(tmp_path):
    rdma = read(tmp_path, fixture("dgx_spark_one_cable")["tree"])
    with pytest.raises(AnsibleFilterError, match=r"spark2: the fabric interface enp1s0f0np0 sits on RDMA device "
                                                 r"rocep1s0f0 port 1, which is DOWN \(Disabled\)"):
        fabric_rdma(rdma, "enp1s0f0np0", "spark2")


def test_spark_two_cables_each_port_keeps_its_own_twin(tmp_path):
    rdma = read(tmp_path, fixture("dgx_spark_two_cables")["tree"])
    assert ports(fabric_rdma(rdma, "enp1s0f0np0")) == ["rocep1s0f0:1", "roceP2p1s0f0:1"]
    assert ports(fabric_rdma(rdma, "enP2p1s0f1np1")) == ["rocep1s0f1:1", "roceP2p1s0f1:1"]


def test_h100_storage_hca_is_left_out_of_the_compute_rails(tmp_path):
    rdma = read(tmp_path, fixture("h100_storage_hca")["tree"])
    assert len(rdma["devices"]) >= 9
    found = fabric_rdma(rdma, "ibp24s0", "gpu01")
    assert {item["link_layer"] for item in found} == {"InfiniBand"}
    assert not {"mlx5_1:1", "mlx5_2:1", "mlx5_7:1", "mlx5_8:1"} & set(ports(found))
    env = fabric_env({"interface": "ibp24s0", "address": "100.126.6.86"}, "100.126.6.85", found)
    # Exact match: a prefix mlx5_1 would also take mlx5_10 and mlx5_11.
    assert env["NCCL_IB_HCA"].startswith("=mlx5_0:1,mlx5_3:1,") and "mlx5_1:" not in env["NCCL_IB_HCA"]


def test_override_names_ports_that_must_exist_and_be_active(tmp_path):
    rdma = read(tmp_path, fixture("h100_storage_hca")["tree"])
    compute = ["mlx5_0", "mlx5_3:1"]
    assert ports(fabric_rdma(rdma, "ibp24s0", "gpu01", compute)) == ["mlx5_0:1", "mlx5_3:1"]
    with pytest.raises(AnsibleFilterError, match=r"gpu01: fabric_rdma_devices names mlx5_99, which this node does not have"):
        fabric_rdma(rdma, "ibp24s0", "gpu01", ["mlx5_99"])
    with pytest.raises(AnsibleFilterError, match=r"fabric_rdma_devices names port 2 of mlx5_0"):
        fabric_rdma(rdma, "ibp24s0", "gpu01", ["mlx5_0:2"])


def test_transport_choices(tmp_path):
    rdma = read(tmp_path, fixture("dgx_spark_one_cable")["tree"])
    assert fabric_rdma(rdma, "enP2p1s0f1np1", "spark2", None, "socket") == []
    with pytest.raises(AnsibleFilterError, match="fabric_transport is 'tcp'"):
        fabric_rdma(rdma, "enP2p1s0f1np1", "spark2", None, "tcp")
    # An interface on no HCA (a lab veth, a management NIC): TCP, and NCCL is kept off the HCAs.
    assert fabric_rdma(rdma, "eth0", "spark2") == []
    env = fabric_env({"interface": "eth0", "address": "10.0.0.2"}, "10.0.0.1", [])
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env
    with pytest.raises(AnsibleFilterError, match=r"spark2: fabric_transport is rdma but the fabric interface eth0 sits on no RDMA device"):
        fabric_rdma(rdma, "eth0", "spark2", None, "rdma")


def test_roce_port_without_a_roce_v2_gid_is_refused(tmp_path):
    # The recorded tree with its RoCE v2 GIDs taken away, as on an adapter left in RoCE v1 mode.
    tree = copy.deepcopy(fixture("dgx_spark_one_cable")["tree"])
    v2 = [rel for rel, value in tree.items() if "/gid_attrs/types/" in rel and value.strip() == "RoCE v2"]
    assert v2
    for rel in v2:
        tree[rel] = "IB/RoCE v1\n"
    with pytest.raises(AnsibleFilterError, match=r"spark2: RDMA port \S+:1 \(enP2p1s0f1np1\) has no RoCE v2 GID \(GID types: IB/RoCE v1\)"):
        fabric_rdma(read(tmp_path, tree), "enP2p1s0f1np1", "spark2")


def test_a_host_without_rdma_reads_empty(tmp_path):
    # A real recording of a GPU host whose only interface is a virtio NIC.
    rdma = read(tmp_path, {})
    assert rdma == {"devices": {}, "netdevs": {}}
