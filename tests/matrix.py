"""The ansible-core matrix: unit tests and ansible-test sanity on the oldest ansible-core that
meta/runtime.yml claims (2.17) and on one between (2.19), each on Python 3.11 in its own virtual
environment under build/matrix/ (the checkout's .venv, on the newest ansible-core, 2.21, and
Python 3.12, runs every stage, and its sanity the compile and import tests on the node Pythons).

    tests/matrix.py            every entry
    tests/matrix.py 2.19       one entry

Pins live in tests/matrix/core-<version>.txt. Exit status 0 only when every entry passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# core version -> the Python it runs on (3.11, Debian 12's; .venv's 2.21, like every core from 2.20 on, needs 3.12 or newer)
ENTRIES = {"2.17": "3.11", "2.19": "3.11"}


def interpreter(version: str) -> str:
    """A working pythonX.Y (tests/find_python.sh: pyenv's versions, else the PATH)."""
    found = subprocess.run([str(ROOT / "tests" / "find_python.sh"), version], stdout=subprocess.PIPE, text=True, check=False)
    if found.returncode != 0:
        raise SystemExit("matrix: no Python %s on this machine" % version)
    return found.stdout.strip()


def venv_for(core: str, python: str) -> Path:
    venv = ROOT / "build" / "matrix" / ("core-" + core)
    pins = ROOT / "tests" / "matrix" / ("core-%s.txt" % core)
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == pins.read_text():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([interpreter(python), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "-r", str(pins)], check=True)
    stamp.write_text(pins.read_text())
    return venv


def run_entry(core: str) -> list[tuple[str, int, float]]:
    python = ENTRIES[core]
    venv = venv_for(core, python)
    # Sanity on the entry's own Python only: .venv's sanity covers the node Pythons.
    env = dict(os.environ, SANITY_VENV=str(venv), SANITY_NODE_PYTHONS="", PATH="%s:%s" % (venv / "bin", os.environ["PATH"]))
    results = []
    for name, cmd in (("unit", [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"]),
                      ("sanity", ["bash", str(ROOT / "tests" / "sanity.sh")])):
        started = time.monotonic()
        status = subprocess.call(cmd, cwd=ROOT, env=env)
        results.append(("ansible-core %s (Python %s) %s" % (core, python, name), status, time.monotonic() - started))
    return results


def main(argv: list[str]) -> int:
    wanted = argv or list(ENTRIES)
    unknown = [core for core in wanted if core not in ENTRIES]
    if unknown:
        print("matrix: unknown entries %s; choose from %s" % (unknown, list(ENTRIES)), file=sys.stderr)
        return 2
    results = [result for core in wanted for result in run_entry(core)]
    for name, status, elapsed in results:
        print("  %-42s %-7s %5.0fs" % (name, "passed" if status == 0 else "FAILED", elapsed))
    return 1 if any(result[1] for result in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
