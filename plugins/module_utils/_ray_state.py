# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read and judge the state of a Ray cluster.

Private to gpulab.vllm. Three parts:

* ``reader_argv``: the command that runs the GCS reader (``_gcs_reader``, a file
  of its own) with the Ray head container's own interpreter.
* ``interpret_reader_run``: turns the exit code and output of that command
  (docker's own errors included) into a snapshot or a clear error.
* ``build_facts`` / ``unmet_conditions`` / ``not_ready_message``: pure
  functions that turn a snapshot into ``ansible_facts.ray_cluster`` and decide
  whether the cluster is what the caller expects.
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpulab.vllm.plugins.module_utils._gcs_reader import SCHEMA as READER_SCHEMA
from ansible_collections.gpulab.vllm.plugins.module_utils._gcs_reader import number as _number
from ansible_collections.gpulab.vllm.plugins.module_utils._gcs_reader import pending_count as _pending_count
from ansible_collections.gpulab.vllm.plugins.module_utils._gcs_reader import shortfalls
from ansible_collections.gpulab.vllm.plugins.module_utils._gcs_reader import source as reader_source

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
    argv = [python, "-c", reader_source(), gcs_address or "auto", "%g" % rpc_timeout]
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
            # Set only by a wait with raylet_grace: what a TCP connect from the head to the node's raylet met.
            "raylet_error": raw.get("raylet_error"),
            "raylet_address": "%s:%s" % (raw["node_ip"], raw["node_manager_port"]) if raw.get("node_manager_port") else None,
            "raylet_silent_s": raw.get("raylet_silent_s"),
            "raylet_silent_since": raw.get("raylet_silent_since"),
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
        "unreachable_raylets": [
            {"node_id": n["node_id"], "node_ip": n["node_ip"], "address": n["raylet_address"], "error": n["raylet_error"],
             "silent_s": n["raylet_silent_s"], "silent_since": n["raylet_silent_since"],
             "blocked": n["node_id"] in (snapshot.get("blocked") or [])}
            for n in nodes if n["alive"] and n["raylet_error"]],
        "wait": {"waited": bool(waited), "elapsed": round(float(elapsed), 3), "polls": int(polls)},
    }
    return facts


def empty_facts(gcs_address, expected_node_ips=None, waited=False, elapsed=0.0, polls=0):
    """Facts for a cluster that could not be read at all."""
    return build_facts({"gcs_address": gcs_address, "nodes": []}, expected_node_ips, waited, elapsed, polls)


def _without_death_details(node):
    return dict((k, v) for k, v in node.items()
                if k not in ("death_reason", "death_message", "raylet_silent_s", "raylet_silent_since"))


def _ip_key(ip):
    try:
        return (0, tuple(int(part) for part in ip.split(".")), ip)
    except (AttributeError, ValueError):
        return (1, (), str(ip))


def unmet_conditions(facts, expected_node_ips=None, expected_nodes=None, expected_gpus=None, absent_node_ips=None):
    """What keeps the cluster from being ready, as short phrases; empty when ready (the reader's rule)."""
    alive = [node for node in facts["nodes"] if node["alive"]]
    until = {"ips": expected_node_ips or [], "nodes": expected_nodes, "gpus": expected_gpus,
             "absent": absent_node_ips or []}
    return shortfalls(alive, facts["pending_nodes"], until)


def blocked_message(facts, where, names=None):
    """One line for a wait that ended because a node's raylet stays silent to the head: it will never join.
    names maps a node's address to the name the caller knows it by (an inventory host)."""
    names = names or {}
    blocked = [r for r in facts["unreachable_raylets"] if r["blocked"]]
    return ("Ray cluster at %s (%s): %s joined, but the head cannot reach %s (%s): something between them drops "
            "Ray's ports (a firewall rule on the node or on the way), so nothing can be scheduled there; let the head "
            "reach each such node's Ray ports on the fabric (its raylet's, and its object manager's beside it)" % (
                facts.get("gcs_address"), where,
                ", ".join("%s (%s)" % (names[r["node_ip"]], r["node_ip"]) if names.get(r["node_ip"]) else r["node_ip"]
                          for r in blocked),
                "its raylet" if len(blocked) == 1 else "their raylets",
                "; ".join("%s %s for %ss" % (r["address"], r["error"], _number(r["silent_s"] or 0)) for r in blocked)))


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
