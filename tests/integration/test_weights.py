"""The weights role on the lab: the model goes from the controller's folder (or the lab's hub mirror, through the
real huggingface_hub client) to the head, then node to node over the fabric, proven file by file on every node; a
truncated shard is named and repaired from a verified copy; a node without room is refused before any copy; a copy
cut off mid-way resumes where it stopped; a re-run changes nothing."""

from __future__ import annotations

import hashlib
import json
import os

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, lab_hosts, node_docker, playbook_env  # noqa: E402

PLAYBOOK = ROOT / "playbooks" / "weights.yml"
NODE_DATA = ROOT / "build" / "lab" / "node-data"
DEST = "models/tiny-llama"  # under each node's own /srv/gpulab-lab
LABCTL = [str(BIN / "python"), str(ROOT / "lab" / "labctl.py")]


def _play(*extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, PLAYBOOK, *extra], cwd=ROOT, env=playbook_env(),
                          capture_output=True, text=True, check=False, timeout=timeout)


def _recap(out: str) -> dict:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(node\d+)\s*: ok=\d+\s+changed=(\d+)", out, re.M)}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source() -> Path:
    return Path(lab_hosts()["all"]["vars"]["lab_model_dir"])


def _model_files(folder: Path) -> dict:
    """The model's files (not the collection's stamps and partial copies, nor the hub client's .cache)."""
    return {str(p.relative_to(folder)): _sha(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.relative_to(folder).parts[0].startswith((".gpulab", ".cache"))}


def _node_copy(node: str) -> Path:
    return NODE_DATA / node / DEST


def _held(folder: Path) -> int:
    """Bytes in the partial copies under folder (a file may be moved into place while it is read)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:
            pass
    return total


def _kill_sessions(node: str) -> None:
    """Kill every process of the node's SSH sessions (the module runs there, on stdin with pipelining)."""
    sshd = int((Path("/run/gpulab-lab") / node / "run" / "sshd.pid").read_text())
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
        except (ValueError, OSError, IndexError):
            continue

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == sshd:
                return True
        return False

    for pid in [p for p in parents if under(p)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _wipe(*nodes: str) -> None:
    for node in nodes:
        subprocess.run(["rm", "-rf", str(NODE_DATA / node / "models")], check=True)


@pytest.fixture()
def restore():
    yield
    subprocess.run([*LABCTL, "rate", "node1", "off"], check=False, capture_output=True)
    subprocess.run([*LABCTL, "disk", "node2", "off"], check=False, capture_output=True)


def test_the_model_reaches_every_node_over_the_fabric_and_a_rerun_changes_nothing(restore):
    _wipe("node1", "node2")
    run = _play()
    assert run.returncode == 0, run.stdout[-4000:]
    said = " ".join(run.stdout.split())
    # The head from the controller, node2 from the head (over the fabric), in two rounds.
    assert "round 1 of 2: node1 <- @source" in said and "round 2 of 2: node2 <- node1" in said, said[-3000:]
    want = _model_files(_source())
    assert len(want) >= 5 and any(name.endswith(".safetensors.index.json") for name in want)
    for node in ("node1", "node2"):
        assert _model_files(_node_copy(node)) == want, node
    # The copy servers are gone, their tokens with them.
    assert not list(NODE_DATA.glob("*/models/.gpulab-stamps/copy.*"))
    again = _play()
    assert again.returncode == 0, again.stdout[-3000:]
    assert _recap(again.stdout) == {"node1": 0, "node2": 0}, again.stdout[-3000:]
    # Nothing to copy: no round, no copy server.
    assert "round 1 of" not in again.stdout and "Start this node's copy server" not in again.stdout


def test_a_truncated_shard_is_named_and_repaired_from_a_verified_copy(restore):
    if _model_files(_node_copy("node1")) != _model_files(_source()):
        _wipe("node1", "node2")
        assert _play().returncode == 0
    shard = _node_copy("node2") / "model-00002-of-00003.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as stream:
        stream.truncate(1000)
    run = _play()
    assert run.returncode == 0, run.stdout[-4000:]
    said = " ".join(run.stdout.split())
    assert (f"node2: 1 file(s) of the model in /srv/gpulab-lab/{DEST} differ from the source: "
            f"model-00002-of-00003.safetensors: truncated (expected {size} bytes, found 1000 bytes)") in said, said[-3000:]
    assert "round 1 of 1: node2 <- node1" in said
    assert _recap(run.stdout) == {"node1": 0, "node2": 1}
    assert _sha(shard) == _sha(_source() / shard.name)


def test_a_node_without_room_is_refused_before_any_copy(restore):
    _wipe("node1", "node2")
    subprocess.run([*LABCTL, "disk", "node2", "256k"], check=True, capture_output=True)
    run = _play("-e", "weights_free_margin_mb=0")
    assert run.returncode != 0
    said = " ".join(run.stdout.split())
    assert re.search(rf"node2: /srv/gpulab-lab/{DEST} must receive [\d.]+ KB of the model, and 0 MB more stay free "
                     r"\(weights_free_margin_mb\), but its file system has [\d.]+ KB free; free space there or choose another weights_dir",
                     said), said[-3000:]
    # Nothing was copied anywhere: not even to the head, which had room.
    assert not (_node_copy("node1")).exists() or not any(_node_copy("node1").glob("*.safetensors"))
    assert "Copy what this node lacks" not in run.stdout


def test_a_copy_cut_off_midway_resumes_where_it_stopped(restore):
    if _model_files(_node_copy("node1")) != _model_files(_source()):
        _wipe("node1")
        assert _play().returncode == 0
    _wipe("node2")
    # node1 sends at 1 Mbit/s on the fabric: node2's copy of about 1 MB takes seconds, long enough to cut it off.
    subprocess.run([*LABCTL, "rate", "node1", "1mbit"], check=True, capture_output=True)
    partial = _node_copy("node2") / ".gpulab-partial"
    play = subprocess.Popen([BIN / "ansible-playbook", "-i", INVENTORY, PLAYBOOK, "-e", "weights_streams=1"], cwd=ROOT,
                            env=playbook_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _held(partial) < 50_000:
        time.sleep(0.1)
    # Cut off on both sides, as a dropped controller or a node restart does: the play, and the copy on node2.
    os.killpg(play.pid, signal.SIGKILL)
    play.wait(30)
    _kill_sessions("node2")
    time.sleep(1)
    assert _held(partial) >= 50_000, "no partial copy appeared on node2"
    subprocess.run([*LABCTL, "rate", "node1", "off"], check=True, capture_output=True)
    run = _play("-v")
    assert run.returncode == 0, run.stdout[-4000:]
    resumed = [int(m) for m in re.findall(r'resumed_bytes: (\d+)', run.stdout)]
    assert resumed and resumed[0] > 0, run.stdout[-3000:]
    assert _model_files(_node_copy("node2")) == _model_files(_source())


@pytest.fixture()
def hub():
    """The lab's hub mirror (olah) serving the lab model as a git repository with LFS shards."""
    up = subprocess.run([*LABCTL, "hub", "up"], capture_output=True, text=True, check=False, timeout=600)
    assert up.returncode == 0, up.stderr[-2000:]
    yield json.loads(up.stdout.strip().splitlines()[-1])
    subprocess.run([*LABCTL, "hub", "down"], check=False, capture_output=True)


def test_a_hub_source_is_fetched_once_proven_and_spread_and_a_rerun_needs_no_hub(hub, restore):
    _wipe("node1", "node2")
    image = lab_hosts()["all"]["vars"]["lab_vllm_image"]
    node_docker("node1", "pull", image)  # the playbook's own deploy pulls it; here the weights role runs alone
    extra = {"weights_source": "hub", "weights_repo": hub["repo"], "weights_revision": hub["commit"],
             "weights_hf_endpoint": hub["endpoint"], "weights_hf_token": "hf_lab_token_never_printed", "weights_image": image}
    run = _play("-vvv", "-e", json.dumps(extra))
    assert run.returncode == 0, run.stdout[-4000:]
    assert "hf_lab_token_never_printed" not in run.stdout + run.stderr
    said = " ".join(run.stdout.split())
    # Fetched once, by the head; node2 from the head over the fabric.
    assert "round 1 of 1: node2 <- node1" in said, said[-3000:]
    want = _model_files(_source())
    for node in ("node1", "node2"):
        assert _model_files(_node_copy(node)) == want, node
    # No token left behind.
    assert not list(NODE_DATA.glob("*/models/.gpulab-stamps/hf.token"))
    # The record of the pinned revision spares the hub: with the mirror gone, a re-run proves and changes nothing.
    subprocess.run([*LABCTL, "hub", "down"], check=True, capture_output=True)
    again = _play("-e", json.dumps(extra))
    assert again.returncode == 0, again.stdout[-3000:]
    assert _recap(again.stdout) == {"node1": 0, "node2": 0}, again.stdout[-3000:]
