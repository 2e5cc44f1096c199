# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hand flow our users ran before the collection, under a seeded fault, with the same time budget as the deploy.

The same containers the playbook starts (the spec bench/run.py recorded from a healthy deploy), started as a user
does by hand: the Ray head, the workers, `sleep 10`, `ray status` read by eye, then `vllm serve`, then waiting for a
completion. What it records: the seconds until something failed (a container that would not start or that exited)
and the line it said, or that nothing failed within the budget and the server's last line then. Nothing here judges
`ray status`: a user reads it by eye; its node count is recorded beside the outcome.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import floor  # noqa: E402

ROOT = benchlib.ROOT
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
import _node  # noqa: E402  (the collection's own reading of a log's cause line)

SLEEP = 10


# --------------------------------------------------------------------------- what a row changes in the hand flow

def _option(spec: dict, name: str, value: str) -> None:
    spec["command"] = [("--%s=%s" % (name, value)) if arg.startswith("--%s=" % name) else arg for arg in spec["command"]]


def wrong_address(specs: list[dict]) -> None:
    """The worker told an address outside the fabric subnet, as the inventory row does."""
    for spec in specs:
        if spec["role"] == "ray-worker":
            _option(spec, "node-ip-address", "10.230.0.12")


def image_without_ray(image: str):
    def change(specs: list[dict]) -> None:
        for spec in specs:
            spec["image"] = image
    return change


def worker_image(image: str):
    def change(specs: list[dict]) -> None:
        for spec in specs:
            if spec["role"] == "ray-worker":
                spec["image"] = image
    return change


def no_gpu_request(specs: list[dict]) -> None:
    for spec in specs:
        if spec["role"] == "vllm-server":
            spec["gpus"] = False


# --------------------------------------------------------------------------- the flow

def _last_line(node: benchlib.Node, name: str) -> str:
    log = benchlib.docker(node, "logs", "--tail", "400", name, check=False)
    text = (log.stdout or "") + (log.stderr or "")
    return _node.cause_line(text) or (text.strip().splitlines() or [""])[-1][:300]


def _docker_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return ([line for line in lines if "Error" in line] + lines + ["no output"])[0]


def _last_log_line(node: benchlib.Node, name: str) -> str:
    log = benchlib.docker(node, "logs", "--tail", "5", name, check=False)
    return (((log.stdout or "") + (log.stderr or "")).strip().splitlines() or [""])[-1][:300]


def _running(node: benchlib.Node, name: str) -> bool:
    return benchlib.docker(node, "inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip() == "true"


def _completion(url: str, model: str, api_key: str | None) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + api_key} if api_key else {})}
    try:
        with opener.open(urllib.request.Request(url, data=body, headers=headers), timeout=10) as response:
            return bool(json.load(response).get("choices"))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def restore_middleware(specs: list[dict]) -> None:
    """The teardown removes the server's key check; a user's server started by hand with the same settings has it."""
    source = ROOT / "roles" / "vllm_server" / "files" / "gpulab_vllm_auth.py"
    for spec in specs:
        for bind in spec["binds"]:
            folder = Path(bind.split(":", 1)[0])
            if folder.name == "middleware" and not (folder / source.name).exists():
                folder.mkdir(parents=True, exist_ok=True)
                (folder / source.name).write_bytes(source.read_bytes())


def remove_all(nodes: list[benchlib.Node], specs: list[dict]) -> None:
    for node in nodes:
        names = [s["name"] for s in specs]
        benchlib.docker(node, "rm", "-f", *names, check=False)


def run(spec: dict, change=None, budget: float = 60.0, serving_check: bool = False) -> dict:
    """One hand flow from nothing running. `change` edits the container specs (the row's fault, where it lives in
    the settings); `serving_check`: the cluster already serves and the user's check is `curl /health`."""
    inventory = benchlib.read_inventory()
    nodes = {node.name: node for node in benchlib.lab_nodes(inventory)}
    secrets = benchlib.inventory_secrets(inventory)
    placed = [(nodes[entry["name"]], copy.deepcopy(c)) for entry in spec["nodes"] for c in entry["containers"]]
    if change:
        change([c for unused_node, c in placed])
    by_role = {role: [(n, c) for n, c in placed if c["role"] == role] for role in benchlib.ROLE_ORDER}
    (head, head_spec), = by_role["ray-head"]
    started = time.monotonic()
    outcome = {"failed": False, "seconds": None, "said": "", "ray_status_nodes": None, "answered": False}

    def fail(said: str) -> dict:
        outcome.update(failed=True, seconds=round(time.monotonic() - started, 1), said=" ".join(said.split())[:400])
        return outcome

    if serving_check:
        # What a user has once it serves: the API's liveness.
        endpoint = benchlib.vllm_endpoint(by_role["vllm-server"][0][1])
        url = "http://%s:%d/health" % (head.mgmt_ip, endpoint["port"])
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as response:
                said = "GET /health answered %d" % response.status
                outcome.update(seconds=round(time.monotonic() - started, 1), said=said)
        except urllib.error.HTTPError as exc:
            return fail("GET /health answered %d" % exc.code)
        except (urllib.error.URLError, OSError) as exc:
            return fail("GET /health: %s" % exc)
        return outcome

    floor.write_secret_files([c for unused_node, c in placed], secrets)
    restore_middleware([c for unused_node, c in placed])
    for node, container in by_role["ray-head"] + by_role["ray-worker"]:
        proc = benchlib.docker(node, *benchlib.run_argv(container, secrets), check=False)
        if proc.returncode != 0:
            return fail("docker run %s on %s: %s" % (container["name"], node.name, _docker_error(proc.stderr)))
    time.sleep(SLEEP)
    status = benchlib.docker(head, "exec", head_spec["name"], "ray", "status", check=False, timeout=60)
    outcome["ray_status_nodes"] = len(re.findall(r"^\s*1 node_", status.stdout, re.M)) or None
    for node, container in by_role["ray-head"] + by_role["ray-worker"]:
        if not _running(node, container["name"]):
            return fail("%s on %s exited: %s" % (container["name"], node.name, _last_line(node, container["name"])))
    server_node, server = by_role["vllm-server"][0]
    proc = benchlib.docker(server_node, *benchlib.run_argv(server, secrets), check=False)
    if proc.returncode != 0:
        return fail("docker run %s: %s" % (server["name"], _docker_error(proc.stderr)))
    endpoint = benchlib.vllm_endpoint(server)
    url = "http://%s:%d/v1/completions" % (server_node.mgmt_ip, endpoint["port"])
    while time.monotonic() - started < budget:
        if not _running(server_node, server["name"]):
            return fail("%s exited: %s" % (server["name"], _last_line(server_node, server["name"])))
        if _completion(url, endpoint["model"], secrets.get("vllm_server_api_key")):
            outcome.update(answered=True, seconds=round(time.monotonic() - started, 1), said="served a completion")
            return outcome
        time.sleep(2)
    outcome.update(seconds=round(time.monotonic() - started, 1),
                   said="nothing failed within %d s; the server's last line: %s" % (budget, _last_log_line(server_node, server["name"])))
    return outcome
