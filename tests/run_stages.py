"""Run every test stage of gpulab.vllm in order and print one summary line per stage.

Stages: lint (ansible-lint, production profile), sanity (ansible-test on an
ansible_collections/gpulab/vllm tree; compile and import on the node Pythons 3.9 to 3.13 too),
unit (pytest on recorded fixtures),
collection (build the tarball and resolve the modules by FQCN from an install of it),
matrix (unit and sanity on ansible-core 2.17 and 2.19, each in its own venv; .venv has 2.21),
lab (the modules, the bad-input suite, security, status and the fabric against the lab: first what
today's images serve, then what needs the seed's image, marked `seed`), then every molecule
scenario (each creates and destroys the lab itself). The lab images are built and pushed in the
background meanwhile, the seed's last (a row "images (background)" in the summary).

    tests/run_stages.py                 every stage
    tests/run_stages.py unit lint       only these stages
    STAGES="unit molecule:default" ...  the same, from the environment

Exit status is 0 only when every stage that ran passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
SCENARIOS = ["default", "e2e", "e2e_seed", "node_lost", "heal", "reboot", "upgrade"]
# Built and pushed in the background while the stages that need no lab run (lab/labctl.py build): first the two
# images most lab tests need, then the seed's (about 9 GB), which builds while the lab stage's first part runs; only
# the tests marked `seed` and the molecule scenarios wait for it.
FIRST_IMAGES = ["ray", "vllm"]
LATER_IMAGES = ["vllm-seed"]
LAB_IMAGE_KEYS = FIRST_IMAGES + LATER_IMAGES
FIRST_DONE = ROOT / "build" / "lab" / "images-first.done"


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    env.setdefault("PY_COLORS", "0")
    return env


class DiskWatch:
    """The free space of the checkout's file system, read every few seconds: how much the run took at its peak
    (the lab's images, node copies and registry are tens of GB; a machine short of disk fails in a build)."""

    def __init__(self, every: float = 5.0):
        self.start = self.lowest = shutil.disk_usage(ROOT).free
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.lowest = min(self.lowest, shutil.disk_usage(ROOT).free)

    def line(self) -> str:
        self._stop.set()
        now = shutil.disk_usage(ROOT).free
        self.lowest = min(self.lowest, now)
        gb = 1e9
        return (f"disk: {self.start / gb:.1f} GB free at the start, {self.lowest / gb:.1f} GB at the lowest "
                f"({(self.start - self.lowest) / gb:.1f} GB taken at the peak), {now / gb:.1f} GB at the end")


def stage_commands() -> dict[str, list[list[str]]]:
    stages: dict[str, list[list[str]]] = {
        "lint": [[str(VENV_BIN / "ansible-lint"), "--offline"]],
        "sanity": [["bash", str(ROOT / "tests" / "sanity.sh")]],
        # The benchmark's own logic (parsers, floor helpers, report) on recorded data, beside the collection's.
        "unit": [[str(VENV_BIN / "python"), "-m", "pytest", "-q", "tests/unit", "bench/tests"]],
        "collection": [[str(VENV_BIN / "python"), "-m", "pytest", "-q", "tests/collection"]],
        # Unit tests and sanity on the oldest ansible-core claimed and one between (tests/matrix.py).
        "matrix": [[str(VENV_BIN / "python"), str(ROOT / "tests" / "matrix.py")]],
        # The modules and every bad input against a real lab (the Ray image and both vLLM images).
        # In two parts: what needs today's images, while the seed's image still builds; then what needs the seed's.
        "lab": [["@images", "first"],
                ["make", "--no-print-directory", "lab-up", "NODES=2", "LAB_IMAGES=" + " ".join(FIRST_IMAGES)],
                [str(VENV_BIN / "python"), "-m", "pytest", "-q", "--durations=30", "-m", "lab and not seed", "tests/integration"],
                ["@images", "all"],
                ["make", "--no-print-directory", "lab-up", "NODES=2", "LAB_IMAGES=" + " ".join(LAB_IMAGE_KEYS)],
                [str(VENV_BIN / "python"), "-m", "pytest", "-q", "--durations=10", "-m", "lab and seed", "tests/integration"]],
    }
    for name in SCENARIOS:
        stages[f"molecule:{name}"] = [[str(VENV_BIN / "molecule"), "test", "-s", name]]
    return stages


def main(argv: list[str]) -> int:
    stages = stage_commands()
    wanted = argv or os.environ.get("STAGES", "").split() or list(stages)
    unknown = [name for name in wanted if name not in stages]
    if unknown:
        print(f"run_stages: unknown stage(s) {unknown}; choose from {list(stages)}", file=sys.stderr)
        return 2
    results = []
    disk = DiskWatch()
    print(f"disk: {disk.start / 1e9:.1f} GB free at the start", flush=True)
    needs_lab = [name for name in wanted if name == "lab" or name.startswith("molecule:")]
    images = None
    if needs_lab and needs_lab[0] != wanted[0]:
        (ROOT / "build" / "lab" / "logs").mkdir(parents=True, exist_ok=True)
        FIRST_DONE.unlink(missing_ok=True)
        images_log = open(ROOT / "build" / "lab" / "logs" / "images.log", "w")  # pylint: disable=consider-using-with
        labctl = f"{VENV_BIN / 'python'} {ROOT / 'lab' / 'labctl.py'} build"
        script = f"{labctl} {' '.join(FIRST_IMAGES)} && touch {FIRST_DONE} && {labctl} {' '.join(LATER_IMAGES)}"
        images = {"process": subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=_env(), stdout=images_log,
                                              stderr=subprocess.STDOUT),
                  "started": time.monotonic(), "waited": 0.0, "done": False}
        print(f"lab images: building and pushing {' '.join(LAB_IMAGE_KEYS)} in the background (build/lab/logs/images.log)",
              flush=True)

    def wait_images(part: str) -> int:
        """Wait for the background images: 'first' (today's) or 'all'. 0 when they are there, or when nothing builds
        in the background (the lab-up that follows builds what is missing)."""
        if images is None:
            return 0
        if not images["done"]:
            process, waited = images["process"], time.monotonic()
            while part == "first" and not FIRST_DONE.exists() and process.poll() is None:
                time.sleep(2)
            if part == "all" or process.poll() is not None:
                images["status"] = process.wait()
                images["done"] = True
                images["waited"] += time.monotonic() - waited
                elapsed = time.monotonic() - images["started"]
                said = "built" if images["status"] == 0 else "FAILED (exit %d)" % images["status"]
                print(f"===== lab images: {said} in {elapsed:.0f}s, {images['waited']:.0f}s of it waited for =====", flush=True)
                results.append(("images (background)", images["status"], elapsed))
                # Its own lines (what was built and pushed, how long each took, and on a failure the end of a log).
                print((ROOT / "build" / "lab" / "logs" / "images.log").read_text(errors="replace"), flush=True)
            else:
                images["waited"] += time.monotonic() - waited
        return images.get("status", 0)

    for name in wanted:
        if name.startswith("molecule:"):
            wait_images("all")
        print(f"\n===== stage {name} =====", flush=True)
        started = time.monotonic()
        status = 0
        for cmd in stages[name]:
            if cmd[0] == "@images":
                # A failed background build has its own row; the lab-up that follows builds what is missing.
                wait_images(cmd[1])
                continue
            status = subprocess.call(cmd, cwd=ROOT, env=_env())
            if status != 0:
                break
        elapsed = time.monotonic() - started
        results.append((name, status, elapsed))
        print(f"===== stage {name}: {'PASSED' if status == 0 else f'FAILED (exit {status})'} in {elapsed:.0f}s =====", flush=True)
    print("\nSummary")
    for name, status, elapsed in results:
        print(f"  {name:<20} {'passed' if status == 0 else 'FAILED':<7} {elapsed:7.0f}s")
    failed = sum(1 for result in results if result[1] != 0)
    print(f"stages: {len(results) - failed} passed, {failed} failed")
    print(disk.line())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
