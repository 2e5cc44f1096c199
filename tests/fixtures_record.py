"""Record the unit-test fixtures of gpulab.vllm from the running lab.

This is how every file under tests/unit/fixtures/ray, tests/unit/fixtures/vllm and
tests/unit/fixtures/node was made; nothing there is written by hand. It needs the
lab (make lab-up) and the containers of the situation being recorded (see
tests/unit/fixtures/README.md).

  ray NAME --docker-host unix:///run/gpulab-lab/node1/run/docker.sock --container fixture-ray-head
      runs the module's own GCS reader (and `ray status` beside it, for
      cross-checks) in the Ray head container; also records docker's error when
      the container is missing or stopped.
  vllm NAME --base-url http://10.210.0.11:8001 [--model tiny]
      sends the requests vllm_health sends and stores each raw exchange.
  node NAME --netns gpl-node1 --docker-host unix:///run/gpulab-lab/node1/run/docker.sock
      records on one node, raw, what node_facts parses: `ip -j address show`,
      /proc/net/tcp and tcp6, `iptables -S` (and `iptables -S CHAIN` of a few
      chains, for cross-checks), the Docker API's listing of the collection's
      containers and the inspect document of each (and of a missing name);
      `ss -Htln` beside them for cross-checks. Secrets are replaced with REDACTED.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "collections"))

from ansible_collections.gpulab.vllm.plugins.module_utils import _ray_state  # noqa: E402

FIXTURES = REPO / "tests" / "unit" / "fixtures"
# The lab's inventory, written by `make lab-up`; it holds the lab's current secrets.
LAB_INVENTORY = REPO / "inventories" / "local_lab" / "hosts.yml"
LAB_SECRET_VARS = ("ray_cluster_auth_token", "vllm_server_api_key")
REDACTED = "REDACTED"
# Environment variables whose value is a secret (not RAY_AUTH_TOKEN_PATH, which is a path).
SECRET_ENV = re.compile(r"(^|_)(API_KEY|TOKEN|SECRET|PASSWORD)$")
# Command-line options whose next argument is a secret.
SECRET_OPTIONS = ("--api-key",)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run(argv: list[str], timeout: float = 60) -> dict:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "elapsed_s": round(time.monotonic() - started, 4)}


def record_ray(args: argparse.Namespace) -> dict:
    docker = ["docker", "-H", args.docker_host]
    until = json.loads(args.until) if args.until else None
    reader = _ray_state.reader_argv("python3", args.gcs_address, 5.0, docker_cli="docker", container=args.container,
                                    until=until)
    # reader_argv starts with the docker CLI name; point it at the node's daemon.
    exec_env = [item for pair in args.exec_env for item in ("-e", pair)]
    reader_run = run(docker + reader[1:2] + exec_env + reader[2:])
    status_run = run(docker + ["exec", args.container, "ray", "status"]) if args.ray_status else None
    return {
        "kind": "ray",
        "name": args.name,
        "recorded_at": now(),
        "situation": args.situation,
        "command": "docker exec %s%s python3 -c <_gcs_reader.py> %s 5%s" % (
            "".join("-e %s " % pair for pair in args.exec_env), args.container, args.gcs_address,
            " '%s'" % json.dumps(until, sort_keys=True) if until else ""),
        "reader_run": reader_run,
        "ray_status_run": status_run,
    }


def exchange(method: str, url: str, body: dict | None, api_key: str | None, timeout: float) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    started = time.monotonic()
    record = {"method": method, "url": url, "request_body": body}
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            record.update(status=response.status, content_type=response.headers.get("Content-Type"),
                          body=response.read().decode("utf-8", "replace"), error=None)
    except urllib.error.HTTPError as exc:
        record.update(status=exc.code, content_type=exc.headers.get("Content-Type"),
                      body=exc.read().decode("utf-8", "replace"), error=None)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        record.update(status=None, content_type=None, body=None,
                      error="%s: %s" % (type(reason).__name__, reason))
    record["latency_s"] = round(time.monotonic() - started, 4)
    return record


def record_vllm(args: argparse.Namespace) -> dict:
    base = args.base_url.rstrip("/")
    model = args.model
    exchanges = [
        exchange("GET", base + "/health", None, args.api_key, 10),
        exchange("GET", base + "/v1/models", None, args.api_key, 10),
        exchange("GET", base + "/version", None, args.api_key, 10),
        exchange("POST", base + "/v1/completions",
                 {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}, args.api_key, 60),
        exchange("POST", base + "/v1/chat/completions",
                 {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                  "temperature": 0}, args.api_key, 60),
        exchange("GET", base + "/metrics", None, args.api_key, 10),
    ]
    if args.metrics_head is not None:
        for item in exchanges:
            if item["url"].endswith("/metrics") and item["body"]:
                # The full exposition is ~100 KB; keep the head, which is real and enough.
                item["body"] = "\n".join(item["body"].splitlines()[: args.metrics_head]) + "\n"
                item["truncated_to_lines"] = args.metrics_head
    return {
        "kind": "vllm",
        "name": args.name,
        "recorded_at": now(),
        "situation": args.situation,
        "base_url": base,
        "model": model,
        "api_key_used": bool(args.api_key),
        "exchanges": exchanges,
    }


def lab_secrets(inventory: Path) -> list[str]:
    """The secret values of the lab's inventory (none when the lab is not up)."""
    if not inventory.exists():
        return []
    import yaml  # the venv has it (ansible-core needs it); only the node verb does

    values = (yaml.safe_load(inventory.read_text()) or {}).get("all", {}).get("vars", {})
    return [str(values[name]) for name in LAB_SECRET_VARS if values.get(name)]


def scrub_paths(text: str) -> str:
    """The lab keeps node files and node image stores under this checkout; a fixture shows the paths a real
    node has instead (the roles' default folder, Docker's data root), and nothing of this machine."""
    text = re.sub(re.escape(str(REPO / "build" / "cache" / "nodes")) + r"/node\d+/docker", "/var/lib/docker", text)
    text = text.replace(str(REPO / "build" / "lab" / "node-files"), "/etc/gpulab-vllm")
    if str(REPO) in text:
        raise SystemExit("a path of this checkout is left in the recording; extend scrub_paths")
    return text


def lab_image_refs(inventory: Path) -> list[str]:
    """The lab's image references as the nodes pull them (none when the lab is not up)."""
    if not inventory.exists():
        return []
    import yaml

    values = (yaml.safe_load(inventory.read_text()) or {}).get("all", {}).get("vars", {})
    return [str(values[name]) for name in ("lab_ray_image", "lab_vllm_image") if values.get(name)]


def redact(value, secrets: list[str], where: str, redacted: list[str]):
    """value with every secret replaced by REDACTED; what was replaced is appended to redacted."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "Env" and isinstance(item, list):
                item = [redact_env(entry, "%s.Env" % where, redacted) for entry in item]
            out[key] = redact(item, secrets, "%s.%s" % (where, key) if where else key, redacted)
        return out
    if isinstance(value, list):
        out = []
        for index, item in enumerate(value):
            if index and isinstance(value[index - 1], str) and value[index - 1] in SECRET_OPTIONS:
                redacted.append("%s[%d] (after %s)" % (where, index, value[index - 1]))
                item = REDACTED
            out.append(redact(item, secrets, "%s[%d]" % (where, index), redacted))
        return out
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                redacted.append("%s (a secret of the lab's inventory)" % where)
                value = value.replace(secret, REDACTED)
        return value
    return value


def redact_env(entry, where: str, redacted: list[str]):
    if not isinstance(entry, str) or "=" not in entry:
        return entry
    key, _sep, value = entry.partition("=")
    if SECRET_ENV.search(key) and value != REDACTED:
        redacted.append("%s %s" % (where, key))
        return key + "=" + REDACTED
    return entry


def in_node(netns: str | None, argv: list[str]) -> list[str]:
    return (["ip", "netns", "exec", netns] if netns else []) + argv


def node_run(netns: str | None, argv: list[str]) -> dict:
    full = in_node(netns, argv)
    return dict(command=shlex.join(full), **run(full))


def docker_api(docker_host: str, path: str, headers: dict | None = None) -> dict:
    """One GET of the Docker Engine API with curl: the status and the JSON body, parsed. The headers are sent;
    their values are not recorded (X-Registry-Auth holds credentials)."""
    if docker_host.startswith("unix://"):
        argv = ["curl", "-sS", "-g", "--unix-socket", docker_host[len("unix://"):], "http://docker" + path]
    elif docker_host.startswith("tcp://"):
        argv = ["curl", "-sS", "-g", "http://" + docker_host[len("tcp://"):].rstrip("/") + path]
    else:
        raise SystemExit("--docker-host must start with unix:// or tcp://")
    sent = [item for key, value in (headers or {}).items() for item in ("-H", f"{key}: {value}")]
    shown = [item for key in headers or {} for item in ("-H", f"{key}: <not recorded>")]
    done = run(argv[:-1] + sent + ["-w", "\n%{http_code}", argv[-1]])
    body, _sep, status = done["stdout"].rpartition("\n")
    record = {"path": path, "command": shlex.join(argv[:-1] + shown + argv[-1:]), "rc": done["rc"], "stderr": done["stderr"],
              "status": int(status) if status.isdigit() and status != "000" else None, "body": None}
    try:
        record["body"] = json.loads(body) if body.strip() else None
    except ValueError:
        record["body_text"] = body
    return record


def record_node(args: argparse.Namespace) -> dict:
    netns = args.netns
    ip_address = node_run(netns, ["ip", "-j", "address", "show"])
    # ss right after /proc, so that both see the same listening sockets.
    proc_net_tcp = node_run(netns, ["cat", "/proc/net/tcp"])
    proc_net_tcp6 = node_run(netns, ["cat", "/proc/net/tcp6"])
    ss_listening = node_run(netns, ["ss", "-Htln"])
    # node_facts runs `iptables -w TIMEOUT -S`; the per-chain listings are for cross-checks.
    iptables = node_run(netns, ["iptables", "-w", "10", "-S"])
    iptables_chains = dict((chain, node_run(netns, ["iptables", "-w", "10", "-S", chain]))
                           for chain in args.iptables_chain)
    # The same requests as _node.docker_containers, in the same order.
    filters = quote(json.dumps({"label": [args.label]}))
    listing = docker_api(args.docker_host, "/containers/json?all=1&filters=%s" % filters)
    names = [entry["Names"][0].lstrip("/") for entry in listing["body"] or [] if entry.get("Names")] \
        if listing["status"] == 200 else []
    names += [name for name in args.container + [args.missing] if name not in names]
    inspect = dict((name, docker_api(args.docker_host, "/containers/%s/json" % quote(name, safe="")))
                   for name in names)
    # The same requests as _node.docker_images: the lab's images (by the inventory's pinned references)
    # and one the daemon does not have.
    image_refs = lab_image_refs(args.inventory) + [args.missing_image]
    images = dict((ref, docker_api(args.docker_host, "/images/%s/json" % quote(ref, safe="/:@"))) for ref in image_refs)
    record = {
        "kind": "node",
        "name": args.name,
        "recorded_at": now(),
        "situation": args.situation,
        "netns": netns,
        "docker_host": args.docker_host,
        "label": args.label,
        "missing_container": args.missing,
        "ip_address": ip_address,
        "proc_net_tcp": proc_net_tcp,
        "proc_net_tcp6": proc_net_tcp6,
        "ss_listening": ss_listening,
        "iptables": iptables,
        "iptables_chains": iptables_chains,
        "missing_image": args.missing_image,
        "docker": {"listing": listing, "inspect": inspect, "images": images},
    }
    redacted: list[str] = []
    record = redact(record, lab_secrets(args.inventory), "", redacted)
    record["redacted"] = redacted
    return record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    ray = sub.add_parser("ray")
    ray.add_argument("name")
    ray.add_argument("--docker-host", required=True)
    ray.add_argument("--container", required=True)
    ray.add_argument("--gcs-address", default="auto")
    ray.add_argument("--situation", required=True, help="what the lab looked like, in words")
    ray.add_argument("--no-ray-status", dest="ray_status", action="store_false")
    ray.add_argument("--until", help="the reader's wait, as JSON (ips, nodes, gpus, absent, raylet_grace, interval, for), "
                                     "as ray_cluster_facts passes it")
    ray.add_argument("--exec-env", action="append", default=[], metavar="KEY=VALUE",
                     help="environment of the reader's docker exec, e.g. to take a token away")
    vllm = sub.add_parser("vllm")
    vllm.add_argument("name")
    vllm.add_argument("--base-url", required=True)
    vllm.add_argument("--model", default="tiny")
    vllm.add_argument("--api-key")
    vllm.add_argument("--metrics-head", type=int, default=60)
    vllm.add_argument("--situation", required=True)
    node = sub.add_parser("node")
    node.add_argument("name")
    node.add_argument("--netns", help="the node's network namespace (ip netns exec); none: this machine")
    node.add_argument("--docker-host", required=True)
    node.add_argument("--label", default="org.gpulab.vllm.role")
    node.add_argument("--container", action="append", default=["gpulab-ray-head"], metavar="NAME",
                      help="a further container to inspect, listed or not")
    node.add_argument("--missing", default="gpulab-no-such-container",
                      help="a container name that does not exist, for the daemon's 404")
    node.add_argument("--missing-image", default="10.210.0.1:5055/gpulab/no-such-image:0",
                      help="an image reference the node does not have, for the daemon's 404")
    node.add_argument("--iptables-chain", action="append", metavar="CHAIN",
                      help="a chain to list on its own too (default: INPUT, FORWARD, OUTPUT, GPULAB-RAY, GPULAB-ABSENT)")
    node.add_argument("--inventory", type=Path, default=LAB_INVENTORY,
                      help="inventory whose %s are replaced with REDACTED" % " and ".join(LAB_SECRET_VARS))
    node.add_argument("--situation", required=True)
    args = parser.parse_args(argv)
    if args.kind == "node" and not args.iptables_chain:
        args.iptables_chain = ["INPUT", "FORWARD", "OUTPUT", "GPULAB-RAY", "GPULAB-ABSENT"]
    record = {"ray": record_ray, "vllm": record_vllm, "node": record_node}[args.kind](args)
    target = FIXTURES / args.kind / (args.name + ".json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(scrub_paths(json.dumps(record, indent=2, sort_keys=True)) + "\n")
    print("recorded %s" % target.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
