"""The memory guard of unified-memory nodes (roles/vllm_server/files/gpulab_memory_guard.py), run as the deploy runs it
(a process with `watch`, then `finish`) on a folder standing for /proc: the recorded meminfo of this machine (its
MemAvailable under the floors the test gives) and the recorded command line of a lab rank (tests/unit/fixtures/memory/
SOURCES.md); then what the deploy says of each verdict (plugins/filter/memory.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

from conftest import FIXTURES, REPO
from ansible_collections.gpulab.vllm.plugins.filter.memory import memory_guard_nodes, memory_guard_said

SCRIPT = REPO / "roles" / "vllm_server" / "files" / "gpulab_memory_guard.py"
SPEC = importlib.util.spec_from_file_location("gpulab_memory_guard", SCRIPT)
guard = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(guard)

MEMINFO = (FIXTURES / "memory" / "debian12_vm_no_gpu_meminfo.txt").read_text()
AVAILABLE = 22805324 * 1024  # MemAvailable of that file
RANK = (FIXTURES / "memory" / "lab_rank_cmdline.bin").read_bytes()


def test_mem_available_as_the_kernel_writes_it():
    assert guard.mem_available(MEMINFO) == AVAILABLE
    assert guard.mem_available((FIXTURES / "memory" / "gb10_meminfo.txt").read_text()) == 118566368 * 1024
    assert guard.mem_available("MemTotal: 1 kB\n") is None


def test_the_cache_is_dropped_once_before_anything_is_stopped():
    gib = guard.GIB
    assert guard.decide(10 * gib, 8 * gib, 3 * gib, False) == ""
    assert guard.decide(7 * gib, 8 * gib, 3 * gib, False) == "drop"
    assert guard.decide(7 * gib, 8 * gib, 3 * gib, True) == ""
    assert guard.decide(2 * gib, 8 * gib, 3 * gib, False) == "drop"
    assert guard.decide(2 * gib, 8 * gib, 3 * gib, True) == "stop"
    assert guard.decide(None, 8 * gib, 3 * gib, True) == ""


def proc_tree(tmp_path, rank: bool):
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "cmdline").write_bytes(b"/sbin/init\x00")
    if rank:
        (proc / "4242").mkdir()
        (proc / "4242" / "cmdline").write_bytes(RANK)
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "drop_caches").write_text("")
    return proc


def run_guard(tmp_path, rank: bool, drop_gib: float, stop_gib: float, settle: float = 1.5) -> dict:
    proc = proc_tree(tmp_path, rank)
    state = tmp_path / "state"
    common = ["--state", str(state)]
    watcher = subprocess.Popen([sys.executable, str(SCRIPT), "watch", *common, "--drop-gib", str(drop_gib),
                                "--stop-gib", str(stop_gib), "--seconds", "30", "--interval", "0.05",
                                "--containers", "gpulab-memory-guard-test-none", "--proc", str(proc),
                                "--meminfo", str(tmp_path / "meminfo"), "--drop-caches", str(tmp_path / "drop_caches")])
    try:
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and watcher.poll() is None:
            time.sleep(0.05)
        said = subprocess.run([sys.executable, str(SCRIPT), "finish", *common], capture_output=True, text=True,
                              check=True).stdout
        watcher.wait(timeout=10)
    finally:
        watcher.kill()
    return json.loads(said)


def test_a_load_under_both_floors_is_stopped_after_one_drop(tmp_path):
    floor = AVAILABLE / guard.GIB + 1  # the recorded MemAvailable is under both floors
    verdict = run_guard(tmp_path, rank=True, drop_gib=floor, stop_gib=floor)
    assert verdict["ended"] == "stopped" and verdict["armed"]
    assert verdict["dropped"]["before_bytes"] == AVAILABLE and verdict["dropped"]["error"] == ""
    assert (tmp_path / "drop_caches").read_text() == "1\n"
    assert verdict["stopped"]["available_bytes"] == AVAILABLE
    # No such container here: nothing killed, and said so.
    assert verdict["stopped"]["containers"] == []
    said = memory_guard_said(["node2"], [json.dumps(verdict)])
    assert said["seen"] == [] and len(said["stopped"]) == 1
    assert said["stopped"][0].startswith(
        f"node2: the memory guard stopped the load at 21.7 GiB available (MemAvailable), under its floor of "
        f"{floor:.1f} GiB (vllm_server_memory_stop_gib), the page cache dropped once at 21.7 GiB (21.7 GiB after), "
        f"killing nothing it could find: the model's ranks would have taken more than the node has")
    assert "lower vllm_server_gpu_memory_utilization" in said["stopped"][0]


def test_a_load_above_the_floors_is_left_alone_and_said(tmp_path):
    verdict = run_guard(tmp_path, rank=True, drop_gib=8, stop_gib=3, settle=0.5)
    assert verdict["ended"] == "finished" and verdict["dropped"] is None and verdict["stopped"] is None
    assert (tmp_path / "drop_caches").read_text() == ""
    assert memory_guard_said(["node2"], [json.dumps(verdict)]) == {"stopped": [], "seen": [
        "node2: memory held while the model loaded: at least 21.7 GiB available (floors: 8.0 GiB to drop the page "
        "cache, 3.0 GiB to stop)"]}


def test_nothing_is_done_before_a_rank_runs_on_the_node(tmp_path):
    floor = AVAILABLE / guard.GIB + 1
    verdict = run_guard(tmp_path, rank=False, drop_gib=floor, stop_gib=floor, settle=0.5)
    assert verdict["ended"] == "finished" and verdict["armed"] is None and verdict["dropped"] is None
    assert (tmp_path / "drop_caches").read_text() == ""
    assert memory_guard_said(["node2"], [json.dumps(verdict)])["seen"] == [
        "node2: no rank of the model ran while the memory guard watched"]


def test_finish_without_a_watch_says_so(tmp_path):
    said = subprocess.run([sys.executable, str(SCRIPT), "finish", "--state", str(tmp_path)], capture_output=True,
                          text=True, check=True).stdout
    assert json.loads(said) == {"ended": None, "missing": True}
    assert memory_guard_said(["node2"], [said]) == {"stopped": [], "seen": []}


def test_the_nodes_watched_are_the_unified_ones_with_what_ends_their_load():
    reads = [{"memory": {"unified": True}}, {"memory": {"unified": False}}, {"memory": {"unified": True}}, {}]
    assert memory_guard_nodes(["node1", "node2", "node3", "node4"], reads,
                              ["gpulab-ray-head", "gpulab-ray-worker", "gpulab-ray-worker", "gpulab-ray-worker"],
                              "node1", "gpulab-vllm") == [
        {"host": "node1", "containers": ["gpulab-vllm", "gpulab-ray-head"]},
        {"host": "node3", "containers": ["gpulab-ray-worker"]}]
