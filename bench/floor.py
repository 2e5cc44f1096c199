# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The floor: the same containers the playbook starts, started with no Ansible at all.

    floor.py --spec bench/results/spec-qwen35.json [--collection DIR] [--poll 0.2] [--timeout 900]

The spec is what `docker inspect` recorded after a playbook deploy (bench/run.py writes it), so
the floor starts the same images with the same entrypoints, commands, environment, mounts and
limits. Secrets come back from the lab inventory. Steps, with no fixed sleep anywhere (every wait
polls every --poll seconds):

  1. write the Ray token file and the server's own files (its middleware, the variables vLLM keeps
     off the workers); on every node at once, add the Ray firewall chain (nsenter into the
     node) and, when the inventory asks the roles to (image_pull: always), pull the images again;
  1b. the checks the playbook runs before Ray, on every node at once: the image's contract probe
     (`docker run --rm` of the image role's probe, with the GPU request the Ray containers get) and
     the proof of the model against its source (the weights role's own reader, the same stamps);
  2. `docker -H <node socket> run` the Ray head; wait until the head's GCS port answers on the
     fabric, seen from a worker's network namespace;
  3. start every worker at once;
  4. wait for every node and GPU with the collection's own GCS reader, looped inside ONE
     `docker exec` in the head container (the gate, minus one process per poll);
  4b. the collective across every GPU: the collective role's check, `docker exec` in the head
     container with the same settings;
  5. start the vLLM server and poll /v1/completions until a completion is answered.

Prints one JSON object: ok, total_s, marks (seconds since start at the end of each step), and
the gate's record (wall-clock time it passed, polls, Ray's node table with start times).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

# The scripts the roles run, relative to the collection's tree (--collection).
PROBE = Path("roles") / "image" / "files" / "probe_image.py"
COLLECTIVE = Path("roles") / "collective" / "files" / "collective_check.py"
WEIGHTS = Path("plugins") / "module_utils" / "_weights.py"

# Waits for a TCP port; runs inside a node's network namespace.
PORT_WAIT = r"""
import socket, sys, time
host, port, interval, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
deadline = time.monotonic() + timeout
while True:
    started = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=interval).close()
        sys.exit(0)
    except OSError:
        if started > deadline:
            sys.exit(1)
    time.sleep(max(0.0, interval - (time.monotonic() - started)))
"""


class FloorError(Exception):
    pass


def write_secret_files(specs: list[dict], secrets: dict) -> None:
    """The Ray token file, root-only, as the role writes it (the lab's nodes share the machine's /etc)."""
    for path, name in sorted({(f["path"], f["secret"]) for s in specs for f in s["secret_files"]}):
        target = Path(path)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        target.parent.chmod(0o700)
        target.write_text(secrets[name])
        target.chmod(0o600)


def write_config_files(files: list[dict]) -> None:
    """The server's own files (its middleware, the variables vLLM keeps off the workers), as the role writes them."""
    for entry in files:
        target = Path(entry["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(entry["content"])
        target.chmod(entry["mode"])


def apply_firewall(node: benchlib.Node, rules: list[list[str]]) -> None:
    for rule in rules:
        proc = benchlib.in_netns(node, ["iptables", *rule], timeout=30)
        if proc.returncode != 0:
            raise FloorError("iptables %s on %s failed: %s" % (" ".join(rule[:2]), node.name, proc.stderr.strip()))


def prepare(node: benchlib.Node, entry: dict, pull: bool) -> None:
    apply_firewall(node, entry["firewall"])
    if pull:
        for image in sorted({c["image"] for c in entry["containers"]}):
            benchlib.docker(node, "pull", "--quiet", image, timeout=600)


def start(node: benchlib.Node, spec: dict, secrets: dict) -> None:
    benchlib.docker(node, *benchlib.run_argv(spec, secrets))


def probe(node: benchlib.Node, check: dict, script: str) -> dict:
    """The image role's contract probe, as the role runs it: Ray, vLLM and the GPUs the image sees."""
    argv = ["run", "--rm", "--network=none"] + (["--gpus=all"] if check["gpus"] else [])
    prefix = check["entrypoint_prefix"]
    argv += (["--entrypoint=" + prefix[0], check["image"]] + prefix[1:] + ["python3"]) if prefix else ["--entrypoint=python3", check["image"]]
    argv += ["-c", script] + (["--gpu"] if check["gpus"] else [])
    proc = benchlib.docker(node, *argv, timeout=300, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise FloorError("the image probe on %s failed: %s" % (node.name, proc.stderr.strip()[-300:]))
    found = json.loads(lines[-1])
    if found.get("ray") is None or found.get("vllm") is None:
        raise FloorError("the image probe on %s found no Ray or no vLLM: %s" % (node.name, lines[-1][:200]))
    return found


def prove_weights(weights: dict, pool: ThreadPoolExecutor, collection: Path) -> int:
    """The weights role's proof: the source's manifest (its stamp vouching), then every node's copy against it."""
    weights_lib = benchlib.load_module("gpulab_weights", collection / WEIGHTS)
    source = weights_lib.read_folder(weights["source"], weights["source_stamp"])
    if not source["count"] or source["problems"]:
        raise FloorError("the model's source %s is incomplete: %s" % (weights["source"], source["problem_lines"][:3]))
    proofs = list(pool.map(lambda n: (n["name"], weights_lib.read_folder(n["dir"], n["stamp"], expected=source["files"], with_manifest=False)),
                           weights["nodes"]))
    bad = ["%s: %s" % (name, found["problem_lines"][:2]) for name, found in proofs if found["problems"]]
    if bad:
        raise FloorError("the model differs from its source on %s" % "; ".join(bad))
    return source["count"]


def collective(head: benchlib.Node, container: str, check: dict, script: str) -> dict:
    """The collective role's check in the head container: one all-reduce across every GPU, then each link to the head."""
    argv = ["exec", "-i", container, "python3", "-", "--world", str(check["world"]), "--size-mb", str(check["size_mb"]),
            "--iterations", str(check["iterations"]), "--timeout", str(check["timeout"])]
    proc = benchlib.docker(head, *argv, input=script, timeout=check["timeout"] + 120, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    found = json.loads(lines[-1]) if lines else {"error": proc.stderr.strip()[-300:] or "exit %d" % proc.returncode}
    if found.get("error"):
        raise FloorError("the collective check failed: %s" % found["error"])
    return found


def wait_port(node: benchlib.Node, address: str, poll: float, timeout: float) -> None:
    host, port = address.rsplit(":", 1)
    proc = benchlib.in_netns(node, [sys.executable, "-c", PORT_WAIT, host, port, str(poll), str(timeout)], timeout=timeout + 30)
    if proc.returncode != 0:
        raise FloorError("the Ray head's GCS %s did not answer from %s within %ss" % (address, node.name, timeout))


def wait_cluster(head: benchlib.Node, container: str, expect: dict, reader: str, poll: float, timeout: float) -> dict:
    # The collection's reader waits by itself, judging by its own rule, as the gate does.
    # The gate's own raylet knock too (its default grace), so that the floor does the checks the playbook does.
    until = {"ips": [], "nodes": expect["nodes"], "gpus": expect["gpus"], "interval": poll, "for": timeout, "raylet_grace": 10}
    # The head's address, as the gate gives it: the reader need not wait for the head to write its own record.
    proc = benchlib.docker(head, "exec", container, "python3", "-c", reader, expect["gcs_address"], "2", json.dumps(until),
                           check=False, timeout=timeout + 60)
    try:
        document = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise FloorError("the GCS reader in %s printed nothing usable: %s" % (container, proc.stderr.strip()[-300:])) from exc
    record = {"ready": bool(document.get("ready")), "at": document.get("read_at"), "polls": document.get("polls"),
              "nodes": document.get("nodes"), "error": document.get("error")}
    if not record["ready"]:
        raise FloorError("the cluster was not complete within %ss: %s" % (timeout, record))
    return record


def wait_completion(url: str, model: str, api_key: str | None, poll: float, timeout: float) -> dict:
    """Poll /v1/completions until it answers 200 with a choice; the lab is reached without any proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    deadline, attempts, last = time.monotonic() + timeout, 0, None
    while True:
        started = time.monotonic()
        attempts += 1
        try:
            with opener.open(urllib.request.Request(url, data=body, headers=headers), timeout=30) as response:
                answer = json.load(response)
            if answer.get("choices"):
                return {"attempts": attempts, "text": answer["choices"][0].get("text")}
            last = "no choices in the answer"
        except urllib.error.HTTPError as exc:
            last = "HTTP %d" % exc.code
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = type(exc).__name__
        if started > deadline:
            raise FloorError("no completion from %s within %ss (last: %s)" % (url, timeout, last))
        time.sleep(max(0.0, poll - (time.monotonic() - started)))


def run(spec: dict, collection: Path, poll: float, timeout: float) -> dict:
    started = time.monotonic()
    marks = {}

    def mark(step: str) -> None:
        marks[step] = round(time.monotonic() - started, 3)

    inventory = benchlib.read_inventory()
    nodes = {node.name: node for node in benchlib.lab_nodes(inventory)}
    secrets = benchlib.inventory_secrets(inventory)
    reader = benchlib.gcs_reader_source(collection)
    placed = [(nodes[entry["name"]], c) for entry in spec["nodes"] for c in entry["containers"]]
    by_role = {role: [(n, c) for n, c in placed if c["role"] == role] for role in benchlib.ROLE_ORDER}
    (head, head_spec), = by_role["ray-head"]
    workers = by_role["ray-worker"]

    with ThreadPoolExecutor(max_workers=max(len(nodes), 1)) as pool:
        write_secret_files([pair[1] for pair in placed], secrets)
        write_config_files(spec.get("config_files") or [])
        list(pool.map(lambda entry: prepare(nodes[entry["name"]], entry, spec.get("pull", False)), spec["nodes"]))
        mark("secrets_firewall_pull")
        # The checks before Ray, as the playbook runs them from nothing: the probe on every node, the model's proof.
        checks = spec.get("checks") or {}
        if checks.get("probe"):
            script = (collection / PROBE).read_text()
            list(pool.map(lambda check: probe(nodes[check["name"]], check, script), checks["probe"]))
            mark("probe")
        if checks.get("weights"):
            prove_weights(checks["weights"], pool, collection)
            mark("weights_proof")
        start(head, head_spec, secrets)
        mark("head_started")
        if workers:
            wait_port(workers[0][0], spec["expect"]["gcs_address"], poll, timeout)
            mark("head_port")
            list(pool.map(lambda placed_one: start(placed_one[0], placed_one[1], secrets), workers))
            mark("workers_started")
    gate = wait_cluster(head, head_spec["name"], spec["expect"], reader, poll, timeout)
    mark("gate")
    shown = None
    if (spec.get("checks") or {}).get("collective", {}).get("enabled") and by_role["vllm-server"]:
        shown = collective(head, head_spec["name"], spec["checks"]["collective"], (collection / COLLECTIVE).read_text())
        mark("collective")
    completion = None
    for node, server in by_role["vllm-server"]:
        start(node, server, secrets)
        mark("vllm_started")
        endpoint = benchlib.vllm_endpoint(server)
        completion = wait_completion("http://%s:%d/v1/completions" % (node.mgmt_ip, endpoint["port"]), endpoint["model"],
                                     secrets.get("vllm_server_api_key"), poll, timeout)
        mark("completion")
    return {"ok": True, "total_s": round(time.monotonic() - started, 3), "marks": marks, "gate": gate, "completion": completion,
            "collective": shown}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--collection", type=Path, default=benchlib.ROOT, help="tree whose GCS reader the gate loop uses")
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    try:
        result = run(json.loads(args.spec.read_text()), args.collection, args.poll, args.timeout)
    except (FloorError, RuntimeError, OSError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
