"""The seed image's build at the lowest CPU priority (lab/gpulab_lab/images.py): a priority is a thread's own on
Linux, so every thread of a daemon must be set, and only the background images are."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))

from gpulab_lab import images  # noqa: E402

# A process with three threads that waits to be read.
THREADED = ("import threading, time\n"
            "for _ in range(2):\n"
            "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")


def _nice_of_threads(pid: int) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()]


def test_every_thread_of_a_process_gets_the_priority():
    child = subprocess.Popen([sys.executable, "-c", THREADED], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        start = _nice_of_threads(child.pid)
        assert len(start) == 3 and len(set(start)) == 1
        # 19, or under `make test`'s nice 19 for the static stages, 10 (root may lower it): another value than the start.
        target = 19 if start[0] < 19 else 10
        images._set_priority(child.pid, target)  # pylint: disable=protected-access
        assert _nice_of_threads(child.pid) == [target] * 3
    finally:
        child.kill()
        child.wait()


def test_an_image_on_the_critical_path_keeps_every_priority():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with images.lowest_priority("vllm"):
        assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert "vllm-seed" in images.BACKGROUND_IMAGES and "ray" not in images.BACKGROUND_IMAGES


def test_autogroup_is_off_for_the_block_and_as_it_was_after(tmp_path):
    switch = tmp_path / "sched_autogroup_enabled"
    switch.write_text("1\n")
    with images.priorities_by_nice(switch):
        assert switch.read_text().strip() == "0"
    assert switch.read_text().strip() == "1"
    # Already off (make test's run around a build's block): left off after the block too.
    switch.write_text("0\n")
    with images.priorities_by_nice(switch):
        assert switch.read_text().strip() == "0"
    assert switch.read_text().strip() == "0"
    # No such setting (another kernel): the block runs, nothing is written.
    with images.priorities_by_nice(tmp_path / "absent"):
        pass
    assert not (tmp_path / "absent").exists()


def test_a_layer_unpacker_is_lowered_while_the_pull_runs():
    # A process named as the daemon's unpackers are (argv[0]), one per layer a Docker daemon unpacks; under a name of
    # this test's own, so that the machine's real unpackers (a lab pulling beside the unit stage) are left alone.
    name = f"gpulab-test-untar-{os.getpid()}"
    child = subprocess.Popen(["bash", "-c", f"exec -a {name} sleep 60"])
    other = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0", 1)[0] != name.encode():
            assert time.monotonic() < deadline, "the stand-in unpacker did not start"
            time.sleep(0.05)
        start = os.getpriority(os.PRIO_PROCESS, child.pid)
        target = 19 if start < 19 else 10
        rounds = iter([True, False])
        images._lower_unpackers(lambda: next(rounds), every=0, priority=target,  # pylint: disable=protected-access
                                name=name.encode())
        assert _nice_of_threads(child.pid) == [target]
        assert os.getpriority(os.PRIO_PROCESS, other.pid) == start
    finally:
        for proc in (child, other):
            proc.kill()
            proc.wait()
