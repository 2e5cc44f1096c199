# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Paths, errors and small process helpers shared by every part of the lab."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


PROJECT = Path(__file__).resolve().parents[2]


BUILD = PROJECT / "build"


CACHE = BUILD / "cache"


IMAGES_DIR = PROJECT / "lab" / "images"


INVENTORY = PROJECT / "inventories" / "local_lab" / "hosts.yml"


# Runtime state lives on tmpfs with short paths: unix socket paths are limited to 108 bytes.
RUN = Path("/run/gpulab-lab")


STATE_FILE = RUN / "state.json"


NODE_FILES = BUILD / "lab" / "node-files"


NS_PREFIX = "gpl-node"


class LabError(Exception):
    """A one-line, actionable error about the lab."""


def log(msg: str) -> None:
    print(f"lab: {msg}", flush=True)


def run(cmd: list[str], check: bool = True, capture: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, text=True, capture_output=capture, check=False, **kw)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise LabError(f"command failed ({proc.returncode}): {' '.join(cmd)}: {detail[-1] if detail else 'no output'}")
    return proc


def ok(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def stop_pid(pidfile: Path, timeout: float = 30.0) -> None:
    pid = pid_alive(pidfile)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")


def node_dirs(name: str) -> dict[str, Path]:
    run_dir = RUN / name
    return {
        "run": run_dir / "run",  # bound onto /run inside the node's sshd mount namespace
        "exec": run_dir / "x",
        "data": CACHE / "nodes" / name / "docker",
        "log": BUILD / "lab" / "logs",
    }


def netns_path(name: str) -> str:
    return f"/run/netns/{NS_PREFIX}{name[len('node'):]}"


def ns_name(name: str) -> str:
    return f"{NS_PREFIX}{name[len('node'):]}"


def existing_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith(NS_PREFIX))
