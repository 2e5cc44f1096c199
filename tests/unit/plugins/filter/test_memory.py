"""The memory rule of unified-memory nodes, on the node read's own parsing of tests/unit/fixtures/memory/.

Only debian12_vm_no_gpu_meminfo.txt there is a recording; the GB10 files are written by hand from published
output (tests/unit/fixtures/memory/SOURCES.md says from where). The GB10 figures below that differ from the
published idle node (MemAvailable after a copy, the lab's containers) are set by each test, which says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpulab.vllm.plugins.filter.memory import GIB, deployed_here, memory_budget, memory_problem
from ansible_collections.gpulab.vllm.plugins.module_utils._node import node_memory, parse_gpu_query, parse_meminfo

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "memory"
SETTING = "vllm_server_gpu_memory_utilization (qwen35_gpu_memory_utilization for deploy_qwen35)"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def gb10(available_gib=None) -> dict:
    """A GB10 node as the node read reports it; MemAvailable replaced when a test gives one."""
    memory = node_memory(text("gb10_meminfo.txt"), parse_gpu_query(text("gb10_query_gpu.csv")))
    if available_gib is not None:
        memory["available"] = int(available_gib * GIB)
    return {"memory": memory, "containers": {}}


def test_meminfo_is_read_in_bytes_and_a_field_the_kernel_did_not_print_is_none():
    recorded = parse_meminfo(text("debian12_vm_no_gpu_meminfo.txt"))
    assert recorded["total"] == 24683784 * 1024
    assert recorded["available"] == 22805324 * 1024
    assert recorded["cached"] == 8815632 * 1024
    assert 0 < recorded["free"] < recorded["available"] < recorded["total"]
    published = parse_meminfo(text("gb10_meminfo.txt"))
    assert (published["total"], published["available"]) == (127600748 * 1024, 118566368 * 1024)
    assert published["cached"] is None and published["free"] is None


def test_gb10_is_unified_an_h200_is_not_and_a_node_without_nvidia_smi_is_not():
    assert parse_gpu_query(text("gb10_query_gpu.csv")) == [{"name": "NVIDIA GB10", "memory_total_mib": None}]
    assert parse_gpu_query(text("h200_query_gpu.csv")) == [{"name": "NVIDIA H200", "memory_total_mib": 143771}]
    meminfo = text("debian12_vm_no_gpu_meminfo.txt")
    spark = node_memory(meminfo, parse_gpu_query(text("gb10_query_gpu.csv")))
    h200 = node_memory(meminfo, parse_gpu_query(text("h200_query_gpu.csv")))
    bare = node_memory(meminfo, None)
    assert (spark["unified"], spark["unified_from"]) == (True, "nvidia-smi")
    assert (h200["unified"], h200["unified_from"]) == (False, "nvidia-smi")
    assert (bare["unified"], bare["unified_from"]) == (False, "no nvidia-smi")
    # A setting overrides what nvidia-smi says, either way.
    assert node_memory(meminfo, None, "true")["unified"] is True
    assert node_memory(meminfo, parse_gpu_query(text("gb10_query_gpu.csv")), "false")["unified"] is False
    assert node_memory(meminfo, None, True)["unified_from"] == "setting"


def test_the_rule_stays_out_of_nodes_that_are_not_unified():
    meminfo = text("debian12_vm_no_gpu_meminfo.txt")
    for gpus in (None, parse_gpu_query(text("h200_query_gpu.csv"))):
        node = {"memory": node_memory(meminfo, gpus), "containers": {}}
        assert memory_budget(node, 0.99, head=True) == {"applies": False}
        assert memory_problem(node, "node1", 0.99, head=True) == ""
    assert memory_problem({}, "node1", 0.99, head=True) == ""


def test_the_published_idle_spark_fits_the_head_at_0_80_and_the_budget_adds_up():
    budget = memory_budget(gb10(), 0.80, head=True)
    total = 127600748 * 1024
    assert budget["applies"] and budget["total"] == total
    assert budget["server"] == pytest.approx(0.80 * total)
    assert budget["overhead"] == 7 * GIB and budget["margin"] == 4 * GIB
    assert budget["needed"] == pytest.approx(0.80 * total + 11 * GIB)
    # 113.07 GiB available: (113.07 - 7 - 4) / 121.69 = 0.838...
    assert budget["max_utilization"] == 0.83
    assert memory_problem(gb10(), "spark1", 0.80, head=True, setting=SETTING) == ""


def test_a_spark_with_101_gib_available_is_refused_at_0_80_with_both_numbers_and_the_value_that_fits():
    # 101 GiB: what users report available on a Spark at boot (set here; not a recording).
    line = memory_problem(gb10(101), "spark1", 0.80, head=True, setting=SETTING)
    assert line.startswith("spark1: unified memory"), line
    assert "the server would take 97.4 GiB (0.80 x 121.7 GiB)" in line
    assert "108.4 GiB in all" in line and "101.0 GiB available (MemAvailable)" in line
    # (101 - 11) / 121.69 = 0.7396: two decimals, rounded down.
    assert "lower " + SETTING + " to 0.73 or less" in line
    assert "\n" not in line
    # The value it names fits, and the one above it does not.
    assert memory_problem(gb10(101), "spark1", 0.73, head=True) == ""
    assert memory_problem(gb10(101), "spark1", 0.74, head=True) != ""


def test_a_worker_counts_no_head_processes():
    # 101 GiB available (set): the head's 4 GiB more is what the worker does not need.
    worker = memory_budget(gb10(101), 0.80, head=False)
    assert worker["overhead"] == 3 * GIB and worker["max_utilization"] == 0.77
    assert memory_problem(gb10(101), "spark2", 0.76, head=False) == ""
    assert "Ray and the CUDA context about 3.0 GiB" in memory_problem(gb10(101), "spark2", 0.80, head=False)


def test_no_utilization_given_is_vllms_default_0_9_and_a_node_too_full_for_any_value_says_so():
    line = memory_problem(gb10(101), "spark1", None, head=True)
    assert "(0.90 (vLLM's default) x 121.7 GiB)" in line
    assert memory_problem(gb10(101), "spark1", "None", head=True) == line
    # 10 GiB available (set): less than the overhead and the margin alone.
    assert "vllm_server_gpu_memory_utilization cannot fit here at any value" in memory_problem(gb10(10), "spark1", 0.5, head=True)


def test_a_node_where_the_deployment_already_runs_is_not_judged_again():
    # The re-run of a serving cluster: the Ray container holds the rank's memory, which is then not available.
    node = dict(gb10(20), containers={"gpulab-ray-head": {"running": True, "role": "ray-head"},
                                      "gpulab-supervisor": {"running": True, "role": "supervisor"}})
    assert deployed_here(node)
    assert memory_problem(node, "spark1", 0.80, head=True) == ""
    stopped = dict(gb10(20), containers={"gpulab-ray-head": {"running": False, "role": "ray-head"},
                                         "gpulab-supervisor": {"running": True, "role": "supervisor"}})
    assert not deployed_here(stopped)
    assert memory_problem(stopped, "spark1", 0.80, head=True) != ""
