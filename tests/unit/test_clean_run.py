"""A clean run prints only what it means: ansible-playbook, from the virtual environment these tests run in, prints no
Python warning (a library's deprecation, for one) and no Ansible deprecation beside its own output.

cryptography 51 deprecates DSA, and ansible-core's SSH agent code (2.19 and later) imports its DSA classes whenever a
playbook starts, so every run printed "CryptographyDeprecationWarning: DSA is deprecated" until requirements.txt
pinned cryptography 50. These runs fail when that warning, or any other, comes back.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The tools beside this interpreter: .venv's under `make check`, each matrix entry's under tests/matrix.py.
BIN = Path(sys.executable).parent
PLAYBOOKS = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "playbooks").glob("*.yml"))
# Python's own warning lines ("FILE:LINE: CATEGORY: message", warnings.formatwarning) and Ansible's deprecations.
NOISE = re.compile(r"^.*:\d+: \w*Warning: .*$|^\[DEPRECATION WARNING\].*$", re.MULTILINE)
TINY_PLAY = """\
- name: One module run on the controller, through the same start as a deploy
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def _playbook(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    # Python's default warning filters, as a user's shell has them.
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([str(BIN / "ansible-playbook"), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120, check=False)


def test_every_playbook_checks_without_a_warning():
    run = _playbook("--syntax-check", "-i", "localhost,", *PLAYBOOKS)
    assert run.returncode == 0, run.stdout
    assert NOISE.findall(run.stdout) == [], run.stdout


def test_a_play_runs_without_a_warning(tmp_path):
    play = tmp_path / "ping.yml"
    play.write_text(TINY_PLAY)
    run = _playbook("-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable, str(play))
    assert run.returncode == 0, run.stdout
    assert "ok=1" in run.stdout, run.stdout
    assert NOISE.findall(run.stdout) == [], run.stdout
