"""Multi-rail hosts end to end on the sysfs fixtures: a node's read (its addresses through the node read's own parser,
its RDMA devices through read_rdma) through the filters the fabric role calls, in the role's order, to what the
collective then expects and the floors it holds each node to.

The fixtures are rebuilt from published outputs (tests/unit/fixtures/sysfs/SOURCES.md). Where a test changes one (an
address on every rail, a storage port made ACTIVE), it says so; the NCCL reports below are built here, in the shape
the collective check prints, to hold the verdict to each case (the parsing of NCCL's own lines is tested on real logs
in test_collective.py)."""

from __future__ import annotations

import copy
import json
import sys

import pytest
from ansible.errors import AnsibleFilterError

from conftest import FIXTURES, REPO

sys.path.insert(0, str(REPO / "lab"))

from ansible_collections.gpulab.vllm.plugins.filter.collective import (  # noqa: E402
    collective_expectations, collective_floor, collective_problems)
from ansible_collections.gpulab.vllm.plugins.filter.fabric import (  # noqa: E402
    fabric_env, fabric_interface, fabric_rdma, nccl_gids_said, nccl_roce_gid)
from ansible_collections.gpulab.vllm.plugins.module_utils._node import parse_ip_address_json, read_rdma  # noqa: E402
from gpulab_lab.sysfs import materialize, with_addresses  # noqa: E402

H100_SUBNET = "100.126.0.0/16"
H100_COMPUTE = ["mlx5_0:1", "mlx5_3:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1", "mlx5_9:1", "mlx5_10:1", "mlx5_11:1"]
H100_RAIL_NETDEVS = ["ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"]


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / "sysfs" / f"{name}.json").read_text())


def node_read(tmp_path, doc: dict, addresses: dict | None = None) -> dict:
    """What the node read gives the fabric role for a host: 'network' from `ip -j address` (the fixture's addresses,
    or the test's, every interface up) through the node read's parser, 'rdma' from the sysfs tree through read_rdma,
    the tree's IPv4 GIDs those of these addresses (gpulab_lab.sysfs.with_addresses, as the kernel lists them)."""
    addresses = addresses if addresses is not None else doc["ip_addresses"]
    links = [{"ifname": name, "operstate": "UP", "flags": ["UP", "LOWER_UP"], "mtu": 2044,
              "addr_info": [{"family": "inet", "local": cidr.split("/")[0], "prefixlen": int(cidr.split("/")[1])}
                            for cidr in cidrs]}
             for name, cidrs in sorted(addresses.items())]
    tree = with_addresses(doc["tree"], {name: [cidr.split("/")[0] for cidr in cidrs] for name, cidrs in addresses.items()})
    root = tmp_path / f"sys{len(list(tmp_path.iterdir()))}"
    return {"network": parse_ip_address_json(json.dumps(links)), "rdma": read_rdma(str(materialize(tree, root)))}


def fabric_role(host: str, read: dict, subnet: str, address=None, override=None) -> dict:
    """The fabric role's decisions for one node, as its tasks make them: the interface, the RDMA ports, fabric_info."""
    found = fabric_interface(read["network"], subnet, host, address)
    ports = fabric_rdma(read["rdma"], found["interface"], host, override, "auto", read["network"], subnet)
    return {"interface": found["interface"], "ip": found["address"], "transport": "rdma" if ports else "socket",
            "rdma_ports": ports}


def names(ports: list) -> list:
    return [f"{item['device']}:{item['port']}" for item in ports]


def nccl_report(nodes: dict, busbw: float, floors: dict, link: float) -> dict:
    """A report in the collective check's shape: per fabric address the devices NCCL's IB plugin listed."""
    return dict(floors, backend="nccl", busbw_gbps=busbw, nccl_ranks=[],
                nodes=[{"ip": ip, "network": "IB", "devices": [f"{port}/IB" for port in ports],
                        "link_gbps": None if index == 0 else link} for index, (ip, ports) in enumerate(nodes.items())])


def two_h100s(tmp_path, addresses=None, fabric_address=None) -> tuple:
    doc = fixture("h100_storage_hca")
    infos = []
    for index, host in enumerate(("gpu01", "gpu02")):
        own = copy.deepcopy(addresses if addresses is not None else doc["ip_addresses"])
        # gpu02: the same host type, its fabric address one above gpu01's (100.126.6.86, published for ibp24s0).
        own = {netdev: [cidr.replace("100.126.6.", f"100.126.{6 + index}.") for cidr in cidrs] for netdev, cidrs in own.items()}
        pinned = fabric_address.replace("100.126.6.", f"100.126.{6 + index}.") if fabric_address else None
        infos.append(fabric_role(host, node_read(tmp_path, doc, own), H100_SUBNET, pinned))
    return infos


def test_an_h100_takes_its_eight_compute_rails_and_leaves_the_storage_ports_out(tmp_path):
    gpu01, gpu02 = two_h100s(tmp_path)
    assert gpu01["interface"] == "ibp24s0" and gpu01["ip"] == "100.126.6.86"
    assert names(gpu01["rdma_ports"]) == H100_COMPUTE
    assert [item["role"] for item in gpu01["rdma_ports"]] == ["interface"] + ["rail"] * 7
    # The storage card's Ethernet port (mlx5_8, ACTIVE at the same 400 Gbit/s, 192.0.2.10/24) and its DOWN
    # InfiniBand ports (mlx5_1, mlx5_7) are left out.
    env = fabric_env({"interface": gpu01["interface"], "address": gpu01["ip"]}, gpu01["ip"], gpu01["rdma_ports"])
    assert env["NCCL_IB_HCA"] == "=" + ",".join(H100_COMPUTE)
    assert env["NCCL_SOCKET_IFNAME"] == "ibp24s0" and env["GLOO_SOCKET_IFNAME"] == "ibp24s0"
    assert "NCCL_IB_DISABLE" not in env

    expect = collective_expectations(["gpu01", "gpu02"], [gpu01, gpu02])
    assert expect["100.126.6.86"]["rate_gbps"] == 3200.0 and expect["100.126.6.86"]["rails"] == 8
    assert expect["100.126.7.86"]["port_gbps"] == 400.0
    floors = collective_floor(expect, None, 0.25)
    assert floors["floor_gbps"] == 800.0 and floors["link_floor_gbps"] == 100.0
    assert floors["floor"] == "0.25 x 3200 Gbit/s, the slowest node's 8 rails together (gpu01)"

    every_rail = {"100.126.6.86": H100_COMPUTE, "100.126.7.86": H100_COMPUTE}
    assert collective_problems(nccl_report(every_rail, 1400.0, floors, 380.0), expect) == []


def test_one_rail_of_eight_is_named_twice_by_its_devices_and_by_the_rails_floor(tmp_path):
    gpu01, gpu02 = two_h100s(tmp_path)
    expect = collective_expectations(["gpu01", "gpu02"], [gpu01, gpu02])
    floors = collective_floor(expect, None, 0.25)
    # NCCL on one HCA per node (NCCL_IB_HCA naming one port, as before multi-rail): a link at one port's rate passes
    # the link floor, the all-reduce does not reach a quarter of eight rails.
    one_rail = {"100.126.6.86": ["mlx5_0:1"], "100.126.7.86": ["mlx5_0:1"]}
    problems = collective_problems(nccl_report(one_rail, 380.0, floors, 370.0), expect)
    assert len(problems) == 3
    assert problems[0].startswith("gpu01 (100.126.6.86): NCCL's IB plugin left out mlx5_3:1 (rail), mlx5_4:1 (rail), ")
    assert problems[2].startswith("the all-reduce reached 380.0 Gbit/s of bus bandwidth with every link above the "
                                  "floor; floor 800.0 Gbit/s (0.25 x 3200 Gbit/s, the slowest node's 8 rails together "
                                  "(gpu01)): every link to the head passed, so NCCL crosses fewer rails")
    # The same node's link under a quarter of one port is a link problem, with the link's floor.
    problems = collective_problems(nccl_report({"100.126.6.86": H100_COMPUTE, "100.126.7.86": H100_COMPUTE},
                                               1400.0, floors, 60.0), expect)
    assert problems == ["gpu02 (100.126.7.86): its link to the head carried 60.0 Gbit/s; floor 100.0 Gbit/s "
                        "(0.25 x 400 Gbit/s, the slowest fabric rate): check the link's speed and errors (ethtool, "
                        "ibstat), the MTU on both ends, a throttled or shared port (tc qdisc), or lower "
                        "collective_min_gbps if this fabric is slower on purpose"]


def test_rails_that_carry_addresses_on_the_fabric_subnet_need_the_fabric_address(tmp_path):
    # The fixture with an address on every compute rail in the fabric's /16 (a published check of such a host showed
    # addresses on all eight; their values were not kept, so these are made here).
    addresses = dict(fixture("h100_storage_hca")["ip_addresses"])
    for index, netdev in enumerate(H100_RAIL_NETDEVS):
        addresses[netdev] = [f"100.126.6.{100 + index}/16"]
    read = node_read(tmp_path, fixture("h100_storage_hca"), addresses)
    with pytest.raises(AnsibleFilterError, match=r"gpu01 has several interfaces on the fabric subnet 100\.126\.0\.0/16 "
                                                 r"\(.*ibp24s0=100\.126\.6\.86.*\); set fabric_address for gpu01 to the "
                                                 r"one Ray, Gloo and NCCL's bootstrap are to use"):
        fabric_role("gpu01", read, H100_SUBNET)
    gpu01, gpu02 = two_h100s(tmp_path, addresses, fabric_address="100.126.6.86")
    assert gpu01["interface"] == "ibp24s0" and names(gpu01["rdma_ports"]) == H100_COMPUTE
    assert gpu02["ip"] == "100.126.7.86" and names(gpu02["rdma_ports"]) == H100_COMPUTE
    # Another rail's address as the fabric address: that rail carries Ray and the bootstrap, NCCL still all eight.
    other = fabric_role("gpu01", read, H100_SUBNET, "100.126.6.100")
    assert other["interface"] == "ibp64s0" and names(other["rdma_ports"]) == H100_COMPUTE
    assert [item["role"] for item in other["rdma_ports"]][:2] == ["rail", "interface"]


def storage_port_up(doc: dict) -> dict:
    """The fixture with the storage card's InfiniBand port (mlx5_7, ibp170s0f0) cabled: ACTIVE at the compute rails'
    rate, as a host whose storage network runs on InfiniBand has it."""
    doc = copy.deepcopy(doc)
    port = next(rel.rsplit("/", 1)[0] for rel in doc["tree"] if "/infiniband/mlx5_7/ports/1/state" in rel)
    doc["tree"][f"{port}/state"] = "4: ACTIVE\n"
    doc["tree"][f"{port}/phys_state"] = "5: LinkUp\n"
    doc["tree"][f"{port}/rate"] = "400 Gb/sec (4X NDR)\n"
    return doc


def test_a_storage_port_that_serves_another_network_is_no_rail(tmp_path):
    doc = storage_port_up(fixture("h100_storage_hca"))
    addresses = dict(doc["ip_addresses"], ibp170s0f0=["198.51.100.10/24"])
    gpu01 = fabric_role("gpu01", node_read(tmp_path, doc, addresses), H100_SUBNET)
    assert names(gpu01["rdma_ports"]) == H100_COMPUTE
    # Without an address anywhere it cannot be told from a rail, and is taken: fabric_rdma_devices names the rails.
    gpu01 = fabric_role("gpu01", node_read(tmp_path, doc), H100_SUBNET)
    assert "mlx5_7:1" in names(gpu01["rdma_ports"])
    gpu01 = fabric_role("gpu01", node_read(tmp_path, doc), H100_SUBNET, override=H100_COMPUTE)
    assert names(gpu01["rdma_ports"]) == H100_COMPUTE and {item["role"] for item in gpu01["rdma_ports"]} == {"override"}


def test_the_storage_ethernet_port_as_the_fabric_takes_only_itself(tmp_path):
    doc = fixture("h100_storage_hca")
    found = fabric_role("gpu01", node_read(tmp_path, doc), "192.0.2.0/24")
    assert found["interface"] == "enp170s0f1np1" and names(found["rdma_ports"]) == ["mlx5_8:1"]


def test_two_sparks_one_cable_keep_one_port_with_its_twin_and_the_floor_of_one_port(tmp_path):
    infos = []
    for host, address in (("spark1", "192.168.177.11"), ("spark2", "192.168.177.12")):
        doc = fixture("dgx_spark_one_cable")
        infos.append(fabric_role(host, node_read(tmp_path, doc, {"enP2p1s0f1np1": [f"{address}/24"]}), "192.168.177.0/24"))
    assert [names(info["rdma_ports"]) for info in infos] == [["rocep1s0f1:1", "roceP2p1s0f1:1"]] * 2
    expect = collective_expectations(["spark1", "spark2"], infos)
    # The twin is a second PCIe path to the same 200 Gbit/s port: counted once.
    assert expect["192.168.177.11"]["rate_gbps"] == 200.0 and expect["192.168.177.11"]["rails"] == 1
    floors = collective_floor(expect, None, 0.25)
    assert floors == {"floor_gbps": 50.0, "floor": "0.25 x 200 Gbit/s, the slowest fabric rate",
                      "link_floor_gbps": 50.0, "link_floor": "0.25 x 200 Gbit/s, the slowest fabric rate"}


def test_a_spark_with_both_ports_on_the_fabric_subnet_takes_both_with_their_twins(tmp_path):
    doc = fixture("dgx_spark_two_cables")
    # As published, the two ports sit on two subnets (1.1.1.1/24 and 2.2.2.2/24): the other port is no rail.
    found = fabric_role("spark1", node_read(tmp_path, doc), "1.1.1.0/24")
    assert names(found["rdma_ports"]) == ["rocep1s0f0:1", "roceP2p1s0f0:1"]
    # Without an address a RoCE port reaches no one: no rail either.
    found = fabric_role("spark1", node_read(tmp_path, doc, {"enp1s0f0np0": ["1.1.1.1/24"]}), "1.1.1.0/24")
    assert names(found["rdma_ports"]) == ["rocep1s0f0:1", "roceP2p1s0f0:1"]
    # Both ports on one subnet (changed here): the second port is a rail, and its twin comes with it.
    both = {"enp1s0f0np0": ["1.1.1.1/24"], "enP2p1s0f1np1": ["1.1.1.2/24"]}
    found = fabric_role("spark1", node_read(tmp_path, doc, both), "1.1.1.0/24", "1.1.1.1")
    assert [(item["device"], item["role"]) for item in found["rdma_ports"]] == [
        ("rocep1s0f0", "interface"), ("rocep1s0f1", "twin"), ("roceP2p1s0f0", "twin"), ("roceP2p1s0f1", "rail")]
    expect = collective_expectations(["spark1"], [found])
    assert expect["1.1.1.1"]["rate_gbps"] == 400.0 and expect["1.1.1.1"]["rails"] == 2


def test_over_sockets_the_floor_is_the_interfaces_speed():
    # The lab's nodes: veths whose driver reports 10000 Mbit/s (tests/unit/fixtures/facts/lab_node1_network.json).
    network = json.loads((FIXTURES / "facts" / "lab_node1_network.json").read_text())
    iface = next(name for name in network["interfaces"] if (network.get(name.replace("-", "_")) or {}).get("speed"))
    fabric = {"interface": iface, "ip": "10.220.0.11", "transport": "socket", "rdma_ports": []}
    expect = collective_expectations(["node1"], [fabric], [network])
    speed = network[iface.replace("-", "_")]["speed"] / 1000
    assert expect["10.220.0.11"]["rate_gbps"] == speed and expect["10.220.0.11"]["network"] == "Socket"
    assert collective_floor(expect, 0.5, 0.25) == {"floor_gbps": 0.5, "floor": "collective_min_gbps",
                                                   "link_floor_gbps": 0.5, "link_floor": "collective_min_gbps"}
    assert collective_floor({}, None, 0.25)["floor"] == "no floor: no fabric rate known"


@pytest.mark.parametrize("name", ["dgx_spark_one_cable", "dgx_spark_two_cables"])
def test_the_spark_trees_gids_are_what_the_kernel_lists_for_their_addresses(name):
    doc = fixture(name)
    addresses = {netdev: [cidr.split("/")[0] for cidr in cidrs] for netdev, cidrs in doc["ip_addresses"].items()}
    assert with_addresses(doc["tree"], addresses) == doc["tree"]
    assert with_addresses(doc["tree"], {}) != doc["tree"]


def test_nccl_takes_the_roce_v2_gid_of_the_fabric_address_and_a_link_local_one_on_the_twin(tmp_path):
    found = fabric_role("spark2", node_read(tmp_path, fixture("dgx_spark_one_cable")), "192.168.177.0/24")
    said = {item["device"]: (item["gid_index"], item["gid"]) for item in found["rdma_ports"]}
    assert said["roceP2p1s0f1"] == (3, "GID 3 (192.168.177.12, RoCE v2)")
    # The twin holds no address: NCCL stays on index 0, a link-local RoCE v1 GID, which leaves no L2 segment.
    assert said["rocep1s0f1"] == (0, "GID 0 (link-local fe80:0000:0000:0000:fe4c:eaff:fef9:4231, IB/RoCE v1)")
    assert nccl_gids_said(found["rdma_ports"], "spark2") == (
        "spark2: NCCL takes rocep1s0f1 (twin) GID 0 (link-local fe80:0000:0000:0000:fe4c:eaff:fef9:4231, IB/RoCE v1); "
        "roceP2p1s0f1 (interface) GID 3 (192.168.177.12, RoCE v2); a link-local GID reaches the other nodes only within "
        "one L2 segment (a direct cable, one VLAN), never through a router")
    # Without a twin (an H100's InfiniBand rails), nothing to say.
    assert nccl_gids_said([dict(item, role="rail") for item in found["rdma_ports"]], "spark2") == ""


def test_nccl_gid_choice_follows_the_table():
    link_local = [{"index": 0, "gid": "fe80::1", "type": "IB/RoCE v1"}, {"index": 1, "gid": "fe80::1", "type": "RoCE v2"}]
    first = [{"index": 2, "gid": "::ffff:192.0.2.1", "type": "IB/RoCE v1"}, {"index": 3, "gid": "::ffff:192.0.2.1", "type": "RoCE v2"}]
    second = [{"index": 4, "gid": "::ffff:192.0.2.2", "type": "IB/RoCE v1"}, {"index": 5, "gid": "::ffff:192.0.2.2", "type": "RoCE v2"}]
    assert nccl_roce_gid(link_local)["index"] == 0
    assert nccl_roce_gid(link_local + first)["index"] == 3
    # Two addresses: the first one's RoCE v2 GID; the second is never taken.
    assert nccl_roce_gid(link_local + first + second)["index"] == 3
    # RoCE v1 only: an IPv4 GID of v1, and the rule above says why that cannot cross a router.
    assert nccl_roce_gid([link_local[0], first[0]])["index"] == 2
    assert nccl_roce_gid([]) is None


def test_a_fabric_address_nccl_would_not_take_is_refused_before_anything_starts(tmp_path):
    doc = fixture("dgx_spark_one_cable")
    # The port's GID table as recorded (192.168.177.12) while the interface now holds another address: no GID for it.
    read = node_read(tmp_path, doc)
    read["network"] = node_read(tmp_path, doc, {"enP2p1s0f1np1": ["192.168.177.21/24"]})["network"]
    with pytest.raises(AnsibleFilterError, match=r"spark2: RDMA port roceP2p1s0f1:1 \(enP2p1s0f1np1\) has no RoCE v2 GID "
                                                 r"NCCL would take for its fabric address 192\.168\.177\.21: NCCL would "
                                                 r"use GID 3 \(192\.168\.177\.12, RoCE v2\)"):
        fabric_role("spark2", read, "192.168.177.0/24")
    # The fabric address second on the interface: NCCL takes the first address's GID.
    read = node_read(tmp_path, doc, {"enP2p1s0f1np1": ["198.51.100.9/24", "192.168.177.12/24"]})
    with pytest.raises(AnsibleFilterError, match=r"NCCL would use GID 3 \(198\.51\.100\.9, RoCE v2\) \(the port's IPv4 GIDs: "
                                                 r"192\.168\.177\.12, 198\.51\.100\.9\); put the address on enP2p1s0f1np1 "
                                                 r"itself .* and first among its addresses"):
        fabric_role("spark2", read, "192.168.177.0/24")
