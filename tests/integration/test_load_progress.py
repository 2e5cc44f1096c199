"""The model load on the lab: the play shows the server's stage while it starts, and a start that stalls (the server
container frozen with `docker pause` mid-start) fails within the stall limit, naming the stage, instead of waiting
out the health timeout."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, node_docker, playbook_env  # noqa: E402


def _play(name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=playbook_env(), capture_output=True, text=True, check=False, timeout=1200)


def _freeze_when_started(stop: threading.Event, frozen: list) -> None:
    """Pause the server container a few seconds after it starts running (it is then loading)."""
    while not stop.is_set():
        state = node_docker("node1", "inspect", "-f", "{{.State.Running}}", "gpulab-vllm", check=False).stdout.strip()
        if state == "true":
            time.sleep(8)
            node_docker("node1", "pause", "gpulab-vllm", check=False)
            frozen.append(time.monotonic())
            return
        time.sleep(0.5)


@pytest.fixture()
def fresh():
    _play("teardown.yml")
    yield
    node_docker("node1", "unpause", "gpulab-vllm", check=False)
    _play("teardown.yml")


def test_a_frozen_start_is_named_within_the_stall_limit(fresh):
    stop, frozen = threading.Event(), []
    watcher = threading.Thread(target=_freeze_when_started, args=(stop, frozen), daemon=True)
    watcher.start()
    try:
        run = _play("deploy_qwen35.yml", "-e", "vllm_server_stall_timeout=20", "-e", "gpulab_progress_interval=5")
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert frozen, "the server container never ran"
    assert run.returncode != 0, run.stdout[-3000:]
    said = " ".join(run.stdout.split())
    found = re.search(r"vLLM's start stalled at stage ([^:]+): nothing new from the server for (\d+) s \(stall_timeout\); "
                      r"its last line: .*? read `docker logs gpulab-vllm` on the head", said)
    assert found, run.stdout[-4000:]
    # Ended by the stall judgment, not by the health timeout (600 s in the lab): the stall's own message.
    assert int(found.group(2)) >= 20
    # While it was still moving, the play said where the start was (on stderr, as progress goes).
    assert re.search(r"\[node1\] waiting for vLLM at http://127\.0\.0\.1:8000 to answer a completion: \d+ s of 600 s; "
                     r"(loading: [^;]+; )?not answering yet", " ".join(run.stderr.split())), run.stderr[-4000:]
