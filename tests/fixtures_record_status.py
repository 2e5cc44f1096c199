"""Record what playbooks/status.yml reads on the lab, for the unit tests of gpulab.vllm.cluster_status.

Runs status.yml on the lab that is up with Ansible's JSON callback and keeps, per host, the result of its three
reads (node_facts, and on the head ray_cluster_facts and vllm_health) exactly as the modules returned them, plus the
playbook's own verdict. Secrets never reach these results (the modules return none); the file is checked for the
lab's token and key before it is written.

    python3 tests/fixtures_record_status.py NAME --situation "what the lab looked like" [-e VAR=VALUE ...]

Writes tests/unit/fixtures/status/NAME.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
READS = {"node": "Read this node's containers (with why a stopped one ended), image, addresses and firewall",
         "ray": "Read the Ray cluster from the head", "vllm": "Ask the vLLM server for a completion"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--situation", required=True)
    parser.add_argument("-e", dest="extra", action="append", default=[])
    args = parser.parse_args()
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    argv = [str(BIN / "ansible-playbook"), "-i", str(ROOT / "inventories" / "local_lab"), str(ROOT / "playbooks" / "status.yml")]
    for extra in args.extra:
        argv += ["-e", extra]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    output = json.loads(run.stdout)
    tasks = {task["task"]["name"]: task["hosts"] for task in output["plays"][0]["tasks"]}
    inventory = yaml.safe_load((ROOT / "inventories" / "local_lab" / "hosts.yml").read_text())
    children = inventory["all"]["children"]
    head = next(iter(children["ray_head"]["hosts"]))
    hosts = [head, *children["ray_workers"]["hosts"]]
    strip = ("_ansible_no_log", "_ansible_verbose_always", "_ansible_delegated_vars", "invocation", "action")
    record = {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "situation": args.situation,
        "extra_vars": args.extra,
        "head": head,
        "hosts": hosts,
        "endpoint": f"http://{children['ray_head']['hosts'][head]['ansible_host']}:8000/v1",
        "reads": {host: {key: {k: v for k, v in (tasks.get(name, {}).get(host) or {}).items() if k not in strip}
                         for key, name in READS.items() if host in tasks.get(name, {})} for host in hosts},
        "playbook_rc": run.returncode,
    }
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    secrets = inventory["all"]["vars"]
    for key in ("ray_cluster_auth_token", "vllm_server_api_key"):
        if secrets[key] in text:
            print(f"refusing to write: the record holds {key}", file=sys.stderr)
            return 1
    out = ROOT / "tests" / "unit" / "fixtures" / "status"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(text)
    print(f"wrote {out / (args.name + '.json')} (status.yml exited {run.returncode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
