"""The supervisor's watch on the fabric while it serves, and its verdict on the collective it runs before a restart
(roles/supervisor/files/gpulab_supervisor.py).

The fabric: a DGX Spark's sysfs tree (tests/unit/fixtures/sysfs, rebuilt from published outputs; SOURCES.md says
from which), with the GIDs of its addresses as the kernel lists them, taken through the fabric role's own filters to
what the deploy hands the supervisor; then the tree is changed on disk as a firmware reset, a cable or a re-address
would change it, and the supervisor's read must name each change. The collective: reports the check printed on a
lent H100 (tests/unit/fixtures/nccl/SOURCES.md), judged by the collective role's filter file loaded as the
supervisor loads it, in a module of its own with no Ansible behind it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types

import pytest

from conftest import FIXTURES, REPO

sys.path.insert(0, str(REPO / "lab"))

from ansible_collections.gpulab.vllm.plugins.filter.fabric import fabric_interface, fabric_rdma  # noqa: E402
from ansible_collections.gpulab.vllm.plugins.module_utils._node import parse_ip_address_json, read_rdma  # noqa: E402
from gpulab_lab.sysfs import materialize, with_addresses  # noqa: E402

SPEC = importlib.util.spec_from_file_location("gpulab_supervisor_fabric", REPO / "roles/supervisor/files/gpulab_supervisor.py")
supervisor = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(supervisor)
supervisor.load_collective((REPO / "plugins" / "filter" / "collective.py").read_text())

SPARK2 = "192.168.177.12"
# The fixture holds no MTU; the site's jumbo frames (what the Spark guides set on the fabric) are written here.
JUMBO = "9000"


def spark2(tmp_path):
    """spark2 with one cable: its tree on disk (as the host's sysfs), and what the deploy hands its supervisor."""
    doc = json.loads((FIXTURES / "sysfs" / "dgx_spark_one_cable.json").read_text())
    addresses = {name: [cidr.split("/")[0] for cidr in cidrs] for name, cidrs in doc["ip_addresses"].items()}
    root = materialize(with_addresses(doc["tree"], addresses), tmp_path / "sys")
    links = [{"ifname": name, "operstate": "UP", "flags": ["UP", "LOWER_UP"], "mtu": int(JUMBO),
              "addr_info": [{"family": "inet", "local": cidr.split("/")[0], "prefixlen": int(cidr.split("/")[1])}
                            for cidr in cidrs]} for name, cidrs in doc["ip_addresses"].items()]
    network = parse_ip_address_json(json.dumps(links))
    found = fabric_interface(network, "192.168.177.0/24", "spark2")
    ports = fabric_rdma(read_rdma(str(root)), found["interface"], "spark2", None, "auto", network, "192.168.177.0/24")
    net = root / "class" / "net" / found["interface"]
    (net / "mtu").write_text(JUMBO + "\n")
    (net / "carrier").write_text("1\n")
    return root, {"interface": found["interface"], "mtu": int(JUMBO), "ports": ports}


def changes(root, watch) -> list:
    """What the supervisor says of the tree on disk now."""
    return supervisor.fabric_changes(watch, supervisor.read_fabric(str(root), watch))


def interface(root, watch, **files) -> None:
    """Write the fabric interface's files (operstate, carrier, mtu) as the kernel would show them; None removes one."""
    for name, text in files.items():
        path = root / "class" / "net" / watch["interface"] / name
        if text is None:
            os.remove(path)
        else:
            path.write_text(text + "\n")


def port_dir(root, name):
    device, port = name.split(":")
    return root / "class" / "infiniband" / device / "ports" / port


def test_a_fabric_as_deployed_shows_no_change_and_reads_as_the_node_read_does(tmp_path):
    root, watch = spark2(tmp_path)
    assert watch["interface"] == "enP2p1s0f1np1"
    assert [(port["device"], port["role"], port["gid_index"]) for port in watch["ports"]] == [
        ("rocep1s0f1", "twin", 0), ("roceP2p1s0f1", "interface", 3)]
    now = supervisor.read_fabric(str(root), watch)
    assert supervisor.fabric_changes(watch, now) == []
    # The supervisor's own small read agrees with the node read's on every watched port.
    rdma = read_rdma(str(root))
    for port in watch["ports"]:
        read = rdma["devices"][port["device"]]["ports"][str(port["port"])]
        mine = now["ports"]["%s:%s" % (port["device"], port["port"])]
        assert mine["state"] == read["state"] == "ACTIVE"
        assert mine["gid"] == next(gid["gid"] for gid in read["gids"] if gid["index"] == port["gid_index"]) == port["gid_value"]


def test_an_mtu_reset_by_a_firmware_reboot_is_named(tmp_path):
    root, watch = spark2(tmp_path)
    interface(root, watch, mtu="1500")
    assert changes(root, watch) == [
        "enP2p1s0f1np1 MTU 1500 (deployed with 9000)"]


def test_a_pulled_cable_is_named_on_the_interface_and_on_both_twins(tmp_path):
    root, watch = spark2(tmp_path)
    interface(root, watch, operstate="down", carrier="0")
    for name in ("rocep1s0f1:1", "roceP2p1s0f1:1"):
        (port_dir(root, name) / "state").write_text("1: DOWN\n")
    assert changes(root, watch) == [
        "enP2p1s0f1np1 link down (operstate down, no carrier)",
        "rocep1s0f1:1 DOWN (deployed ACTIVE)", "roceP2p1s0f1:1 DOWN (deployed ACTIVE)"]


def test_an_interface_taken_down_by_hand_reads_no_carrier(tmp_path):
    # The kernel refuses to read carrier while an interface is administratively down (EINVAL): no file here.
    root, watch = spark2(tmp_path)
    interface(root, watch, operstate="down", carrier=None)
    assert changes(root, watch) == [
        "enP2p1s0f1np1 link down (operstate down, no carrier)"]


def test_a_driver_that_reports_unknown_is_up_while_it_has_a_carrier(tmp_path):
    root, watch = spark2(tmp_path)
    interface(root, watch, operstate="unknown")
    assert changes(root, watch) == []
    interface(root, watch, carrier="0")
    assert changes(root, watch) == [
        "enP2p1s0f1np1 link down (operstate unknown, no carrier)"]


def test_a_readdressed_port_loses_the_gid_nccl_took(tmp_path):
    root, watch = spark2(tmp_path)
    gids = port_dir(root, "roceP2p1s0f1:1") / "gids"
    deployed = (gids / "3").read_text().strip()
    assert deployed.endswith("c0a8:b10c")  # 192.168.177.12
    # Another address on the interface: the kernel lists its GID at the same index.
    (gids / "3").write_text("0000:0000:0000:0000:0000:ffff:c0a8:b163\n")
    assert changes(root, watch) == [
        "roceP2p1s0f1:1 GID 3 is now 0000:0000:0000:0000:0000:ffff:c0a8:b163 (deployed %s, the GID NCCL takes)" % deployed]
    # The address removed: the index is empty (zeros).
    (gids / "3").write_text(supervisor.ZERO_GID + "\n")
    assert changes(root, watch) == [
        "roceP2p1s0f1:1 has no GID 3 any more (deployed %s, the GID NCCL takes)" % deployed]


def test_a_gid_left_as_roce_v1_is_named(tmp_path):
    root, watch = spark2(tmp_path)
    (port_dir(root, "roceP2p1s0f1:1") / "gid_attrs" / "types" / "3").write_text("IB/RoCE v1\n")
    assert changes(root, watch) == [
        "roceP2p1s0f1:1 GID 3 is IB/RoCE v1 now (deployed RoCE v2)"]


def test_a_vanished_interface_or_hca_is_named(tmp_path):
    root, watch = spark2(tmp_path)
    device = os.path.realpath(root / "class" / "infiniband" / "rocep1s0f1")
    os.remove(root / "class" / "infiniband" / "rocep1s0f1")
    assert changes(root, watch) == [
        "rocep1s0f1:1 is gone (no such RDMA port)"]
    assert os.path.isdir(device)
    os.remove(root / "class" / "net" / watch["interface"])
    assert changes(root, watch) == [
        "enP2p1s0f1np1 is gone (no such interface)"]


def test_over_sockets_only_the_interface_is_watched(tmp_path):
    root, watch = spark2(tmp_path)
    sockets = {"interface": watch["interface"], "mtu": int(JUMBO), "ports": []}
    for name in ("rocep1s0f1:1", "roceP2p1s0f1:1"):
        (port_dir(root, name) / "state").write_text("1: DOWN\n")
    assert changes(root, sockets) == []


# --- the collective before a restart -----------------------------------------------------------------------------

H100_EXPECT = {"127.0.0.1": {"host": "h100", "network": "Socket", "interface": "eth0", "ports": []}}


def report(name: str) -> dict:
    return json.loads((FIXTURES / "nccl" / name).read_text())


def check(floor: float = 1.0) -> dict:
    return {"expect": H100_EXPECT, "run": {"world": 2, "size_mb": 64, "iterations": 5, "timeout": 60},
            "floors": {"floor_gbps": floor, "floor": "collective_min_gbps", "link_floor_gbps": floor, "link_floor": "collective_min_gbps"}}


def test_the_collective_rule_loads_without_ansible():
    # As in the Ray image: the filter file in a module of its own, no ansible_collections package importable.
    alone = types.ModuleType("alone")
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] in ("ansible", "ansible_collections")}
    try:
        for name in saved:
            sys.modules[name] = None  # an import of any of them now fails
        exec(compile((REPO / "plugins" / "filter" / "collective.py").read_text(), "collective_rule.py", "exec"), alone.__dict__)  # pylint: disable=exec-used
    finally:
        sys.modules.update(saved)
    assert alone.collective_problems(report("h100_2ranks_as_hosts_report.json"), H100_EXPECT) == []


def test_a_recorded_collective_passes_and_says_what_it_showed():
    out = "NCCL INFO some line\n" + json.dumps(report("h100_2ranks_as_hosts_report.json")) + "\nRay: shutting down\n"
    ok, said = supervisor.judge_collective(supervisor.last_json(out), check())
    assert ok
    assert said == "nccl all-reduce over 2 ranks: 14.767 Gbit/s (floor 1.0); links to the head: 127.0.0.1 18.927 Gbit/s"


def test_a_collective_under_its_floor_fails_with_the_rule_of_the_deploy():
    ok, said = supervisor.judge_collective(report("h100_2ranks_as_hosts_report.json"), check(floor=50.0))
    assert not ok
    assert said.startswith("h100 (127.0.0.1): its link to the head carried 18.927 Gbit/s; floor 50.0 Gbit/s (collective_min_gbps)")
    # Every link above the floor, the all-reduce under it: the all-reduce is named.
    ok, said = supervisor.judge_collective(report("h100_2ranks_as_hosts_report.json"),
                                           dict(check(), floors={"floor_gbps": 15.0, "floor": "collective_min_gbps",
                                                                 "link_floor_gbps": 1.0, "link_floor": "collective_min_gbps"}))
    assert not ok
    assert said.startswith("the all-reduce reached 14.767 Gbit/s of bus bandwidth with every link above the floor; floor 15.0")


def test_a_collective_that_did_not_run_names_its_error_and_the_late_nodes():
    found = {"error": "rank 1 did not start within 60 s", "late_nodes": ["10.220.0.12"], "nodes": []}
    assert supervisor.judge_collective(found, check()) == (False, "rank 1 did not start within 60 s (late: 10.220.0.12)")
    assert supervisor.judge_collective(supervisor.last_json("Traceback ...\nno json here"), check()) == (
        False, "the check did not report")


@pytest.mark.parametrize("text, found", [("{\"a\": 1}\n", {"a": 1}), ("{broken\n{\"b\": 2}\n", {"b": 2}), ("", None)])
def test_the_last_json_line_is_the_report(text, found):
    assert supervisor.last_json(text) == found
