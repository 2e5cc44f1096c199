"""The seed image's build at the lowest CPU priority (lab/gpulab_lab/images.py): a priority is a thread's own on
Linux, so every thread of a daemon must be set, and only the background images are."""

from __future__ import annotations

import os
import subprocess
import sys
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
