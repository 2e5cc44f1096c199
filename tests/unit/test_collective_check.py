"""The collective check's reading of NCCL's log and its summary, on logs NCCL wrote on a real GPU host
(tests/unit/fixtures/nccl: an H200 and an H100, two ranks given other host IDs so that NCCL took its network plugin)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import mmap
import os
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

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
        assert found == {"network": "Socket", "devices": ["eth0:192.0.2.2<0>"], "transports": ["NET/Socket"],
                         "version": "2.28.9+cuda13.0"}


def test_one_rank_has_no_channels():
    found = check.parse_nccl_log(log("h200_1rank_rank0"))
    assert found["network"] == "Socket" and found["transports"] == []


def test_an_empty_log_reports_nothing():
    assert check.parse_nccl_log("") == {"network": None, "devices": [], "transports": [], "version": None}


def test_two_roce_hcas_on_a_public_dgx_h100_log():
    for host in (3, 4):
        found = check.parse_nccl_log(log(f"public_dgxh100_roce_host{host}"))
        # "[RO]" (relaxed ordering) and the OOB interface are not devices.
        assert found["network"] == "IB" and found["devices"] == ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"]
    assert check.parse_nccl_log(log("public_dgxh100_roce_host4"))["version"] == "2.19.3+cuda12.3"


def test_the_mapped_libnccl_is_found_and_hashed(tmp_path):
    """A real mapping of this process: a file named as NCCL's core library, mapped, then read back from
    /proc/self/maps; a plugin's library beside it is not NCCL's core."""
    core = tmp_path / "lib" / "libnccl.so.2"
    plugin = tmp_path / "lib" / "libnccl-net.so"
    core.parent.mkdir()
    core.write_bytes(b"\x7fELF core" * 1000)
    plugin.write_bytes(b"\x7fELF plugin" * 1000)
    with open(core, "rb") as one, open(plugin, "rb") as two:
        maps = (mmap.mmap(one.fileno(), 0, access=mmap.ACCESS_READ), mmap.mmap(two.fileno(), 0, access=mmap.ACCESS_READ))
        try:
            found = check.loaded_nccl(Path("/proc/self/maps").read_text(), "2.28.9")
        finally:
            for mapped in maps:
                mapped.close()
    assert found == {"path": str(core), "version": "2.28.9", "sha256": hashlib.sha256(core.read_bytes()).hexdigest()}
    assert check.loaded_nccl(Path("/proc/self/maps").read_text()) == {"path": None, "version": None, "sha256": None}


def test_what_a_rank_inherited(tmp_path):
    conf = tmp_path / "nccl.conf"
    conf.write_text("# left by an image\nNCCL_IB_USE_INLINE=1\n\nNCCL_IB_DISABLE=0\n")
    found = check.nccl_settings({"NCCL_CONF_FILE": str(conf), "NCCL_IB_HCA": "=mlx5_0:1", "PATH": "/usr/bin"})
    assert found == {"env": {"NCCL_CONF_FILE": str(conf), "NCCL_IB_HCA": "=mlx5_0:1"},
                     "conf": {str(conf): ["NCCL_IB_USE_INLINE=1", "NCCL_IB_DISABLE=0"]}}
    # Without NCCL_CONF_FILE NCCL reads ~/.nccl.conf and /etc/nccl.conf: only those that exist are reported.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    with mock.patch.dict(os.environ, {"HOME": str(home)}):
        found = check.nccl_settings({})
    assert found["conf"][str(home / ".nccl.conf")] == ["NCCL_DEBUG=WARN"]
    assert set(found["conf"]) <= {str(home / ".nccl.conf"), "/etc/nccl.conf"}


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


def test_the_nccl_version_pytorch_reports_in_either_form():
    def torch_saying(version):
        def answer():
            if isinstance(version, Exception):
                raise version
            return version
        return SimpleNamespace(cuda=SimpleNamespace(nccl=SimpleNamespace(version=answer)))

    assert check.nccl_version_text(torch_saying((2, 27, 5))) == "2.27.5"
    assert check.nccl_version_text(torch_saying(2708)) == "2708"
    assert check.nccl_version_text(torch_saying(RuntimeError("no NCCL"))) is None


# Recorded on a lent H100 by build/probe (tests/unit/fixtures/nccl/SOURCES.md): PyTorch 2.11.0+cu130 with its
# nvidia-nccl wheel 2.28.9 in /opt/torch/.venv, and the image's system libnccl 2.28.3 in /usr/lib/x86_64-linux-gnu.
H100_TORCH_NCCL = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
H100_SYSTEM_NCCL = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"


def h100(name: str):
    text = (FIXTURES / "nccl" / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def h100_digests() -> dict:
    """sha256sum of every libnccl on the H100 machine, as the probe recorded it apart from the check."""
    return {path: digest for digest, path in (line.split() for line in h100("h100_libnccl_files_sha256.txt").splitlines())}


def test_two_ranks_as_hosts_on_an_h100():
    for rank in (0, 1):
        found = check.parse_nccl_log(log(f"h100_2ranks_as_hosts_socket_rank{rank}"))
        # No HCA on the lent machine: IB found no device and NCCL took its socket plugin on eth0.
        assert found == {"network": "Socket", "devices": ["eth0:192.0.2.2<0>"], "transports": ["NET/Socket"],
                         "version": "2.28.9+cuda13.0"}
        recorded = h100("h100_2ranks_as_hosts_report.json")["ranks"][rank]["nccl"]
        assert {key: recorded[key] for key in found} == found


def test_each_h100_rank_reports_the_libnccl_it_mapped():
    report = h100("h100_2ranks_as_hosts_report.json")
    assert report["error"] is None and report["busbw_gbps"] > 1
    # The digest the check took from /proc/self/maps is the one sha256sum gave for that file on the machine.
    assert [(rank["rank"], rank["path"], rank["version"], rank["sha256"]) for rank in report["nccl_ranks"]] == [
        (rank, H100_TORCH_NCCL, "2.28.9+cuda13.0", h100_digests()[H100_TORCH_NCCL]) for rank in (0, 1)]
    assert h100_digests()[H100_TORCH_NCCL].startswith("1c8618b86673")


def test_the_libnccl_of_recorded_h100_maps():
    found = check.loaded_nccl(h100("h100_proc_maps_torch.txt"), "2.28.9")
    assert (found["path"], found["version"]) == (H100_TORCH_NCCL, "2.28.9")
    # Under LD_PRELOAD of another libnccl the process maps both: the preloaded one and PyTorch's own.
    assert check.loaded_nccl(h100("h100_proc_maps_preload_copy.txt"))["path"] == (
        H100_TORCH_NCCL + ", /tmp/copy/libnccl.so.2")
    assert check.loaded_nccl(h100("h100_proc_maps_preload_system_nccl.txt"))["path"] == (
        H100_TORCH_NCCL + ", " + H100_SYSTEM_NCCL)


def test_what_h100_ranks_inherited_from_a_conf_file_and_the_environment():
    report = h100("h100_conf_file_and_env_report.json")
    # NCCL_VERSION is the CUDA image's label of its system NCCL (2.28.3), not the NCCL the rank ran (2.28.9).
    assert [rank["inherited"] for rank in report["nccl_ranks"]] == [
        {"env": {"NCCL_CONF_FILE": "/tmp/nccl.conf", "NCCL_MIN_NCHANNELS": "2", "NCCL_VERSION": "2.28.3-1"},
         "conf": {"/tmp/nccl.conf": ["NCCL_IB_DISABLE=1", "NCCL_SOCKET_NTHREADS=2"]}}] * 2
    assert [rank["version"] for rank in report["nccl_ranks"]] == ["2.28.9+cuda13.0"] * 2
    # Without the conf file and the variable, a rank of the same machine inherited only the image's label.
    assert [rank["inherited"] for rank in h100("h100_2ranks_as_hosts_report.json")["nccl_ranks"]] == [
        {"env": {"NCCL_VERSION": "2.28.3-1"}, "conf": {}}] * 2
