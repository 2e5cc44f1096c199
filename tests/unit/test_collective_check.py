"""The collective check's reading of NCCL's log and its summary, on logs NCCL wrote on a real GPU host
(tests/unit/fixtures/nccl: one H200, two ranks given other host IDs so that NCCL took its network plugin)."""

from __future__ import annotations

import importlib.util

from conftest import FIXTURES, REPO

SPEC = importlib.util.spec_from_file_location("collective_check", REPO / "roles/collective/files/collective_check.py")
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)


def log(name: str) -> str:
    return (FIXTURES / "nccl" / f"{name}.log").read_text()


def test_two_ranks_over_the_socket_plugin():
    for rank in (0, 1):
        found = check.parse_nccl_log(log(f"h200_2ranks_as_hosts_socket_rank{rank}"))
        # IB found no device, so NCCL fell back to sockets: the devices are the socket plugin's, not IB's "[RO]".
        assert found == {"network": "Socket", "devices": ["eth0:192.0.2.2<0>"], "transports": ["NET/Socket"]}


def test_one_rank_has_no_channels():
    found = check.parse_nccl_log(log("h200_1rank_rank0"))
    assert found["network"] == "Socket" and found["transports"] == []


def test_an_empty_log_reports_nothing():
    assert check.parse_nccl_log("") == {"network": None, "devices": [], "transports": []}


def test_ranks_are_ordered_as_vllm_orders_them():
    infos = [{"ip": "10.220.0.12"}, {"ip": "10.220.0.11"}, {"ip": "10.220.0.13"}, {"ip": "10.220.0.11"}]
    assert check.order_ranks(infos, "10.220.0.11") == [1, 3, 0, 2]


def test_summary_names_each_node_with_its_link():
    nccl = check.parse_nccl_log(log("h200_2ranks_as_hosts_socket_rank0"))
    results = [
        {"rank": 0, "join_s": 0.1, "allreduce_s": 0.0368, "busbw_gbps": 14.57, "links_gbps": {"1": 20.2}, "nccl": nccl},
        {"rank": 1, "join_s": 0.4, "allreduce_s": 0.0367, "busbw_gbps": 14.59, "links_gbps": {"1": 20.1}, "nccl": nccl},
    ]
    infos = [{"ip": "10.220.0.11"}, {"ip": "10.220.0.12"}]
    summary = check.summarize("nccl", 2, 64 << 20, 5, infos, results, 0.0)
    assert summary["busbw_gbps"] == 14.57 and summary["error"] is None
    assert [(node["ip"], node["ranks"], node["network"], node["link_gbps"]) for node in summary["nodes"]] == [
        ("10.220.0.11", [0], "Socket", None), ("10.220.0.12", [1], "Socket", 20.2)]
