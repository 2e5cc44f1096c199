# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read and judge the state of a Ray cluster.

Private to gpulab.vllm. Three parts:

* ``GCS_READER_SCRIPT``: a small Python program run by the Ray head container's
  own interpreter (``docker exec <container> python3 -c ...``). It asks the GCS
  for the node table and the autoscaler's last report over gRPC and prints one
  JSON document. It never imports the ``ray`` package itself (0.3-0.6 s on a
  small machine); it loads only Ray's generated protobuf modules and ``grpc``.
* ``interpret_reader_run``: turns the exit code and output of that command
  (docker's own errors included) into a snapshot or a clear error.
* ``build_facts`` / ``unmet_conditions`` / ``not_ready_message``: pure
  functions that turn a snapshot into ``ansible_facts.ray_cluster`` and decide
  whether the cluster is what the caller expects.
"""

from __future__ import annotations

import json
import re

# Version of the JSON document the reader prints; bump when its shape changes.
READER_SCHEMA = 1

GCS_READER_SCRIPT = r'''
import importlib.util
import json
import os
import re
import sys
import time
import types

SCHEMA = 1
STARTED = time.monotonic()


def emit(document):
    document["reader"] = SCHEMA
    document["reader_elapsed_s"] = round(time.monotonic() - STARTED, 4)
    sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    sys.exit(0)


def fail(kind, message, **extra):
    extra["error"] = {"kind": kind, "message": message}
    emit(extra)


def discover_address(given):
    if given and given != "auto":
        return given
    env_address = os.environ.get("RAY_ADDRESS", "")
    if env_address and env_address != "auto" and "://" not in env_address:
        return env_address
    temp_dir = os.environ.get("RAY_TMPDIR") or "/tmp/ray"
    marker = os.path.join(temp_dir, "ray_current_cluster")
    try:
        with open(marker) as handle:
            address = handle.read().strip()
    except OSError as exc:
        fail("no_address", "no GCS address given and %s is unreadable (%s): is a Ray head running here?"
             % (marker, exc.strerror))
    if not address:
        fail("no_address", "%s is empty: the Ray head has not finished starting" % marker)
    return address


def read_token():
    # Same sources, same order as Ray's own token loader.
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not path and mode != "token":
        return None
    path = path or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        with open(path) as handle:
            token = handle.read().strip()
    except OSError as exc:
        fail("auth", "RAY_AUTH_MODE=%s but the token file %s is unreadable (%s)" % (mode or "unset", path, exc.strerror))
    if not token:
        fail("auth", "the token file %s is empty" % path)
    return token


def find_ray():
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        fail("ray_missing", "%s cannot import ray" % sys.executable)
    return list(spec.submodule_search_locations)[0]


def load_ray_protocol(ray_dir):
    version = None
    try:
        with open(os.path.join(ray_dir, "_version.py")) as handle:
            found = re.search(r'^version\s*=\s*"([^"]+)"', handle.read(), re.M)
            version = found.group(1) if found else None
    except OSError:
        pass
    # Register an empty "ray" package so that only ray.core.generated is
    # loaded: importing ray itself would start its whole runtime (slow).
    package = types.ModuleType("ray")
    package.__path__ = [ray_dir]
    sys.modules["ray"] = package
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2
    except Exception as exc:
        fail("ray_incompatible", "cannot load Ray's GCS protocol from %s (ray %s): %s: %s"
             % (ray_dir, version, type(exc).__name__, exc), ray_version=version)
    return grpc, gcs_service_pb2, version


def enum_name(message, field):
    value = getattr(message, field)
    return message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number[value].name


def node_record(info):
    record = {
        "node_id": info.node_id.hex(),
        "node_ip": info.node_manager_address,
        "node_name": info.node_name,
        "state": enum_name(info, "state"),
        "is_head": bool(info.is_head_node),
        "resources": dict(info.resources_total),
        "labels": dict(info.labels),
        "start_time_ms": info.start_time_ms,
        "end_time_ms": info.end_time_ms,
        "activity": None,
        "death_reason": None,
        "death_message": None,
    }
    if info.HasField("state_snapshot"):
        record["activity"] = enum_name(info.state_snapshot, "state")
    if info.HasField("death_info"):
        record["death_reason"] = enum_name(info.death_info, "reason")
        record["death_message"] = info.death_info.reason_message
    return record


def main(argv):
    ray_dir = find_ray()
    address = discover_address(argv[1] if len(argv) > 1 else "auto")
    rpc_timeout = float(argv[2]) if len(argv) > 2 else 5.0
    token = read_token()
    grpc, gcs_service_pb2, version = load_ray_protocol(ray_dir)
    metadata = [("authorization", "Bearer " + token)] if token else []
    channel = grpc.insecure_channel(address)
    get_all_nodes = channel.unary_unary(
        "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
        request_serializer=gcs_service_pb2.GetAllNodeInfoRequest.SerializeToString,
        response_deserializer=gcs_service_pb2.GetAllNodeInfoReply.FromString)
    kv_get = channel.unary_unary(
        "/ray.rpc.InternalKVGcsService/InternalKVGet",
        request_serializer=gcs_service_pb2.InternalKVGetRequest.SerializeToString,
        response_deserializer=gcs_service_pb2.InternalKVGetReply.FromString)
    until = json.loads(argv[3]) if len(argv) > 3 and argv[3] else None
    polls = 0
    while True:
        polls += 1
        document = read_once(grpc, gcs_service_pb2, get_all_nodes, kv_get, metadata, rpc_timeout, address, version)
        document["polls"] = polls
        left = until["for"] - (time.monotonic() - STARTED) if until else 0
        kind = (document.get("error") or {}).get("kind")
        if until is None or kind == "auth" or left < until["interval"] or ready(document, until):
            emit(document)
        time.sleep(until["interval"])


def read_once(grpc, gcs_service_pb2, get_all_nodes, kv_get, metadata, rpc_timeout, address, version):
    base = {"gcs_address": address, "ray_version": version}
    try:
        reply = get_all_nodes(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=rpc_timeout, metadata=metadata)
        status = kv_get(gcs_service_pb2.InternalKVGetRequest(key=b"__autoscaling_status", namespace=b""),
                        timeout=rpc_timeout, metadata=metadata)
    except grpc.RpcError as exc:
        code = exc.code()
        kind = {"UNAUTHENTICATED": "auth", "PERMISSION_DENIED": "auth"}.get(code.name, "gcs_unreachable")
        base["error"] = {"kind": kind, "message": "GCS at %s answered %s: %s" % (address, code.name, exc.details())}
        return base
    if reply.status.code != 0:
        base["error"] = {"kind": "gcs_error", "message": "GCS at %s refused the node list: %s" % (address, reply.status.message)}
        return base
    autoscaler = None
    if status.status.code == 0 and status.value:
        try:
            autoscaler = json.loads(status.value)
        except ValueError:
            autoscaler = None
    base["nodes"] = [node_record(info) for info in reply.node_info_list]
    base["autoscaler_status"] = autoscaler
    base["error"] = None
    return base


def ready(document, until):
    """The cluster has what the caller waits for (the caller checks again, with pending nodes)."""
    if document.get("error"):
        return False
    alive = [node for node in document["nodes"] if node["state"] == "ALIVE"]
    gpus = sum(float(node["resources"].get("GPU", 0)) for node in alive)
    return (set(until.get("ips") or []) <= set(node["node_ip"] for node in alive)
            and len(alive) >= (until.get("nodes") or 0) and gpus >= (until.get("gpus") or 0))


main(sys.argv)
'''

# Strings in docker's own stderr, mapped to what they mean for the caller.
_DOCKER_ERRORS = (
    ("container_missing", re.compile(r"No such container", re.I)),
    ("container_not_running", re.compile(r"is not running|is paused|is restarting", re.I)),
    ("docker_unreachable", re.compile(r"Cannot connect to the Docker daemon|connect: no such file|permission denied", re.I)),
    ("python_missing", re.compile(r"executable file not found|no such file or directory: unknown", re.I)),
)

# Reader errors after which a later poll can succeed (the head may be starting).
TRANSIENT_ERRORS = frozenset((
    "container_missing", "container_not_running", "no_address", "gcs_unreachable", "gcs_error",
))


class ReaderError(Exception):
    """The cluster state could not be read; ``kind`` says why."""

    def __init__(self, kind, message):
        super(ReaderError, self).__init__(message)
        self.kind = kind
        self.message = message

    @property
    def transient(self):
        return self.kind in TRANSIENT_ERRORS


def reader_argv(python, gcs_address, rpc_timeout, docker_cli=None, container=None, until=None):
    """The command line that runs the reader, in the container when one is named.

    With ``until`` ({"ips", "nodes", "gpus", "interval", "for"}) the reader keeps reading, every
    ``interval`` seconds for up to ``for`` seconds, until the cluster has those nodes and GPUs: one
    process and one connection for the whole wait instead of one per poll.
    """
    argv = [python, "-c", GCS_READER_SCRIPT, gcs_address or "auto", "%g" % rpc_timeout]
    if until is not None:
        argv.append(json.dumps(until, sort_keys=True))
    if container:
        return [docker_cli, "exec", container] + argv
    return argv


def interpret_reader_run(rc, stdout, stderr, where):
    """Return the reader's snapshot, or raise ReaderError saying what went wrong where."""
    stderr = (stderr or "").strip()
    if rc != 0:
        for kind, pattern in _DOCKER_ERRORS:
            if pattern.search(stderr):
                raise ReaderError(kind, "%s: %s" % (where, _last_line(stderr)))
        detail = _last_line(stderr) or _last_line(stdout) or "no output"
        raise ReaderError("reader_failed", "%s: the GCS reader exited with %d: %s" % (where, rc, detail))
    snapshot = None
    for line in reversed((stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                snapshot = json.loads(line)
            except ValueError:
                snapshot = None
            break
    if not isinstance(snapshot, dict) or snapshot.get("reader") != READER_SCHEMA:
        raise ReaderError("reader_failed", "%s: the GCS reader printed no usable JSON (stdout %r, stderr %r)"
                          % (where, _shorten(stdout), _shorten(stderr)))
    error = snapshot.get("error")
    if error:
        raise ReaderError(error.get("kind", "reader_failed"), "%s: %s" % (where, error.get("message")))
    return snapshot


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _shorten(text, limit=300):
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _pending_count(autoscaler_status):
    """Nodes the autoscaler is launching that have not registered yet.

    A cluster built with ``ray start`` on each host has no launcher, so this is
    0 there; a node that registers with the GCS is alive at once.
    """
    report = (autoscaler_status or {}).get("autoscaler_report") or {}
    pending = len(report.get("pending_nodes") or [])
    pending += sum(int(count) for count in (report.get("pending_launches") or {}).values())
    return pending


def _failures(nodes, autoscaler_status):
    failures = []
    for node in nodes:
        if node["alive"]:
            continue
        failures.append({
            "source": "gcs",
            "node_id": node["node_id"],
            "node_ip": node["node_ip"],
            "reason": node.get("death_reason"),
            "message": node.get("death_message") or "",
        })
    report = (autoscaler_status or {}).get("autoscaler_report") or {}
    for entry in report.get("failed_nodes") or []:
        ip, node_type = (list(entry) + [None, None])[:2]
        failures.append({
            "source": "autoscaler",
            "node_id": None,
            "node_ip": ip,
            "reason": "LAUNCH_FAILED",
            "message": "autoscaler failed to launch node type %s" % node_type,
        })
    return failures


def _sum_resources(nodes):
    totals = {}
    for node in nodes:
        for name, amount in node["resources"].items():
            totals[name] = totals.get(name, 0.0) + amount
    return totals


def _public_resources(resources):
    # node:<ip> and node:__internal_head__ are Ray's per-node markers, not capacity.
    return dict((name, amount) for name, amount in resources.items() if not name.startswith("node:"))


def build_facts(snapshot, expected_node_ips=None, waited=False, elapsed=0.0, polls=1):
    """Turn a reader snapshot into the ``ray_cluster`` fact."""
    nodes = []
    for raw in snapshot.get("nodes") or []:
        nodes.append({
            "node_id": raw["node_id"],
            "node_ip": raw["node_ip"],
            "alive": raw["state"] == "ALIVE",
            "is_head": bool(raw.get("is_head")),
            "state": raw["state"],
            "resources": _public_resources(raw.get("resources") or {}),
            "death_reason": raw.get("death_reason"),
            "death_message": raw.get("death_message"),
        })
    # Alive first, head first, then by address, so output is stable.
    nodes.sort(key=lambda n: (not n["alive"], not n["is_head"], _ip_key(n["node_ip"]), n["node_id"]))
    alive = [n for n in nodes if n["alive"]]
    alive_ips = set(n["node_ip"] for n in alive)
    expected = list(expected_node_ips or [])
    totals = _sum_resources(alive)
    facts = {
        "ray_version": snapshot.get("ray_version"),
        "gcs_address": snapshot.get("gcs_address"),
        "alive_nodes": len(alive),
        "dead_nodes": len(nodes) - len(alive),
        "pending_nodes": _pending_count(snapshot.get("autoscaler_status")),
        "nodes": [_without_death_details(n) for n in nodes],
        "total_resources": totals,
        "gpus": float(totals.get("GPU", 0.0)),
        "missing_node_ips": [ip for ip in expected if ip not in alive_ips],
        "unexpected_node_ips": sorted((alive_ips - set(expected)) if expected else set(), key=_ip_key),
        "failures": _failures(nodes, snapshot.get("autoscaler_status")),
        "wait": {"waited": bool(waited), "elapsed": round(float(elapsed), 3), "polls": int(polls)},
    }
    return facts


def empty_facts(gcs_address, expected_node_ips=None, waited=False, elapsed=0.0, polls=0):
    """Facts for a cluster that could not be read at all."""
    return build_facts({"gcs_address": gcs_address, "nodes": []}, expected_node_ips, waited, elapsed, polls)


def _without_death_details(node):
    return dict((k, v) for k, v in node.items() if k not in ("death_reason", "death_message"))


def _ip_key(ip):
    try:
        return (0, tuple(int(part) for part in ip.split(".")), ip)
    except (AttributeError, ValueError):
        return (1, (), str(ip))


def unmet_conditions(facts, expected_node_ips=None, expected_nodes=None, expected_gpus=None):
    """What keeps the cluster from being ready, as short phrases; empty when ready."""
    unmet = []
    if expected_node_ips and facts["missing_node_ips"]:
        unmet.append("missing node(s) %s" % ", ".join(facts["missing_node_ips"]))
    if expected_nodes is not None and facts["alive_nodes"] < expected_nodes:
        unmet.append("%d of %d expected node(s) alive" % (facts["alive_nodes"], expected_nodes))
    if facts["pending_nodes"]:
        unmet.append("%d node(s) pending" % facts["pending_nodes"])
    if expected_gpus is not None and facts["gpus"] < expected_gpus:
        unmet.append("GPUs %s of %s expected" % (_number(facts["gpus"]), _number(expected_gpus)))
    return unmet


def describe_alive(facts):
    """'10.220.0.11 (head, GPU 1), 10.220.0.12 (GPU 1)' or 'none'."""
    parts = []
    for node in facts["nodes"]:
        if not node["alive"]:
            continue
        tags = ["head"] if node["is_head"] else []
        tags.append("GPU %s" % _number(node["resources"].get("GPU", 0)))
        parts.append("%s (%s)" % (node["node_ip"], ", ".join(tags)))
    return ", ".join(parts) if parts else "none"


def not_ready_message(facts, unmet, where, last_error=None):
    """One line for a wait that timed out."""
    wait = facts["wait"]
    address = facts.get("gcs_address") or "(address not discovered yet)"
    text = "Ray cluster at %s (%s) not ready after %ss (%d polls): " % (
        address, where, _number(round(wait["elapsed"], 1)), wait["polls"])
    reasons = list(unmet)
    if last_error is not None:
        reasons.insert(0, "last read failed: %s" % last_error)
    text += "; ".join(reasons) if reasons else "no reason recorded"
    text += "; alive: %s" % describe_alive(facts)
    alive_ips = set(n["node_ip"] for n in facts["nodes"] if n["alive"])
    # A node that died and came back under a new ID is not news here.
    dead = [f for f in facts["failures"] if f["source"] == "gcs" and f["node_ip"] not in alive_ips]
    if dead:
        text += "; dead: %s" % ", ".join("%s (%s)" % (f["node_ip"], f["reason"]) for f in dead)
    return text


def _number(value):
    value = float(value)
    return "%d" % value if value.is_integer() else "%g" % value
