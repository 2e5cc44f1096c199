# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record bench/tests/fixtures from the lab, with deploy_qwen35.yml deployed on it.

    python bench/tests/record_fixtures.py

- inspect_vllm_server.json: `docker inspect gpulab-vllm` on the head;
- iptables_S.txt: `iptables -S` in the head's network namespace.

The lab's secrets become the test's stand-ins ("t" * 64 for the Ray token, "k" * 64 for the vLLM
API key) and the lab's folder for node files becomes the roles' default, /etc/gpulab-vllm, so the
fixtures hold nothing of this machine.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STAND_INS = {"ray_cluster_auth_token": "t" * 64, "vllm_server_api_key": "k" * 64}


def main() -> int:
    inventory = benchlib.read_inventory()
    lab_vars = inventory["all"]["vars"]
    head = benchlib.lab_nodes(inventory)[0]
    text = benchlib.docker(head, "inspect", "gpulab-vllm").stdout
    for name, stand_in in STAND_INS.items():
        text = text.replace(lab_vars[name], stand_in)
    node_files = str(Path(lab_vars["gpulab_secrets_dir"]).parent)
    text = text.replace(node_files, "/etc/gpulab-vllm")
    text = re.sub(re.escape(str(benchlib.ROOT / "build" / "cache" / "nodes")) + r"/node\d+/docker", "/var/lib/docker", text)
    if str(benchlib.ROOT) in text:
        raise SystemExit("a path of this checkout is left in the recording; extend the replacements")
    document = json.loads(text)[0]
    (FIXTURES / "inspect_vllm_server.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    rules = benchlib.in_netns(head, ["iptables", "-S"], check=True).stdout
    (FIXTURES / "iptables_S.txt").write_text(rules)
    print("recorded %s" % ", ".join(sorted(p.name for p in FIXTURES.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
