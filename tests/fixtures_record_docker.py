"""Record `docker inspect` of containers in the states the supervisor judges, from a lab node's own Docker daemon.

Each state is made for real by a Docker daemon (a lab node's, with the lab's Ray image, which every node holds after
`make lab-up`; or any daemon and image given): running, killed (docker kill), stopped (docker stop, the process ending
on SIGTERM), killed for memory (a memory limit under what the process takes), exited 1, created and never started.
Environment values are dropped from the record.

    python3 tests/fixtures_record_docker.py [NODE]
    python3 tests/fixtures_record_docker.py --socket /var/run/docker.sock --image IMAGE

Writes tests/unit/fixtures/docker/<state>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "unit" / "fixtures" / "docker"
PREFIX = "gpulab-fixture-"
# (state, situation, docker run arguments before the image, command, what to do once it runs)
CASES = [
    ("running", "a container running `sleep`", [], ["sleep", "600"], None),
    ("killed", "a container running `sleep`, then `docker kill` (SIGKILL)", [], ["sleep", "600"], "kill"),
    ("stopped", "a shell that exits 143 on SIGTERM, then `docker stop`", [],
     ["sh", "-c", "trap 'exit 143' TERM; sleep 600 & wait"], "stop"),
    ("oom", "a shell holding 300 MB in a variable under a 64 MiB memory limit", ["--memory", "64m", "--memory-swap", "64m"],
     ["sh", "-c", "x=$(head -c 300000000 /dev/zero | tr '\\0' a); sleep 60"], "wait"),
    ("exited_1", "a command that exits 1 at once", [], ["sh", "-c", "echo 'it failed' >&2; exit 1"], "wait"),
]


def docker(sock: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", f"unix://{sock}", *args], capture_output=True, text=True, check=check)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("node", nargs="?", default="node2")
    parser.add_argument("--socket")
    parser.add_argument("--image")
    args = parser.parse_args(argv)
    node = "the machine's daemon" if args.socket else args.node
    sock = args.socket or f"/run/gpulab-lab/{args.node}/run/docker.sock"
    image = args.image or yaml.safe_load((ROOT / "inventories" / "local_lab" / "hosts.yml").read_text())["all"]["vars"]["lab_ray_image"]
    version = docker(sock, "version", "--format", "{{.Server.Version}}").stdout.strip()
    OUT.mkdir(parents=True, exist_ok=True)
    recorded = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    cases = CASES + [("created", "`docker create`, never started", [], ["sleep", "600"], "create")]
    for state, situation, run_args, command, then in cases:
        name = PREFIX + state
        docker(sock, "rm", "-f", name, check=False)
        if then == "create":
            docker(sock, "create", "--name", name, "--entrypoint", command[0], image, *command[1:])
        else:
            docker(sock, "run", "-d", "--name", name, *run_args, "--entrypoint", command[0], image, *command[1:])
            time.sleep(2)
        if then == "kill":
            docker(sock, "kill", name)
        elif then == "stop":
            docker(sock, "stop", "-t", "10", name)
        elif then == "wait":
            docker(sock, "wait", name)
        inspect = json.loads(docker(sock, "inspect", name).stdout)[0]
        inspect["Config"]["Env"] = []
        docker(sock, "rm", "-f", name, check=False)
        (OUT / f"{state}.json").write_text(json.dumps(
            {"recorded_at": recorded, "node": node, "docker": version, "situation": situation, "inspect": inspect}, indent=1, sort_keys=True) + "\n")
        print(f"{state}: {inspect['State']['Status']} exit {inspect['State']['ExitCode']} oom {inspect['State']['OOMKilled']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
