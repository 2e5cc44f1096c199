"""Run every test stage of gpulab.vllm and print one summary line per stage, with its budget.

Stages (tests/README.md says what each proves and its budget):
  static, run at the lowest priority (nice 19) beside the image builds and the lab stages: lint (ansible-lint, production
  profile), sanity (ansible-test, compile and import on the node Pythons 3.9 to 3.13 too), unit (pytest on
  recorded fixtures), collection (build the tarball, install it on ansible-core alone beside only the collections
  galaxy.yml declares, resolve its plugins by FQCN and every name its code uses from there),
  matrix (unit and sanity on ansible-core 2.17 and 2.19);
  on the lab, in order: lab (the modules, bad inputs, faults and the serving chain on today's images),
  molecule:default (the Ray-only chain), molecule:node_lost, then lab:seed
  (what needs the seed's image, its serving chain included), last, so that the seed's 9 GB image builds meanwhile.

The lab images are built and pushed in the background from the start (lab/labctl.py build): Ray's and today's
vLLM's first, then the seed's; every wheel set is downloaded at the start. Each lab stage waits only for the
images it uses. The lab comes up once and goes down once, at the end (KEEP_LAB=1 leaves it up).

    tests/run_stages.py                 every stage
    tests/run_stages.py unit lint       only these stages, in this order, one after another
    STAGES="unit molecule:default" ...  the same, from the environment

Exit status is 0 only when every stage that ran passed. A stage over its budget prints a warning, never a failure:
the machines are shared and noisy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab"))
from gpulab_lab.images import priorities_by_nice  # noqa: E402  pylint: disable=wrong-import-position
VENV_BIN = ROOT / ".venv" / "bin"
LOGS = ROOT / "build" / "test-logs"
STATIC = ["lint", "sanity", "unit", "collection", "matrix"]
# Lab stages in the order they run: each image the seed's scenario needs is built by the time its turn comes.
# molecule/reboot and molecule/upgrade run as the last links of the serving chain (lab), on its deployment.
# The Ray-only scenario runs first, on Ray's image, while today's vLLM image still builds on one core.
SCENARIOS = ["default", "node_lost"]
EARLY_SCENARIOS = ["default"]
# What each lab stage needs of the background images: "ray" (Ray's), "first" (Ray's and today's vLLM's) or "all"
# (the seed's too).
FIRST_IMAGES = ["ray", "vllm"]
LATER_IMAGES = ["vllm-seed"]
LAB_IMAGE_KEYS = FIRST_IMAGES + LATER_IMAGES
RAY_DONE = ROOT / "build" / "lab" / "images-ray.done"
FIRST_DONE = ROOT / "build" / "lab" / "images-first.done"


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    env.setdefault("PY_COLORS", "0")
    return env


def budgets() -> dict[str, int]:
    """Each stage's budget in seconds, from the table in tests/README.md (the one place it is written)."""
    found = {}
    for line in (ROOT / "tests" / "README.md").read_text().splitlines():
        match = re.match(r"\|\s*`([\w:()\s-]+)`\s*\|\s*(\d+)\s*s\s*\|", line)
        if match:
            found[match.group(1).strip()] = int(match.group(2))
    return found


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


def _pytest(marks: str, durations: int) -> list[str]:
    return [str(VENV_BIN / "python"), "-m", "pytest", "-q", f"--durations={durations}", "-m", marks, "tests/integration"]


def _lab_up(images: list[str]) -> list[str]:
    return ["make", "--no-print-directory", "lab-up", "NODES=2", "LAB_IMAGES=" + " ".join(images)]


def stage_commands() -> dict[str, list[list[str]]]:
    """Each stage's commands; "@images ray|first|all" waits for the background images."""
    stages: dict[str, list[list[str]]] = {
        "lint": [[str(VENV_BIN / "ansible-lint"), "--offline"]],
        "sanity": [["bash", str(ROOT / "tests" / "sanity.sh")]],
        # The benchmark's own logic (parsers, floor helpers, report) on recorded data, beside the collection's.
        "unit": [[str(VENV_BIN / "python"), "-m", "pytest", "-q", "tests/unit", "bench/tests"]],
        "collection": [[str(VENV_BIN / "python"), "-m", "pytest", "-q", "tests/collection"]],
        # Unit tests and sanity on the oldest ansible-core claimed and one between (tests/matrix.py).
        "matrix": [[str(VENV_BIN / "python"), str(ROOT / "tests" / "matrix.py")]],
    }
    # Each scenario's create brings the lab up with its own LAB_IMAGES (a no-op when it is up) and its destroy tears
    # the deployment down, leaving the lab up for the next.
    for name in EARLY_SCENARIOS:
        stages[f"molecule:{name}"] = [["@images", "ray"], [str(VENV_BIN / "molecule"), "test", "-s", name]]
    # The modules, every bad input, the faults and the serving chain against a real lab on today's images.
    stages["lab"] = [["@images", "first"], _lab_up(FIRST_IMAGES), _pytest("lab and not seed", 30)]
    for name in SCENARIOS:
        if name not in EARLY_SCENARIOS:
            stages[f"molecule:{name}"] = [["@images", "first"], [str(VENV_BIN / "molecule"), "test", "-s", name]]
    # What needs the seed's image (vLLM 0.17.1, Ray 2.53): its serving chain, its module tests, the Ray versions that differ.
    stages["lab:seed"] = [["@images", "all"], _lab_up(LAB_IMAGE_KEYS), _pytest("lab and seed", 15)]
    return stages


class BackgroundImages:
    """lab/labctl.py build in the background: every wheel set downloaded at once, Ray's and today's vLLM's images
    built and pushed first, then the seed's."""

    def __init__(self) -> None:
        (ROOT / "build" / "lab" / "logs").mkdir(parents=True, exist_ok=True)
        FIRST_DONE.unlink(missing_ok=True)
        RAY_DONE.unlink(missing_ok=True)
        self.log_path = ROOT / "build" / "lab" / "logs" / "images.log"
        log = open(self.log_path, "w")  # pylint: disable=consider-using-with
        # One build: every wheel set downloads at once; the mark says when the first images are pushed.
        keys = [f"ray={RAY_DONE}"] + FIRST_IMAGES[1:-1] + [f"{FIRST_IMAGES[-1]}={FIRST_DONE}"] + LATER_IMAGES
        self.process = subprocess.Popen([str(VENV_BIN / "python"), str(ROOT / "lab" / "labctl.py"), "build", *keys],
                                        cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        self.started = time.monotonic()
        self.ended: float | None = None
        self.waited = 0.0
        self.status: int | None = None

        def note_end() -> None:
            self.process.wait()
            self.ended = time.monotonic()

        threading.Thread(target=note_end, daemon=True).start()
        print(f"lab images: building and pushing {' '.join(LAB_IMAGE_KEYS)} in the background (build/lab/logs/images.log)",
              flush=True)

    def wait(self, part: str, results: list) -> int:
        """Wait for 'ray' (Ray's), 'first' (Ray's and today's vLLM's) or 'all'. A failed background build has its own
        row; the lab-up that follows builds what is missing."""
        if self.status is not None:
            return self.status
        waited = time.monotonic()
        mark = {"ray": RAY_DONE, "first": FIRST_DONE}.get(part)
        while mark is not None and not mark.exists() and self.process.poll() is None:
            time.sleep(2)
        if part == "all" or self.process.poll() is not None:
            self.status = self.process.wait()
            # When the build ended, not when a stage first asked after it.
            elapsed = (self.ended or time.monotonic()) - self.started
            self.waited += time.monotonic() - waited
            said = "built" if self.status == 0 else f"FAILED (exit {self.status})"
            print(f"===== lab images: {said} in {elapsed:.0f}s, {self.waited:.0f}s of it waited for =====", flush=True)
            results.append(("images (background)", self.status, elapsed))
            print(self.log_path.read_text(errors="replace"), flush=True)
            return self.status
        self.waited += time.monotonic() - waited
        return 0


def _idle() -> None:
    """The lowest priority (nice 19) for the static stages: they take little of the CPU the image builds and the lab
    want. Not SCHED_IDLE: under it a busy lab starved one poll of a unit test for 20 s."""
    os.nice(19)


def run_stage(name: str, commands: list[list[str]], images: BackgroundImages | None, results: list,
              quiet: bool = False) -> tuple[int, float]:
    """Run one stage's commands; with quiet, its output goes to build/test-logs/NAME.log and is printed at its end."""
    started = time.monotonic()
    status = 0
    log = None
    if quiet:
        LOGS.mkdir(parents=True, exist_ok=True)
        log = open(LOGS / f"{name.replace(':', '-')}.log", "w")  # pylint: disable=consider-using-with
    else:
        print(f"\n===== stage {name} =====", flush=True)
    for cmd in commands:
        if cmd[0] == "@images":
            if images is not None:
                images.wait(cmd[1], results)
            continue
        status = subprocess.call(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT if log else None,
                                 preexec_fn=_idle if quiet else None)
        if status != 0:
            break
    elapsed = time.monotonic() - started
    said = 'PASSED' if status == 0 else f'FAILED (exit {status})'
    if log is not None:
        log.close()
        text = (LOGS / f"{name.replace(':', '-')}.log").read_text(errors="replace")
        print(f"\n===== stage {name} (nice 19, beside the lab) =====\n{text}", flush=True)
    print(f"===== stage {name}: {said} in {elapsed:.0f}s =====", flush=True)
    return status, elapsed


def main(argv: list[str]) -> int:
    # Autogroup off for the run (lab/gpulab_lab/images.py): the static stages' and the seed's nice 19 then yields to
    # the lab's containers too, not only to the processes of their own session.
    with priorities_by_nice():
        return _main(argv)


def _main(argv: list[str]) -> int:
    stages = stage_commands()
    wanted = argv or os.environ.get("STAGES", "").split() or list(stages)
    unknown = [name for name in wanted if name not in stages]
    if unknown:
        print(f"run_stages: unknown stage(s) {unknown}; choose from {list(stages)}", file=sys.stderr)
        return 2
    limits = budgets()
    started = time.monotonic()
    results: list = []
    disk = DiskWatch()
    print(f"disk: {disk.start / 1e9:.1f} GB free at the start", flush=True)
    lab_stages = [name for name in wanted if name not in STATIC]
    static = [name for name in wanted if name in STATIC]
    # Static stages run beside the lab stages only when both are asked for; alone, they run in the foreground.
    beside = bool(lab_stages and static)
    if lab_stages:
        # The lab up first, without images (seconds): the background build then pulls each image onto the nodes
        # right after its push, while the next one builds, instead of the first deploy pulling it.
        subprocess.call(_lab_up([]), cwd=ROOT, env=_env())
    images = BackgroundImages() if lab_stages else None
    static_results: list = []

    def run_static() -> None:
        for name in static:
            static_results.append((name, *run_stage(name, stages[name], None, static_results, quiet=beside)))

    thread = threading.Thread(target=run_static, daemon=True)
    thread.start()
    if not beside:
        thread.join()
    for name in lab_stages:
        status, elapsed = run_stage(name, stages[name], images, results)
        results.append((name, status, elapsed))
    thread.join()
    if images is not None and images.status is None:
        images.wait("all", results)
    if lab_stages and os.environ.get("KEEP_LAB") != "1":
        subprocess.call(["make", "--no-print-directory", "lab-down"], cwd=ROOT, env=_env())
    rows = static_results + results
    print("\nSummary (budget from tests/README.md)")
    over = []
    for name, status, elapsed in rows:
        budget = limits.get(name)
        mark = ""
        if budget is not None and elapsed > budget:
            over.append(name)
            mark = "  over budget"
        print(f"  {name:<20} {'passed' if status == 0 else 'FAILED':<7} {elapsed:7.0f}s"
              f"{f'  (budget {budget}s)' if budget is not None else ''}{mark}")
    total = time.monotonic() - started
    full = set(wanted) == set(stages)
    print(f"  {'total':<20} {'':<7} {total:7.0f}s" + (f"  (budget {limits['total']}s)" if "total" in limits and full else ""))
    for name in over:
        print(f"WARNING: stage {name} took longer than its budget of {limits[name]}s (tests/README.md); a noisy "
              "machine or a slower test: see its durations above")
    if "total" in limits and total > limits["total"] and full:
        print(f"WARNING: the whole run took {total:.0f}s, over its budget of {limits['total']}s (tests/README.md)")
    failed = sum(1 for row in rows if row[1] != 0)
    print(f"stages: {len(rows) - failed} passed, {failed} failed")
    print(disk.line())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
