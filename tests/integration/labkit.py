"""What the lab tests share: paths, the environment of a playbook run, the lab's inventory, node daemons."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
LAB_INVENTORY = ROOT / "inventories" / "local_lab"
RUN = Path("/run/gpulab-lab")


def playbook_env() -> dict:
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                PATH=f"{BIN}:{os.environ['PATH']}")


def lab_hosts() -> dict:
    """The generated inventory of the lab that is up (a JSON document after one comment line)."""
    path = LAB_INVENTORY / "hosts.yml"
    if not path.exists():
        pytest.fail("the lab is not up: run `make lab-up` first (inventories/local_lab/hosts.yml is missing)")
    return json.loads(path.read_text().split("\n", 1)[1])


def node_docker(node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the docker client against one lab node's own daemon."""
    sock = RUN / node / "run" / "docker.sock"
    return subprocess.run(["docker", "-H", f"unix://{sock}", *args], capture_output=True, text=True,
                          check=check, timeout=180)
