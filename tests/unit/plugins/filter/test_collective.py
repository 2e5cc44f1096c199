"""The collective's verdict on what NCCL took, on NCCL logs of real hosts (tests/unit/fixtures/nccl: an H200 recorded
here over sockets, two DGX H100 hosts over RoCE from a public post), and on the floor the lab's throttled node meets."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from conftest import FIXTURES, REPO
from ansible_collections.gpulab.vllm.plugins.filter.collective import collective_problems, nccl_port

SPEC = importlib.util.spec_from_file_location("collective_check", REPO / "roles/collective/files/collective_check.py")
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)

HOSTS = {"11.1.128.128": "dgxh100-3", "11.1.128.136": "dgxh100-4"}
LAB = {"10.220.0.11": {"host": "node1", "network": "Socket", "interface": "enp1s0f0np0", "ports": []},
       "10.220.0.12": {"host": "node2", "network": "Socket", "interface": "enP2p1s0f1np1", "ports": []}}


def node(ip: str, log: str, link=None) -> dict:
    """A node of the check's report as summarize() builds it from a rank's NCCL log."""
    found = check.parse_nccl_log((FIXTURES / "nccl" / f"{log}.log").read_text())
    return {"ip": ip, "ranks": [0], "network": found["network"], "devices": sorted(found["devices"]),
            "transports": found["transports"], "link_gbps": link}


def roce_report(**extra) -> dict:
    report = {"backend": "nccl", "busbw_gbps": 180.0, "floor_gbps": 0.0, "floor": "no floor", "nccl_ranks": [],
              "nodes": [node("11.1.128.128", "public_dgxh100_roce_host3"),
                        node("11.1.128.136", "public_dgxh100_roce_host4", link=190.0)]}
    report.update(extra)
    return report


def rdma_expect(ports) -> dict:
    """What the fabric role promises each node: its RDMA ports as fabric_rdma lists them."""
    return {ip: {"host": host, "network": "IB", "interface": "enp220s0np0",
                 "ports": [{"device": device, "port": 1, "role": role} for device, role in ports]}
            for ip, host in HOSTS.items()}


def test_nccl_names_devices_as_the_fabric_does():
    assert nccl_port("mlx5_10:1/RoCE") == "mlx5_10:1"
    assert nccl_port("mlx5_0:1/IB") == "mlx5_0:1"
    assert nccl_port("eth0:192.0.2.2<0>") == "eth0"
    assert nccl_port("rocep1s0f1:1/RoCE") == "rocep1s0f1:1"


def test_both_hcas_taken_where_both_are_the_fabric_passes():
    assert collective_problems(roce_report(), rdma_expect([("mlx5_10", "interface"), ("mlx5_11", "rail")])) == []


def test_a_port_of_the_fabric_left_out_is_named_with_its_role():
    expect = rdma_expect([("mlx5_10", "interface"), ("mlx5_11", "rail"), ("mlx5_12", "rail")])
    problems = collective_problems(roce_report(), expect)
    assert len(problems) == 2
    assert problems[0].startswith("dgxh100-3 (11.1.128.128): NCCL's IB plugin left out mlx5_12:1 (rail); the fabric's "
                                  "ports are mlx5_10:1, mlx5_11:1, mlx5_12:1: NCCL_IB_HCA in the Ray containers' "
                                  "environment must name exactly these")


def test_a_device_beyond_the_fabric_is_named():
    problems = collective_problems(roce_report(), rdma_expect([("mlx5_10", "interface")]))
    assert [problem.split(":", 1)[0] for problem in problems] == ["dgxh100-3 (11.1.128.128)", "dgxh100-4 (11.1.128.136)"]
    assert "NCCL's IB plugin took mlx5_11:1, which is not the fabric's (a storage HCA or another rail); the fabric's " \
           "ports are mlx5_10:1:" in problems[1]


def test_an_external_rdma_plugin_is_judged_by_its_devices():
    # NVIDIA's SHARP plugin names its network IBext_v8 (a name given here, not recorded): RDMA all the same.
    report = roce_report()
    for item in report["nodes"]:
        item["network"] = "IBext_v8"
    assert collective_problems(report, rdma_expect([("mlx5_10", "interface"), ("mlx5_11", "rail")])) == []
    problems = collective_problems(report, rdma_expect([("mlx5_10", "interface")]))
    assert problems and "NCCL's IBext_v8 plugin took mlx5_11:1" in problems[0]


def test_sockets_where_rdma_was_expected():
    report = roce_report(nodes=[node("11.1.128.128", "h200_2ranks_as_hosts_socket_rank0")])
    problems = collective_problems(report, rdma_expect([("mlx5_10", "interface"), ("mlx5_11", "rail")]))
    assert problems == ["dgxh100-3 (11.1.128.128): NCCL took NET/Socket where RDMA through mlx5_10:1, mlx5_11:1 was "
                        "expected: check that the container has /dev/infiniband, the image libibverbs and the mlx5 "
                        "provider, and NCCL_IB_HCA"]


def test_rdma_where_sockets_were_expected():
    expect = {ip: {"host": host, "network": "Socket", "interface": "enp220s0np0", "ports": []} for ip, host in HOSTS.items()}
    problems = collective_problems(roce_report(), expect)
    assert problems[0] == ("dgxh100-3 (11.1.128.128): NCCL took NET/IB where TCP on enp220s0np0 was expected: "
                           "NCCL_IB_DISABLE and NCCL_SOCKET_IFNAME are not what the fabric role set")


@pytest.mark.parametrize("interface, problems", [
    ("eth0", []),
    ("enp1s0", ["host (192.0.2.2): NCCL's sockets are on eth0, not on the fabric interface enp1s0: NCCL_SOCKET_IFNAME "
                "is not what the fabric role set"]),
])
def test_sockets_on_the_fabric_interface(interface, problems):
    report = {"backend": "nccl", "floor_gbps": 0.0, "nodes": [node("192.0.2.2", "h200_2ranks_as_hosts_socket_rank1")]}
    expect = {"192.0.2.2": {"host": "host", "network": "Socket", "interface": interface, "ports": []}}
    assert collective_problems(report, expect) == problems


def test_gloo_is_held_to_the_floor_alone():
    # The lab: Gloo over TCP. What NCCL would take does not apply; the floor does, in the words the lab test reads.
    report = {"backend": "gloo", "busbw_gbps": 3.1, "floor_gbps": 0.5, "floor": "collective_min_gbps",
              "nodes": [{"ip": "10.220.0.11", "network": "TCP", "devices": ["gpulab0"], "link_gbps": None},
                        {"ip": "10.220.0.12", "network": "TCP", "devices": ["gpulab0"], "link_gbps": 0.123}]}
    expect = {"10.220.0.11": {"host": "node1", "network": "IB", "ports": []},
              "10.220.0.12": {"host": "node2", "network": "IB", "ports": []}}
    problems = collective_problems(report, expect)
    assert len(problems) == 1
    assert re.search(r"node2 \(10\.220\.0\.12\): its link to the head carried [\d.]+ Gbit/s; floor 0\.5 Gbit/s",
                     problems[0])
    report["nodes"][1]["link_gbps"] = 2.0
    assert collective_problems(report, expect) == []
    report["busbw_gbps"] = 0.2
    assert collective_problems(report, expect) == [
        "the all-reduce reached 0.2 Gbit/s of bus bandwidth with every link above the floor; floor 0.5 Gbit/s "
        "(collective_min_gbps): check the link's speed and errors (ethtool, ibstat), the MTU on both ends, a throttled "
        "or shared port (tc qdisc), or lower collective_min_gbps if this fabric is slower on purpose"]


def seed_reports() -> dict:
    return json.loads((FIXTURES / "nccl" / "seed_image_rank_reports.json").read_text())["reports"]


def ranks_on_two_nodes() -> list:
    """Two ranks as summarize() lists them, each with a report recorded in the seed image's containers."""
    reports = seed_reports()
    return [dict(reports["node1_env"]["library"], rank=0, ip="10.220.0.11", inherited=reports["node1_env"]["inherited"]),
            dict(reports["node2_env_and_etc_nccl_conf"]["library"], rank=1, ip="10.220.0.12",
                 inherited=reports["node2_env_and_etc_nccl_conf"]["inherited"])]


def test_the_mapped_libnccl_of_a_recorded_process():
    report = seed_reports()["node1_env"]
    found = check.loaded_nccl("\n".join(report["maps_nccl_lines"]), "2.27.5")
    # The library lives in the image, not here: its path and version as recorded, its digest said to be unreadable.
    assert found == dict(report["library"], sha256="unreadable (No such file or directory)")


def test_one_build_on_every_rank_passes_whatever_each_inherited():
    # The two nodes' environments differ (their fabric interfaces) and one has an /etc/nccl.conf: reported, not judged.
    report = {"backend": "nccl", "floor_gbps": 0.0, "nodes": [], "nccl_ranks": ranks_on_two_nodes()}
    assert collective_problems(report, LAB) == []


def two_builds(first: str, second: str) -> str:
    """The problem that names two NCCL builds, each as 'ranks on nodes: path, version, digest'."""
    return ("the ranks load 2 different NCCL builds (%s; %s): every rank must load one build, as two builds of one "
            "version have hung a serve mid-run; run the same image on every node and check LD_LIBRARY_PATH and LD_PRELOAD "
            "in the Ray containers of the node that differs" % (first, second))


def test_ranks_on_two_builds_fail_naming_both():
    ranks = ranks_on_two_nodes()
    # Seeded here: rank 1 loads another build of the same version from another folder (a digest changed by hand).
    ranks[1].update(path="/usr/lib/x86_64-linux-gnu/libnccl.so.2", sha256="f" * 64)
    problems = collective_problems({"backend": "nccl", "floor_gbps": 0.0, "nodes": [], "nccl_ranks": ranks}, LAB)
    assert problems == [two_builds(
        "rank 0 on node1 (10.220.0.11): /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2, NCCL 2.27.5, "
        "sha256 1d9c10322efa",
        "rank 1 on node2 (10.220.0.12): /usr/lib/x86_64-linux-gnu/libnccl.so.2, NCCL 2.27.5, sha256 ffffffffffff")]


def test_the_summary_lists_each_ranks_build():
    reports = seed_reports()
    nccl = dict(check.parse_nccl_log((FIXTURES / "nccl" / "h200_2ranks_as_hosts_socket_rank0.log").read_text()),
                library=reports["node1_env"]["library"], inherited=reports["node1_env"]["inherited"])
    results = [{"rank": rank, "join_s": 0.1, "allreduce_s": 0.03, "busbw_gbps": 14.5, "links_gbps": {"1": 20.0},
                "nccl": nccl} for rank in (0, 1)]
    summary = check.summarize("nccl", 2, 64 << 20, 5, [{"ip": "10.220.0.11"}, {"ip": "10.220.0.12"}], results, 0.0)
    assert [(rank["rank"], rank["ip"], rank["version"], rank["inherited"]["env"]["NCCL_IB_DISABLE"])
            for rank in summary["nccl_ranks"]] == [(0, "10.220.0.11", "2.27.5", "1"), (1, "10.220.0.12", "2.27.5", "1")]
    assert check.summarize("gloo", 2, 64 << 20, 5, [{"ip": "10.220.0.11"}, {"ip": "10.220.0.12"}],
                           [dict(result, nccl=None) for result in results], 0.0)["nccl_ranks"] == []


def h100_report(name: str) -> dict:
    """A report the check printed on a lent H100 (tests/unit/fixtures/nccl/SOURCES.md): two ranks on its one GPU as
    two hosts, both at 127.0.0.1, over NCCL's socket plugin on eth0."""
    return json.loads((FIXTURES / "nccl" / name).read_text())


H100_EXPECT = {"127.0.0.1": {"host": "h100", "network": "Socket", "interface": "eth0", "ports": []}}
H100_TORCH_NCCL = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"


def test_an_h100_report_of_one_build_passes():
    report = h100_report("h100_2ranks_as_hosts_report.json")
    assert collective_problems(report, H100_EXPECT) == []
    assert collective_problems(report, dict(H100_EXPECT, **{"127.0.0.1": dict(H100_EXPECT["127.0.0.1"], network="IB")}))[
        0].startswith("h100 (127.0.0.1): NCCL took NET/Socket where RDMA through  was expected")


def test_one_build_preloaded_from_another_path_is_one_build():
    # Recorded: rank 1 ran with LD_PRELOAD of a byte-for-byte copy of PyTorch's libnccl; it mapped both files, so its
    # report lists two paths and two (equal) digests. One build: the all-reduce ran, and the verdict must pass.
    report = h100_report("h100_preload_same_build_other_path_report.json")
    ranks = report["nccl_ranks"]
    assert report["error"] is None and report["busbw_gbps"] > 1
    assert [rank["path"] for rank in ranks] == [H100_TORCH_NCCL, H100_TORCH_NCCL + ", /tmp/copy/libnccl.so.2"]
    assert ranks[1]["sha256"] == ":".join([ranks[0]["sha256"]] * 2)
    assert collective_problems(report, H100_EXPECT) == []


def test_another_build_preloaded_on_an_h100():
    # Recorded: rank 1 with LD_PRELOAD of the image's NCCL 2.28.3 beside PyTorch's 2.28.9. NCCL itself refused at the
    # first all-reduce, on both ranks, before the check could report: each rank's entry holds the error and its maps.
    recorded = h100_report("h100_preload_other_build_ranks.json")
    assert "nccl_ranks" not in recorded and [rank["rank"] for rank in recorded["ranks"]] == [0, 1]
    assert [rank["error"].splitlines()[-1] for rank in recorded["ranks"]] == [
        "Mismatched NCCL version detected : rank 1 version 22803 rank 0 version 22809",
        "Mismatched NCCL version detected : rank 0 version 22809 rank 1 version 22803"]
    # The NCCL each rank ran, in the words of PyTorch's error: the preloaded build won in rank 1.
    versions = [re.search(r"NCCL version (\S+)", rank["error"]).group(1) for rank in recorded["ranks"]]
    assert versions == ["2.28.9", "2.28.3"]
    found = [check.loaded_nccl("".join(rank["maps_nccl"]), version) for rank, version in zip(recorded["ranks"], versions)]
    assert [item["path"] for item in found] == [
        H100_TORCH_NCCL, H100_TORCH_NCCL + ", /usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"]
    # Off the machine the files cannot be read: the ranks are told apart by path and version, and both are named.
    ranks = [dict(item, rank=index, ip="127.0.0.1", inherited={"env": {}, "conf": {}}) for index, item in enumerate(found)]
    for rank in ranks:
        rank["sha256"] = "unreadable (No such file or directory)"
    problems = collective_problems({"backend": "nccl", "floor_gbps": 0.0, "nodes": [], "nccl_ranks": ranks}, H100_EXPECT)
    assert problems == [two_builds(
        "rank 0 on h100 (127.0.0.1): %s, NCCL 2.28.9, sha256 unreadable (" % H100_TORCH_NCCL,
        "rank 1 on h100 (127.0.0.1): %s, /usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3, NCCL 2.28.3, sha256 unreadable ("
        % H100_TORCH_NCCL)]
    # With the digests sha256sum gave for those files on the machine (as loaded_nccl joins them), by digest.
    digests = {path: digest for digest, path in (line.split() for line in (
        FIXTURES / "nccl" / "h100_libnccl_files_sha256.txt").read_text().splitlines())}
    for rank in ranks:
        rank["sha256"] = ":".join(digests[path] for path in rank["path"].split(", "))
    problems = collective_problems({"backend": "nccl", "floor_gbps": 0.0, "nodes": [], "nccl_ranks": ranks}, H100_EXPECT)
    assert len(problems) == 1 and "sha256 1c8618b86673; rank 1" in problems[0]
    assert "libnccl.so.2.28.3, NCCL 2.28.3, sha256 1c8618b86673:2db3d5f54a7f)" in problems[0]
