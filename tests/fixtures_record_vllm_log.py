"""Record a lab vLLM server's own log, for the unit tests of the load stages (_vllm_probe.load_progress).

Reads the whole log of the server container on the lab's head through that node's Docker Engine API (as
gpulab.vllm.vllm_health reads it), and writes it with what the lab looked like. The lab's secrets never reach a
server's log (the key is a file); the record is checked for them before it is written.

    python3 tests/fixtures_record_vllm_log.py NAME --situation "..." [--container gpulab-vllm] [--node node1]

Writes tests/unit/fixtures/vllm/NAME.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "collections"))

from ansible_collections.gpulab.vllm.plugins.module_utils import _node  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--situation", required=True)
    parser.add_argument("--container", default="gpulab-vllm")
    parser.add_argument("--node", default="node1")
    args = parser.parse_args()
    docker_host = f"unix:///run/gpulab-lab/{args.node}/run/docker.sock"
    status, doc = _node.docker_get(docker_host, f"/containers/{args.container}/json", 10)
    if status != 200:
        print(f"no container {args.container} on {args.node} (HTTP {status})", file=sys.stderr)
        return 1
    log = _node.docker_logs(docker_host, args.container, 100000, 30)
    record = {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "situation": args.situation,
        "image": doc["Config"]["Image"],
        "state": {key: doc["State"].get(key) for key in ("Status", "ExitCode", "OOMKilled")},
        "log": log,
    }
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    secrets = yaml.safe_load((ROOT / "inventories" / "local_lab" / "hosts.yml").read_text())["all"]["vars"]
    for key in ("ray_cluster_auth_token", "vllm_server_api_key"):
        if secrets[key] in text:
            print(f"refusing to write: the record holds {key}", file=sys.stderr)
            return 1
    out = ROOT / "tests" / "unit" / "fixtures" / "vllm" / f"{args.name}.json"
    out.write_text(text)
    print(f"wrote {out} ({len(log.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
