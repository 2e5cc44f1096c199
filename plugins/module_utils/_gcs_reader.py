# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GCS reader: reads a Ray cluster's node table and autoscaler report, and says whether it is ready.

Private to gpulab.vllm. Two uses of one file:

* Run as a program by the Ray head container's own interpreter (``docker exec <container> python3
  -c <this file's source> ADDRESS RPC_TIMEOUT [UNTIL]``): it asks the GCS over gRPC and prints one
  JSON document (schema ``SCHEMA``). It never imports the ``ray`` package itself (0.3-0.6 s on a
  small machine); it loads only Ray's generated protobuf modules and ``grpc``. With ``UNTIL``
  (JSON: ``ips``, ``nodes``, ``gpus``, ``interval``, ``for``) it keeps reading until the cluster is
  ready or the time is up, and says which in ``ready``.
* Imported by the collection (``_ray_state``, ``gpulab.vllm.ray_cluster_facts``) and the benchmark
  for ``shortfalls``, the one rule of what a ready cluster is, and for its own source.

Standard library only at import time, so that it imports anywhere; Python 2.7 and 3.5+ syntax.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import sys
import time
import types

# Version of the JSON document the reader prints; bump when its shape changes.
SCHEMA = 1
_STARTED = [time.monotonic()]


def emit(document):
    document["reader"] = SCHEMA
    document["reader_elapsed_s"] = round(time.monotonic() - _STARTED[0], 4)
    document["read_at"] = time.time()
    sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    # The reader ends here, as a program (it never runs inside a module's process).
    raise SystemExit(0)


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
    import importlib.util

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
        # Where the node's raylet listens: a raylet that stopped answering here is gone before the GCS says so.
        "node_manager_port": info.node_manager_port,
        "object_manager_port": info.object_manager_port,
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
    _STARTED[0] = time.monotonic()
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
    # Since when (epoch seconds) each node's raylet has been silent, as earlier reads of the same wait saw it: a wait
    # runs in slices, each its own reader.
    silent_since = dict((node_id, float(since)) for node_id, since in ((until or {}).get("silent") or {}).items())
    while True:
        polls += 1
        document = read_once(grpc, gcs_service_pb2, get_all_nodes, kv_get, metadata, rpc_timeout, address, version)
        document["polls"] = polls
        if until is None:
            emit(document)
        grace = until.get("raylet_grace") or 0
        if grace > 0 and not document.get("error"):
            document["blocked"] = knock_raylets(alive_nodes(document["nodes"]), silent_since, grace)
        left = until["for"] - (time.monotonic() - _STARTED[0])
        kind = (document.get("error") or {}).get("kind")
        document["ready"] = not document.get("error") and not shortfalls(
            alive_nodes(document["nodes"]), pending_count(document.get("autoscaler_status")), until)
        if kind == "auth" or left < until["interval"] or document["ready"] or document.get("blocked"):
            emit(document)
        time.sleep(until["interval"])


def knock_raylets(alive, silent_since, grace):
    """TCP-connect from here (the head's host) to each alive node's raylet, as the GCS and the head's workers must.

    Sets each node's "raylet_error" (None when it answered) and, while it is silent, since when (epoch seconds, from
    silent_since: node ID -> epoch, which it keeps up to date) and for how long. A refused port is a raylet gone that the GCS will soon
    declare dead: only a shortfall. A port that stays silent otherwise (timed out, unreachable), as behind a firewall
    that drops the head's packets, blocks the cluster for good once it lasts `grace` seconds: returns those nodes."""
    import socket

    blocked = []
    for node in alive:
        port = node.get("node_manager_port")
        if not port:
            continue
        tried = time.time()
        error = None
        try:
            socket.create_connection((node["node_ip"], port), min(1.0, grace)).close()
        except socket.timeout:
            error = "timed out"
        except (OSError, socket.error) as exc:
            error = getattr(exc, "strerror", None) or str(exc)
        node["raylet_error"] = error
        if error is None or error == "Connection refused":
            silent_since.pop(node["node_id"], None)
            continue
        first = silent_since.setdefault(node["node_id"], tried)
        node["raylet_silent_since"] = first
        node["raylet_silent_s"] = round(time.time() - first, 1)
        if time.time() - first >= grace:
            blocked.append(node["node_id"])
    return blocked


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


def alive_nodes(nodes):
    """The nodes of a reader document that the GCS calls alive."""
    return [node for node in nodes or [] if node["state"] == "ALIVE"]


def pending_count(autoscaler_status):
    """Nodes the autoscaler is launching that have not registered yet.

    A cluster built with ``ray start`` on each host has no launcher, so this is
    0 there; a node that registers with the GCS is alive at once.
    """
    report = (autoscaler_status or {}).get("autoscaler_report") or {}
    pending = len(report.get("pending_nodes") or [])
    pending += sum(int(count) for count in (report.get("pending_launches") or {}).values())
    return pending


def number(value):
    """1.0 -> '1', 0.5 -> '0.5'."""
    value = float(value)
    return "%d" % value if value.is_integer() else "%g" % value


def shortfalls(alive, pending, until):
    """What keeps a cluster from being ready, as short phrases; empty when it is.

    alive: the alive nodes ({"node_ip", "resources"}); pending: nodes being launched;
    until: what is expected, {"ips": [...], "nodes": N, "gpus": G, "absent": [...]}, each optional; "absent" are
    addresses that no alive node may have (a worker about to start again, whose old Ray node must be declared dead
    first). The one rule of readiness: the reader's wait, the facts module, the supervisor and the benchmark use it.
    """
    until = until or {}
    phrases = []
    seen = [node["node_ip"] for node in alive]
    alive_ips = set(seen)
    missing = [ip for ip in until.get("ips") or [] if ip not in alive_ips]
    if missing:
        phrases.append("missing node(s) %s" % ", ".join(missing))
    # A worker whose Ray restarted is listed twice until the GCS declares its old node dead (its health checks take
    # about 15 s): its GPU is counted twice, and a placement group may be given the old node.
    twice = sorted(set(ip for ip in seen if seen.count(ip) > 1))
    if twice:
        phrases.append("node(s) %s listed twice (an old Ray node not yet declared dead)" % ", ".join(twice))
    stale = [ip for ip in until.get("absent") or [] if ip in alive_ips]
    if stale:
        phrases.append("node(s) %s still listed alive (an old Ray node not yet declared dead)" % ", ".join(stale))
    # A reader document's node has its port; a node of the facts module, the raylet's address.
    silent = ["%s (%s)" % (node.get("raylet_address") or "%s:%s" % (node["node_ip"], node.get("node_manager_port")),
                           node["raylet_error"]) for node in alive if node.get("raylet_error")]
    if silent:
        phrases.append("raylet(s) at %s do not answer from the head" % ", ".join(silent))
    if until.get("nodes") is not None and len(alive) < until["nodes"]:
        phrases.append("%d of %d expected node(s) alive" % (len(alive), until["nodes"]))
    if pending:
        phrases.append("%d node(s) pending" % pending)
    gpus = sum(float(node["resources"].get("GPU", 0)) for node in alive)
    if until.get("gpus") is not None and gpus < until["gpus"]:
        phrases.append("GPUs %s of %s expected" % (number(gpus), number(until["gpus"])))
    return phrases


def source():
    """This file's text, to run in a container with ``python3 -c``."""
    import inspect

    try:
        return inspect.getsource(sys.modules[__name__])
    except (IOError, OSError, TypeError):
        with open(__file__) as handle:
            return handle.read()


if __name__ == "__main__":
    main(sys.argv)
