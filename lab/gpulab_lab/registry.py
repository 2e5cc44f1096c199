# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's image registry (Debian's docker-registry) on the machine, reached by the nodes over the management bridge."""

from __future__ import annotations

import subprocess
import urllib.request

from .common import BUILD, CACHE, RUN, pid_alive, wait_for
from .config import LabConfig


def start_registry(cfg: LabConfig) -> None:
    pidfile = RUN / "registry.pid"
    if pid_alive(pidfile):
        return
    storage = CACHE / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    conf = RUN / "registry.yml"
    # Listens on all addresses: the machine pushes over loopback, the nodes pull
    # over the management bridge. No authentication: it only holds lab images.
    conf.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: :{cfg.registry_port}\n"
    )
    (BUILD / "lab" / "logs").mkdir(parents=True, exist_ok=True)
    logf = open(BUILD / "lab" / "logs" / "registry.log", "ab")
    proc = subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=logf, stderr=logf, start_new_session=True)
    pidfile.write_text(str(proc.pid))

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{cfg.registry_port}/v2/", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(answers, 30, f"the lab registry on port {cfg.registry_port} (log: build/lab/logs/registry.log)")
