"""The fabric filters on network facts gathered from a real lab node."""

import copy
import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpulab.vllm.plugins.filter.fabric import (
    cidr_problem, fabric_duplicates, fabric_env, fabric_interface, fabric_mtu_problem)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "facts"


@pytest.fixture()
def node1():
    # `ansible node1 -m setup -a gather_subset=!all,!min,network` on the two-node lab.
    return json.loads((FIXTURES / "lab_node1_network.json").read_text())


def test_picks_the_fabric_interface_not_the_management_one(node1):
    assert fabric_interface(node1, "10.220.0.0/24", "node1") == {
        "interface": "enp1s0f0np0",
        "address": "10.220.0.11",
        "prefix": 24,
        "network": "10.220.0.0/24",
        "mtu": 1500,
    }
    assert fabric_interface(node1, "10.210.0.0/24", "node1")["interface"] == "eth0"


def test_one_mtu_on_every_fabric_interface_passes(node1):
    found = fabric_interface(node1, "10.220.0.0/24", "node1")
    assert fabric_mtu_problem([["node1", found["interface"], found["mtu"]], ["node2", "enp1s0f0np0", 1500]]) == ""
    # A node whose read has no MTU is not judged.
    assert fabric_mtu_problem([["node1", "enp1s0f0np0", 1500], ["node2", "enp1s0f0np0", None]]) == ""
    assert fabric_mtu_problem([["node1", "enp1s0f0np0", "1500"], ["node2", "enp1s0f0np0", "None"]]) == ""


@pytest.mark.parametrize("mtus, named, fix", [
    # A NIC reset to 1500 beside one at 9000: between as many, the larger is the fix.
    ([["spark1", "enP2p1s0f1np1", 9000], ["spark2", "enP2p1s0f1np1", 1500]],
     "spark1 enP2p1s0f1np1 9000, spark2 enP2p1s0f1np1 1500", "ip link set dev enP2p1s0f1np1 mtu 9000 on spark2"),
    # Otherwise the MTU most nodes have.
    ([["h1", "ib0", 4092], ["h2", "ib0", 2044], ["h3", "ib0", 2044]],
     "h1 ib0 4092, h2 ib0 2044, h3 ib0 2044", "ip link set dev ib0 mtu 2044 on h1"),
])
def test_fabric_interfaces_that_differ_in_mtu_are_named(mtus, named, fix):
    problem = fabric_mtu_problem(mtus)
    assert problem.startswith(f"the fabric interfaces differ in MTU ({named}): frames larger than the smallest are lost")
    assert f"({fix})" in problem


def test_no_address_on_the_subnet_names_host_and_addresses(node1):
    with pytest.raises(AnsibleFilterError) as err:
        fabric_interface(node1, "192.168.200.0/24", "node1")
    message = str(err.value)
    assert "node1 has no address on the fabric subnet 192.168.200.0/24" in message
    assert "enp1s0f0np0=10.220.0.11" in message and "eth0=10.210.0.11" in message


def test_secondary_addresses_count(node1):
    facts = copy.deepcopy(node1)
    facts["eth0"]["ipv4_secondaries"] = [{"address": "192.168.200.12", "netmask": "255.255.255.0"}]
    assert fabric_interface(facts, "192.168.200.0/24")["interface"] == "eth0"


def test_two_interfaces_on_the_subnet_is_an_error(node1):
    with pytest.raises(AnsibleFilterError, match="several interfaces on the fabric subnet"):
        fabric_interface(node1, "10.0.0.0/8", "node1")


def test_pinned_fabric_address(node1):
    assert fabric_interface(node1, "10.220.0.0/24", "node1", "10.220.0.11")["interface"] == "enp1s0f0np0"
    with pytest.raises(AnsibleFilterError, match="fabric_address 10.221.0.11 is outside the fabric subnet"):
        fabric_interface(node1, "10.220.0.0/24", "node1", "10.221.0.11")
    with pytest.raises(AnsibleFilterError, match="no interface with its fabric_address 10.220.0.99"):
        fabric_interface(node1, "10.220.0.0/24", "node1", "10.220.0.99")


def test_bad_subnet():
    assert cidr_problem("10.220.0.0/24") == ""
    assert "CIDR" in cidr_problem("10.220.0.0")
    assert cidr_problem("10.220.0.0/33")
    assert "CIDR" in cidr_problem(None)


def test_env_without_rdma_uses_the_interface_everywhere():
    env = fabric_env({"interface": "enp1s0f0np0", "address": "10.220.0.12"}, "10.220.0.11")
    assert env["VLLM_HOST_IP"] == "10.220.0.12"
    assert env["MASTER_ADDR"] == "10.220.0.11"
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include", "UCX_NET_DEVICES"):
        assert env[key] == "enp1s0f0np0", key
    assert "NCCL_IB_HCA" not in env
    # No RDMA port behind the fabric: NCCL must not try the host's other HCAs (a storage adapter).
    assert env["NCCL_IB_DISABLE"] == "1"
    # Gloo does not understand NCCL's exclusion syntax: never hand it "^lo".
    assert not any(value.startswith("^") for value in env.values())


def test_env_with_rdma_devices_and_extra():
    env = fabric_env(
        {"interface": "enp1s0f0np0", "address": "192.168.200.12"},
        "192.168.200.12",
        ["mlx5_0:1", "mlx5_1:1"],
        {"NCCL_DEBUG": "WARN", "NCCL_IB_GID_INDEX": 3},
    )
    # The ports in the order given (fabric_rdma sorts them by PCI address), matched exactly.
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert "NCCL_IB_DISABLE" not in env
    assert env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_DEBUG"] == "WARN"


def test_duplicates_none_on_the_labs():
    # The two-node lab's and the two Sparks' fabric addresses, in play order.
    assert fabric_duplicates(["10.220.0.11", "10.220.0.12"]) == []
    assert fabric_duplicates(["192.168.200.12", "192.168.200.13"]) == []
    assert fabric_duplicates(["192.168.200.12"]) == []
    assert fabric_duplicates([]) == []


def test_duplicates_each_once_in_the_order_of_the_nodes():
    # A host block copied for a third Spark with its fabric_address left as spark-2's.
    assert fabric_duplicates(["192.168.200.12", "192.168.200.13", "192.168.200.13"]) == ["192.168.200.13"]
    # Four nodes, two addresses shared: named once each, the first node's first, not sorted.
    assert fabric_duplicates(["10.220.0.13", "10.220.0.11", "10.220.0.13", "10.220.0.11", "10.220.0.12",
                              "10.220.0.11"]) == ["10.220.0.13", "10.220.0.11"]
