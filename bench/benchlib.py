# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What bench/run.py and bench/floor.py share: the lab's nodes, docker on a node, container specs.

A container spec is what `docker inspect` says a container was started with, reduced to what
`docker run` takes (image, entrypoint, command, environment, mounts, network, IPC, shm, ulimits,
labels, restart policy, devices). Secrets in it (the vLLM API key in the environment, the Ray
token file) are replaced by the name of the inventory variable that holds them, so a spec can be
written to disk and replayed by the floor, which puts the values back from the inventory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "inventories" / "local_lab" / "hosts.yml"
# Inventory variables whose values must never be printed or written.
SECRET_VARS = ("ray_cluster_auth_token", "vllm_server_api_key")
# The container label the roles put on everything they start, and the start order it implies.
ROLE_LABEL = "org.gpulab.vllm.role"
ROLE_ORDER = {"ray-head": 0, "ray-worker": 1, "vllm-server": 2}
FIREWALL_CHAIN = "GPULAB-INPUT"


def load_module(name: str, path: Path):
    """Import a Python file of the collection or the lab by path (they are not on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses look their module up in sys.modules.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def gcs_reader_source(collection: Path) -> str:
    """The GCS reader of a collection tree: its own file, or (commits before it had one) the string in _ray_state."""
    reader = collection / "plugins" / "module_utils" / "_gcs_reader.py"
    if reader.exists():
        return reader.read_text()
    return load_module("_ray_state", collection / "plugins" / "module_utils" / "_ray_state.py").GCS_READER_SCRIPT


def reader_nodes(stdout: str) -> list[dict]:
    """The node table of a GCS reader run's last line; an error of the reader is raised."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError("the GCS reader printed no JSON")
    document = json.loads(lines[-1])
    if document.get("error"):
        raise RuntimeError("the GCS reader failed: %s" % document["error"])
    return document["nodes"]


# --------------------------------------------------------------------------- the lab's nodes

@dataclass(frozen=True)
class Node:
    name: str
    mgmt_ip: str
    fabric_ip: str
    is_head: bool
    docker_host: str
    netns: str


def read_inventory(path: Path = INVENTORY) -> dict:
    import yaml  # the benchmarks run with the project's virtual environment

    return yaml.safe_load(path.read_text())


def lab_nodes(inventory: dict) -> list[Node]:
    """The lab's nodes, head first, with each node's own Docker socket and network namespace."""
    labctl = load_module("labctl", ROOT / "lab" / "labctl.py")
    children = inventory["all"]["children"]
    heads = children["ray_head"]["hosts"] or {}
    workers = (children.get("ray_workers") or {}).get("hosts") or {}
    nodes = []
    for name, hostvars in list(heads.items()) + list(workers.items()):
        nodes.append(Node(
            name=name, mgmt_ip=hostvars["ansible_host"], fabric_ip=hostvars["lab_fabric_ip"], is_head=name in heads,
            docker_host="unix://%s" % (labctl.node_dirs(name)["run"] / "docker.sock"), netns=labctl.netns_path(name)))
    return nodes


def inventory_secrets(inventory: dict) -> dict:
    values = inventory["all"]["vars"]
    return {name: values[name] for name in SECRET_VARS if values.get(name)}


def docker(node: Node, *args: str, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", "-H", node.docker_host, *args], capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError("docker -H %s %s failed (%d): %s" % (node.docker_host, args[0], proc.returncode, proc.stderr.strip()[-300:]))
    return proc


def in_netns(node: Node, argv: list[str], check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run a command in the node's network namespace (nsenter keeps the machine's mounts)."""
    return subprocess.run(["nsenter", "--net=%s" % node.netns, "--", *argv], capture_output=True, text=True, check=check, **kw)


# --------------------------------------------------------------------------- container specs

def _mask(value: str, secrets: dict) -> str | dict:
    for name, secret in secrets.items():
        if value == secret:
            return {"secret": name}
    return value


def _unmask(value, secrets: dict) -> str:
    if isinstance(value, dict):
        return secrets[value["secret"]]
    return value


def _namespace_mode(mode: str | None, names: dict) -> str | None:
    """'container:<id>' as 'container:<name>' (the ID changes with every start, the name does not)."""
    if mode and mode.startswith("container:"):
        ref = mode.split(":", 1)[1]
        return "container:" + names.get(ref, ref)
    return mode or None


def container_spec(inspect: dict, secrets: dict, secret_files: dict | None = None, names: dict | None = None) -> dict:
    """Reduce one `docker inspect` document to what `docker run` needs, secrets masked.

    secret_files maps a host path to the inventory variable whose value the file holds;
    names maps the IDs of the node's containers to their names.
    """
    config, host = inspect["Config"], inspect["HostConfig"]
    env = []
    for item in config.get("Env") or []:
        key, value = item.split("=", 1) if "=" in item else (item, "")
        env.append([key, _mask(value, secrets)])
    binds = list(host.get("Binds") or [])
    for mount in host.get("Mounts") or []:
        binds.append("%s:%s%s" % (mount.get("Source", ""), mount["Target"], ":ro" if mount.get("ReadOnly") else ""))
    files = []
    for bind in binds:
        source = bind.split(":", 1)[0]
        if secret_files and source in secret_files:
            files.append({"path": source, "secret": secret_files[source]})
    return {
        "name": inspect["Name"].lstrip("/"),
        "role": (config.get("Labels") or {}).get(ROLE_LABEL),
        "image": config["Image"],
        "entrypoint": list(config.get("Entrypoint") or []),
        "command": list(config.get("Cmd") or []),
        "env": sorted(env, key=lambda pair: pair[0]),
        "binds": binds,
        "network": host.get("NetworkMode"),
        "ipc": _namespace_mode(host.get("IpcMode"), names or {}),
        "pid": _namespace_mode(host.get("PidMode"), names or {}),
        "shm_size": host.get("ShmSize"),
        # Sorted: docker keeps the order they were given in, which is not part of the container's setup.
        "ulimits": sorted("%s=%s:%s" % (u["Name"], u["Soft"], u["Hard"]) for u in host.get("Ulimits") or []),
        "labels": dict(sorted((config.get("Labels") or {}).items())),
        "restart": (host.get("RestartPolicy") or {}).get("Name") or "no",
        "devices": ["%s:%s:%s" % (d["PathOnHost"], d["PathInContainer"], d["CgroupPermissions"]) for d in host.get("Devices") or []],
        "gpus": bool(host.get("DeviceRequests")),
        "secret_files": files,
    }


def run_argv(spec: dict, secrets: dict) -> list[str]:
    """`docker run -d ...` arguments that start the container the spec describes."""
    argv = ["run", "-d", "--name", spec["name"], "--network", spec["network"], "--restart", spec["restart"]]
    if spec["ipc"]:
        argv += ["--ipc", spec["ipc"]]
    if spec.get("pid"):
        argv += ["--pid", spec["pid"]]
    if spec["shm_size"]:
        argv += ["--shm-size", "%db" % spec["shm_size"]]
    for ulimit in spec["ulimits"]:
        argv += ["--ulimit", ulimit]
    for device in spec["devices"]:
        argv += ["--device", device]
    if spec["gpus"]:
        argv += ["--gpus", "all"]
    for bind in spec["binds"]:
        argv += ["--volume", bind]
    for key, value in spec["env"]:
        argv += ["--env", "%s=%s" % (key, _unmask(value, secrets))]
    for key, value in spec["labels"].items():
        argv += ["--label", "%s=%s" % (key, value)]
    entrypoint = spec["entrypoint"]
    if entrypoint:
        argv += ["--entrypoint", entrypoint[0]]
    return argv + [spec["image"]] + entrypoint[1:] + spec["command"]


def record_containers(node: Node, secrets: dict, secret_files: dict) -> list[dict]:
    """Specs of the containers the roles started on a node, in the order they are started."""
    ids = docker(node, "ps", "-q", "--filter", "label=" + ROLE_LABEL).stdout.split()
    if not ids:
        return []
    inspected = json.loads(docker(node, "inspect", *ids).stdout)
    names = {doc["Id"]: doc["Name"].lstrip("/") for doc in inspected}
    specs = [container_spec(doc, secrets, secret_files, names) for doc in inspected]
    return sorted(specs, key=lambda s: (ROLE_ORDER.get(s["role"], 9), s["name"]))


def find_secret_files(paths: list[str], secrets: dict) -> dict:
    """Which of these host files hold one of the inventory's secrets (compared, never printed)."""
    found = {}
    for path in paths:
        try:
            content = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError):
            continue
        for name, secret in secrets.items():
            if content == secret:
                found[path] = name
    return found


def firewall_rules(iptables_save: str) -> list[list[str]]:
    """The roles' firewall as iptables argument lists: the chain, its rules, then the jumps into it.

    iptables_save is the output of `iptables -S`; the jump from INPUT is replayed with -I as the role inserts it.
    """
    chain, rules, jumps = [], [], []
    for line in iptables_save.splitlines():
        words = shlex.split(line)
        if words[:2] == ["-N", FIREWALL_CHAIN]:
            chain.append(words)
        elif words[:2] == ["-A", FIREWALL_CHAIN]:
            rules.append(words)
        elif len(words) > 2 and words[0] == "-A" and words[-2:] == ["-j", FIREWALL_CHAIN]:
            jumps.append(["-I"] + words[1:])
    return chain + rules + jumps


def expected_cluster(specs: list[dict]) -> dict:
    """Nodes, GPUs and the head's GCS address that the Ray containers of a spec add up to."""
    ray = [s for s in specs if s["role"] in ("ray-head", "ray-worker")]
    gpus, head = 0.0, None
    for spec in ray:
        options = dict(arg[2:].split("=", 1) for arg in spec["command"] if arg.startswith("--") and "=" in arg)
        gpus += float(options.get("num-gpus", 0))
        if spec["role"] == "ray-head":
            head = "%s:%s" % (options["node-ip-address"], options.get("port", "6379"))
    return {"nodes": len(ray), "gpus": gpus, "gcs_address": head}


def vllm_endpoint(spec: dict) -> dict:
    """Port and served model name of a vLLM server spec (`vllm serve MODEL --opt value ...`)."""
    command = spec["command"]
    options = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    model = options.get("--served-model-name") or command[1]
    return {"port": int(options.get("--port", 8000)), "model": model}


# --------------------------------------------------------------------------- numbers and the machine

def summary(values: list[float]) -> dict:
    """Median, min, max and count; empty values give None everywhere but n."""
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _first_line(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def _version(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None


def machine_description(head: Node | None) -> dict:
    venv = ROOT / ".venv" / "bin"
    manifest = next(iter(sorted((ROOT / ".venv" / "lib").glob("python3*/site-packages/ansible_collections/community/docker/MANIFEST.json"))), None)
    mem_kb = _first_line("/proc/meminfo", "MemTotal")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(mem_kb.split()[0]) / 1024 / 1024, 1) if mem_kb else None,
        "cpu_model": _first_line("/proc/cpuinfo", "model name"),
        "kernel": platform.release(),
        "os": _first_line("/etc/os-release", "PRETTY_NAME="),
        "python": platform.python_version(),
        "ansible_core": _version([str(venv / "python"), "-c", "import ansible.release as r; print(r.__version__)"]),
        "community_docker": json.loads(manifest.read_text())["collection_info"]["version"] if manifest else None,
        "docker_daemon": _version(["docker", "-H", head.docker_host, "version", "--format", "{{.Server.Version}}"]) if head else None,
        "docker_client": _version(["docker", "version", "--format", "{{.Client.Version}}"]),
        "git_head": _version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    }
