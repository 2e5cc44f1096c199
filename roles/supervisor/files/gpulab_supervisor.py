# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gang supervisor: brings a node's part of the Ray cluster and the vLLM server back, in order, after a crash
or a reboot, without a play.

One per node, in a container that Docker restarts itself (restart policy unless-stopped), with the node's Docker
socket. The containers it watches run with no restart policy of their own, so that nothing starts out of order:

* on a worker: its Ray container is started again once the head's GCS port answers and the head's GCS no longer
  lists its old Ray node alive (read from this supervisor's own container); a worker that the head's cluster no
  longer lists (the head restarted) is restarted at once rather than after Ray's own timeout;
* on the head: the Ray head first; then the same gate as the deploy (every node's fabric address and every GPU
  alive in Ray, read with the collection's GCS reader in the head container); only then the vLLM server. A server
  whose cluster lost a node it was started with (a worker restarted alone) is stopped and started again through
  the gate, never left with a broken engine.

It watches the node's fabric while it serves: every interval it reads the fabric interface's link and MTU and, on
RDMA, each of the fabric's ports (its state, and the GID the deploy found for NCCL), and compares them with what the
deploy proved. A change is logged and kept in ``state.json``; while it lasts, the node's part of the gang stays down
(a worker stops its Ray, the head its server: a server stopped rather than a collective hung on a broken link), and
once the fabric is as deployed again the gang comes back the usual way. Before the head starts a server again it
runs the deploy's collective check (one all-reduce across every GPU, each node's link to the head) and judges it
with the collection's own rule, so the server starts only on a fabric that carried a collective again.

Before it starts anything it makes sure the host firewall the deploy wrote (the chain GPULAB-INPUT and its jump
first in INPUT) is in place, and writes it again when a reboot or a firewall reload cleared it, with the host's own
iptables; nothing starts while that fails.

It does nothing while a deploy holds it (the file ``hold`` in its folder, with the time the hold ends), and it
never creates or removes a container: that stays the deploy's job. Every action and its reason goes to its log
and to ``state.json`` (restart counts, the last events, the phase), which the status playbook shows.

Standard library only; the Python of the Ray image runs it.
"""

from __future__ import absolute_import, division, print_function

import calendar
import json
import os
import socket
import struct
import subprocess
import sys
import time
import types

try:
    import http.client as http_client
except ImportError:  # pragma: no cover - Python 2 is not a target of this program
    import httplib as http_client  # type: ignore

EVENTS_KEPT = 30
# Starts of one container within this many seconds count towards its backoff.
BACKOFF_WINDOW = 1800
# Seconds between two checks that the head's cluster lists a running worker.
MEMBER_EVERY = 15
# Seconds a stopped worker waits before it starts again when the head's GCS cannot be read: longer than Ray's health
# checks take to declare its old node dead (about 15 s with Ray's defaults).
OLD_NODE_GRACE = 30
# Seconds a worker's Ray container is given to stop when the fabric changed under it.
FABRIC_STOP_GRACE = 3


# --- what a container's state says --------------------------------------------------------------------------------

def container_state(inspect):
    """The few facts of a ``docker inspect`` document the decisions need; None for a missing container."""
    if inspect is None:
        return None
    state = inspect.get("State") or {}
    return {
        "id": inspect.get("Id", "")[:12],
        "running": bool(state.get("Running")),
        "status": state.get("Status"),
        "exit_code": state.get("ExitCode"),
        "oom_killed": bool(state.get("OOMKilled")),
        "error": state.get("Error") or "",
        "started_at": state.get("StartedAt"),
        "finished_at": state.get("FinishedAt"),
    }


def why_stopped(state):
    """One phrase for why a container is not running: exit code, OOM, killed, never started."""
    if state is None:
        return "missing"
    if state.get("status") == "created":
        return "created but never started"
    code = state.get("exit_code")
    parts = []
    if state.get("oom_killed"):
        parts.append("killed for memory (OOM)")
    elif code == 137:
        parts.append("killed (exit 137)")
    elif code == 143:
        parts.append("stopped (exit 143, SIGTERM)")
    elif code is not None:
        parts.append("exited with code %s" % code)
    if state.get("error"):
        parts.append(state["error"])
    finished = state.get("finished_at") or ""
    if finished and not finished.startswith("0001-"):
        parts.append("at %s" % finished[:19].replace("T", " "))
    return ", ".join(parts) or "not running"


# --- the gate -----------------------------------------------------------------------------------------------------

def alive(document):
    return [node for node in (document or {}).get("nodes") or [] if node.get("state") == "ALIVE"]


# The collection's GCS reader (gcs_reader.py beside this program, the gate's own): its shortfalls() is the one rule
# of a ready cluster. load_reader() fills it in.
READER = types.ModuleType("gcs_reader")


def load_reader(source):
    exec(compile(source, "gcs_reader.py", "exec"), READER.__dict__)  # pylint: disable=exec-used


def shortfalls(document, expect, silent=()):
    """What keeps the cluster from being whole, as phrases: the gate's rule (the reader's), and what only a cluster
    that was whole before can show; ["..."] when the GCS could not be read.

    silent: "ip:port" of alive nodes whose raylet did not answer a TCP connect: gone, though the GCS has not
    declared them dead yet (it takes its health checks' time), so the cluster is not whole."""
    if document is None:
        return ["no read of the cluster"]
    if document.get("error"):
        return [document["error"].get("message") or "the GCS could not be read"]
    nodes = alive(document)
    phrases = []
    if silent:
        phrases.append("raylet(s) at %s do not answer (gone; Ray has not declared them dead yet)" % ", ".join(silent))
    # Nodes started with `ray start` have no launcher: nothing is ever pending.
    return phrases + READER.shortfalls(nodes, 0, expect)


def members(document):
    """node IP -> node ID of the alive nodes: the gang the server was started with."""
    return dict((node["node_ip"], node["node_id"]) for node in alive(document))


def gang_broken(started_with, document):
    """Phrases naming the nodes the server was started with that the cluster no longer has, alive as they were
    (a node ID changes when its Ray restarts, even at the same address); empty when the gang is as it was."""
    if not started_with or document is None or document.get("error"):
        return []
    now = members(document)
    phrases = []
    for ip, node_id in sorted(started_with.items()):
        if ip not in now:
            phrases.append("node %s left the cluster" % ip)
        elif now[ip] != node_id:
            phrases.append("node %s rejoined as a new Ray node (its Ray restarted)" % ip)
    return phrases


# --- decisions ----------------------------------------------------------------------------------------------------

def raylets(document):
    """"ip:port" of every alive node's raylet, for a TCP check before the gate passes."""
    return ["%s:%s" % (node["node_ip"], node["node_manager_port"]) for node in alive(document)
            if node.get("node_manager_port")]


def decide_head(head, server, serve, document, expect, started_with, silent=(), settled=True):
    """What the head's supervisor does next: a list of (action, container-kind, reason), and the gang to remember.

    head/server: container_state() results; document: the last reader document (None when not read);
    started_with: node IP -> node ID the running server was started with (None when unknown).
    Actions: 'start', 'stop', 'wait', 'adopt' (remember the current gang: a healthy server found running).
    """
    if head is None:
        return [("wait", "head", "the Ray head container is missing; re-run the deploy")], None
    if not head["running"]:
        actions = []
        if server is not None and server["running"]:
            actions.append(("stop", "server", "the Ray head under it stopped"))
        actions.append(("start", "head", why_stopped(head)))
        return actions, None
    if not serve:
        return [], None
    if server is None:
        return [("wait", "server", "the vLLM server container is missing; re-run the deploy")], None
    short = shortfalls(document, expect, silent)
    if server["running"]:
        if document is None or document.get("error"):
            return [], started_with  # no evidence either way: a serving server is never stopped on a failed read
        if started_with is None:
            if short:
                return [("stop", "server", "the cluster under it is not whole: " + "; ".join(short))], None
            return [("adopt", "server", "running on a whole cluster")], members(document)
        broken = gang_broken(started_with, document)
        if broken:
            return [("stop", "server", "; ".join(broken))], None
        return [], started_with
    if short:
        return [("wait", "gate", "; ".join(short))], None
    if not settled:
        # A worker whose Ray restarted can listen again at its old address a moment before the GCS lists it as a new
        # node and declares the old one dead: the same whole cluster, read again after a pause, is the one to trust.
        return [("wait", "gate", "the cluster looks whole; waiting for it to hold steady")], None
    return [("start", "server", "gate passed after the server " + why_stopped(server))], members(document)


def decide_worker(worker, head_reachable, document, own_ip, running_for, grace, stopped_for=None):
    """What a worker's supervisor does next: a list of (action, kind, reason).

    document: a read of the head's cluster (None when not read): from this worker's container while it runs, from
    the supervisor's own while it is stopped; own_ip: this node's fabric address; running_for: seconds the worker
    container has run (None when not running); stopped_for: seconds since it stopped (None when unknown).

    A stopped worker starts again only once the head's GCS lists no alive node at its address: a new Ray node that
    registers while the old one is still listed (Ray's health checks take about 15 s to declare it dead) can be left
    without its GPUs in the GCS's view, and then nothing that needs them is ever placed. When the GCS cannot be read,
    it starts once it has been stopped for OLD_NODE_GRACE seconds, by when Ray has declared the old node dead.
    """
    if worker is None:
        return [("wait", "worker", "the Ray worker container is missing; re-run the deploy")]
    if not worker["running"]:
        if not head_reachable:
            return [("wait", "head", "the head's GCS port does not answer yet")]
        if document is not None and not document.get("error"):
            if own_ip in members(document):
                return [("wait", "worker", "the head's GCS still lists this node's old Ray node alive (%s); "
                         "starting it again once Ray has declared that node dead" % own_ip)]
        elif stopped_for is not None and stopped_for < OLD_NODE_GRACE:
            why = ((document or {}).get("error") or {}).get("message") or "no read"
            return [("wait", "worker", "the head's GCS could not be read (%s); starting again %ds after the stop, "
                     "once Ray has declared the old node dead" % (why, OLD_NODE_GRACE))]
        return [("start", "worker", why_stopped(worker))]
    if running_for is not None and running_for >= grace and document is not None and not document.get("error"):
        if own_ip not in members(document):
            return [("restart", "worker", "the head's cluster does not list this node (the head restarted)")]
    return []


def backoff_left(starts, now, base, cap):
    """Seconds to wait before starting a container again, given when it was started within the backoff window:
    none for the first start, then base x 2^k after the last one, at most `cap`, so a crash loop slows down."""
    recent = sorted(t for t in starts if now - t < BACKOFF_WINDOW)
    if not recent:
        return 0.0
    wait = min(base * 2 ** len(recent), cap)
    return max(0.0, recent[-1] + wait - now)


def judge_generation(status, body, error):
    """(ok, reason) of one watchdog probe: a completion with text is ok; anything else says why not, in one line
    that never holds the key (the request's header is not part of it)."""
    if error:
        return False, "no answer: %s" % error
    try:
        document = json.loads(body or "")
    except ValueError:
        document = None
    if status != 200:
        message = ""
        if isinstance(document, dict):
            found = document.get("error")
            message = found.get("message", "") if isinstance(found, dict) else (found or document.get("detail") or "")
        message = " ".join(str(message or body or "").split())[:200]
        return False, "HTTP %s%s" % (status, ": " + message if message else "")
    choices = (document or {}).get("choices") if isinstance(document, dict) else None
    if not choices or not isinstance(choices[0].get("text"), str):
        return False, "HTTP 200 without a completion"
    return True, "answered"


def watchdog_due(failures, limit, proven, running_for, grace):
    """Whether the failed probes call for a restart of the gang: `limit` in a row, counted only once the server has
    answered since its start or has had `grace` seconds to load."""
    return failures >= limit and (proven or running_for >= grace)


def hold_active(text, now):
    """Whether a hold file's content (the epoch second it ends) still holds at `now`."""
    try:
        return float((text or "").strip() or 0) > now
    except ValueError:
        return False


# --- the fabric, as the deploy proved it and as it is now ---------------------------------------------------------

def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, IOError, UnicodeDecodeError):
        return None


def _port_name(port):
    return "%s:%s" % (port.get("device"), port.get("port"))


def read_fabric(sysfs, watch):
    """What the fabric looks like now, read from sysfs as the node read reads it: the interface's operstate, carrier
    and MTU, and for each watched RDMA port its state and the GID at the index the deploy found (with its type).
    watch: {'interface', 'mtu', 'ports': the fabric role's rdma_ports (with 'gid_index', 'gid_value' and 'gid_type' on RoCE)}."""
    net = os.path.join(sysfs, "class", "net", watch["interface"])
    mtu = _read(os.path.join(net, "mtu"))
    now = {"present": os.path.isdir(net), "operstate": _read(os.path.join(net, "operstate")),
           # Reading carrier fails (EINVAL) while the interface is administratively down: None then.
           "carrier": _read(os.path.join(net, "carrier")),
           "mtu": int(mtu) if mtu and mtu.isdigit() else None, "ports": {}}
    for port in watch.get("ports") or []:
        folder = os.path.join(sysfs, "class", "infiniband", str(port.get("device")), "ports", str(port.get("port")))
        if not os.path.isdir(folder):
            now["ports"][_port_name(port)] = None
            continue
        state = _read(os.path.join(folder, "state"))
        entry = {"state": state.split(":", 1)[-1].strip() if state else None}
        if port.get("gid_index") is not None:
            index = str(port["gid_index"])
            entry["gid"] = _read(os.path.join(folder, "gids", index))
            entry["gid_type"] = _read(os.path.join(folder, "gid_attrs", "types", index))
        now["ports"][_port_name(port)] = entry
    return now


def link_up(now):
    """Whether an interface carries traffic: operationally up, or 'unknown' (drivers that do not report it) with a
    carrier."""
    return now.get("operstate") == "up" or (now.get("operstate") == "unknown" and now.get("carrier") == "1")


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def fabric_changes(watch, now):
    """How the fabric differs from what the deploy proved, one phrase per difference; empty when it is as deployed."""
    iface = watch["interface"]
    if not now.get("present"):
        return ["%s is gone (no such interface)" % iface]
    phrases = []
    if not link_up(now):
        phrases.append("%s link down (operstate %s%s)" % (iface, now.get("operstate"),
                                                          ", no carrier" if now.get("carrier") != "1" else ""))
    if watch.get("mtu") and now.get("mtu") != int(watch["mtu"]):
        phrases.append("%s MTU %s (deployed with %s)" % (iface, now.get("mtu"), watch["mtu"]))
    for port in watch.get("ports") or []:
        name = _port_name(port)
        found = now["ports"].get(name)
        if found is None:
            phrases.append("%s is gone (no such RDMA port)" % name)
            continue
        if found.get("state") != "ACTIVE":
            phrases.append("%s %s (deployed ACTIVE)" % (name, found.get("state") or "state unreadable"))
        if port.get("gid_index") is None:
            continue
        gid, deployed = found.get("gid"), port.get("gid_value")
        if not gid or gid == ZERO_GID:
            phrases.append("%s has no GID %s any more (deployed %s, the GID NCCL takes)" % (name, port["gid_index"], deployed))
        elif deployed and gid != deployed:
            phrases.append("%s GID %s is now %s (deployed %s, the GID NCCL takes)" % (name, port["gid_index"], gid, deployed))
        elif port.get("gid_type") and found.get("gid_type") != port["gid_type"]:
            phrases.append("%s GID %s is %s now (deployed %s)" % (name, port["gid_index"], found.get("gid_type"), port["gid_type"]))
    return phrases


# --- the collective, before a server starts again ------------------------------------------------------------------

# The collection's own verdict on a collective (collective.py, the collective role's filter, beside this program):
# its collective_problems() judges what the check found against what the fabric promised. load_collective() fills it.
COLLECTIVE = types.ModuleType("collective_rule")


def load_collective(source):
    exec(compile(source, "collective_rule.py", "exec"), COLLECTIVE.__dict__)  # pylint: disable=exec-used


def last_json(text):
    """The check's one JSON line (Ray may print after it); None when there is none."""
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def judge_collective(found, check):
    """(ok, line) for one run of the collective check: its report judged by the collection's rule against the
    expectations and floors the deploy settled (check: {'expect', 'floors', 'run'}); the line says what it showed or
    why it failed."""
    if found is None:
        return False, "the check did not report"
    if found.get("error"):
        late = found.get("late_nodes") or []
        return False, "%s%s" % (found["error"], " (late: %s)" % ", ".join(late) if late else "")
    info = dict({"nodes": [], "backend": None, "busbw_gbps": None}, **found)
    info.update(check.get("floors") or {})
    problems = COLLECTIVE.collective_problems(info, check.get("expect") or {})
    if problems:
        return False, "; ".join(problems)
    links = ", ".join("%s %s Gbit/s" % (node.get("ip"), node["link_gbps"]) for node in info["nodes"]
                      if node.get("link_gbps") is not None)
    return True, "%s all-reduce over %s ranks: %s Gbit/s (floor %s)%s" % (
        info.get("backend"), (check.get("run") or {}).get("world"), info.get("busbw_gbps"), info.get("floor_gbps"),
        "; links to the head: " + links if links else "")


# --- the host firewall, before any container ------------------------------------------------------------------------
def firewall_due(checked_at, now, interval):
    """Whether the firewall's own check is due: never checked, or `interval` seconds since the last (0: never)."""
    if not interval:
        return False
    return checked_at is None or now - checked_at >= interval


CHAIN = "GPULAB-INPUT"
JUMP = '-A INPUT -m comment --comment "gpulab: default deny" -j ' + CHAIN


def firewall_in_place(listing, wanted):
    """Whether an ``iptables -S`` listing holds the chain exactly as wanted and its jump first in INPUT."""
    lines = (listing or "").splitlines()
    first = next((line for line in lines if line.startswith("-A INPUT ")), None)
    chain = [line for line in lines if line.startswith("-A %s " % CHAIN)]
    return ("-N %s" % CHAIN) in lines and first == JUMP and chain == list(wanted)


def firewall_restore_text(wanted, listing):
    """iptables-restore --noflush input that writes the chain whole (declaring it empties it), removes every jump into
    it and puts one first in INPUT: the fabric role's own transaction, from whatever the host has now."""
    lines = ["*filter", ":%s - [0:0]" % CHAIN]
    lines += [line.replace("-A INPUT ", "-D INPUT ", 1) for line in (listing or "").splitlines()
              if line.startswith("-A INPUT ") and line.endswith("-j " + CHAIN)]
    lines += list(wanted)
    lines += [JUMP.replace("-A INPUT ", "-I INPUT 1 ", 1), "COMMIT", ""]
    return "\n".join(lines)


# Host commands run on the host's own files (its iptables and libraries, the host's root mounted read-only at /host),
# in this container's network namespace, which is the host's (network mode host).
HOST = ["chroot", "/host"]


# --- Docker, over its socket ----------------------------------------------------------------------------------------

class UnixHTTPConnection(http_client.HTTPConnection):
    def __init__(self, path, timeout):
        http_client.HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Docker(object):
    def __init__(self, path, timeout=60.0):
        self.path = path
        self.timeout = timeout

    def call(self, method, url, body=None, timeout=None):
        conn = UnixHTTPConnection(self.path, timeout or self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, url, body=payload, headers={"Content-Type": "application/json"} if payload else {})
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def inspect(self, name):
        status, data = self.call("GET", "/containers/%s/json" % name)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError("docker inspect %s: %s %s" % (name, status, data[:200]))
        return json.loads(data)

    def start(self, name):
        status, data = self.call("POST", "/containers/%s/start" % name)
        if status not in (204, 304):
            raise RuntimeError("docker start %s: %s %s" % (name, status, data[:300].decode(errors="replace")))

    def stop(self, name, grace=30):
        status, data = self.call("POST", "/containers/%s/stop?t=%d" % (name, grace), timeout=grace + 30)
        if status not in (204, 304, 404):
            raise RuntimeError("docker stop %s: %s %s" % (name, status, data[:300].decode(errors="replace")))

    def restart(self, name, grace=10):
        status, data = self.call("POST", "/containers/%s/restart?t=%d" % (name, grace), timeout=grace + 30)
        if status != 204:
            raise RuntimeError("docker restart %s: %s %s" % (name, status, data[:300].decode(errors="replace")))

    def exec_output(self, name, argv, timeout):
        """stdout of a command run in a container (docker exec), and its exit code."""
        status, data = self.call("POST", "/containers/%s/exec" % name,
                                 {"Cmd": argv, "AttachStdout": True, "AttachStderr": True})
        if status != 201:
            raise RuntimeError("docker exec in %s: %s %s" % (name, status, data[:200]))
        exec_id = json.loads(data)["Id"]
        status, data = self.call("POST", "/exec/%s/start" % exec_id, {"Detach": False, "Tty": False}, timeout=timeout)
        out = []
        offset = 0
        while offset + 8 <= len(data):  # the multiplexed stream: 8-byte headers, stream 1 is stdout
            kind, size = data[offset], struct.unpack(">I", data[offset + 4:offset + 8])[0]
            if kind == 1:
                out.append(data[offset + 8:offset + 8 + size])
            offset += 8 + size
        status, info = self.call("GET", "/exec/%s/json" % exec_id)
        code = json.loads(info).get("ExitCode") if status == 200 else None
        return b"".join(out).decode(errors="replace"), code


def tcp_open(host, port, timeout=2.0):
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, socket.error):
        return False
    sock.close()
    return True


# --- the loop -------------------------------------------------------------------------------------------------------

class Supervisor(object):
    def __init__(self, config, folder):
        self.firewall_checked = None
        self.config = config
        self.folder = folder
        self.docker = Docker(config["docker_socket"])
        self.state_path = os.path.join(folder, "state.json")
        self.state = self._load_state()
        self.state.update({"node": config["node"], "role": config["role"], "pid_started": time.time()})
        self.started_with = None
        self.last_said = {}
        self.starts = {}
        self.probe_failures = 0
        self.proven = False
        self.last_probe = 0.0
        self.last_member_check = 0.0
        # The alive node IDs last read while the server was down, and since when: the gate's settling.
        self.whole = (None, 0.0)
        with open(os.path.join(folder, "gcs_reader.py")) as handle:
            self.reader = handle.read()
        load_reader(self.reader)
        # The fabric's differences from what the deploy proved, as last read (empty: as deployed).
        self.fabric_changed = []
        self.collective_script = None
        if config.get("collective"):
            with open(os.path.join(folder, "allreduce_check.py")) as handle:
                self.collective_script = handle.read()
            with open(os.path.join(folder, "collective_rule.py")) as handle:
                load_collective(handle.read())

    def _load_state(self):
        try:
            with open(self.state_path) as handle:
                state = json.load(handle)
        except (OSError, IOError, ValueError):
            state = {}
        state.setdefault("restarts", {})
        state.setdefault("events", [])
        return state

    def save(self):
        temporary = self.state_path + ".new"
        with open(temporary, "w") as handle:
            json.dump(self.state, handle, indent=1, sort_keys=True)
        os.rename(temporary, self.state_path)

    def say(self, text, key=None, every=60.0):
        """A log line; with a key, the same line at most once per `every` seconds."""
        now = time.time()
        if key is not None:
            last = self.last_said.get(key)
            if last is not None and last[0] == text and now - last[1] < every:
                return
            self.last_said[key] = (text, now)
        sys.stdout.write("%s gpulab-supervisor %s: %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), self.config["node"], text))
        sys.stdout.flush()

    def record(self, action, container, reason):
        event = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "action": action, "container": container,
                 "reason": reason}
        self.state["events"] = (self.state["events"] + [event])[-EVENTS_KEPT:]
        if action in ("start", "restart"):
            self.state["restarts"][container] = self.state["restarts"].get(container, 0) + 1
        self.state["last_event"] = event
        self.say("%s %s: %s" % (action, container, reason))
        self.save()

    def held(self):
        try:
            with open(os.path.join(self.folder, "hold")) as handle:
                return hold_active(handle.read(), time.time())
        except (OSError, IOError):
            return False

    def read_cluster(self, container, wait_for=None):
        """The reader's document, read in `container` (with `wait_for`, it keeps reading until the gate's
        expectations hold or that many seconds pass); None when the container cannot run it. Without a container,
        read in this supervisor's own (the same image, the Ray token mounted as in the Ray containers)."""
        argv = ["python3", "-c", self.reader, self.config["gcs_address"], "5"]
        if wait_for:
            until = dict(self.config["expect"], interval=2, **{"for": wait_for})
            argv.append(json.dumps(until))
        try:
            if container is None:
                proc = subprocess.Popen([sys.executable] + argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                try:
                    out = proc.communicate(timeout=(wait_for or 0) + 60)[0].decode("utf-8", "replace")
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                    raise RuntimeError("the reader did not answer within %ds" % ((wait_for or 0) + 60))
            else:
                out, _code = self.docker.exec_output(container, argv, timeout=(wait_for or 0) + 60)
            return json.loads(out.strip().splitlines()[-1])
        except (RuntimeError, ValueError, IndexError, OSError, socket.error) as exc:
            self.say("could not read the cluster in %s: %s" % (container or "the supervisor", exc), key="read")
            return None

    def probe(self):
        """One real generation from the server, with the key from its root-only file; (ok, reason, seconds)."""
        dog = self.config["watchdog"]
        key = ""
        if dog.get("key_file"):
            with open(dog["key_file"]) as handle:
                key = handle.read().strip()
        body = json.dumps({"model": dog["model"], "prompt": dog.get("prompt", "Hello"), "max_tokens": 4}).encode()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = "Bearer " + key
        host, port = dog["host"], dog["port"]
        started = time.time()
        status = answer = error = None
        conn = http_client.HTTPConnection(host, port, timeout=dog["timeout"])
        try:
            conn.request("POST", "/v1/completions", body=body, headers=headers)
            response = conn.getresponse()
            status, answer = response.status, response.read().decode(errors="replace")
        except Exception as exc:  # pylint: disable=broad-except
            error = "%s: %s" % (type(exc).__name__, exc)
        finally:
            conn.close()
        ok, reason = judge_generation(status, answer, error)
        return ok, reason, round(time.time() - started, 2)

    def watch_generation(self, server_raw):
        """The watchdog: every so often a real generation; after `failures` in a row, the gang again, in order."""
        dog = self.config.get("watchdog") or {}
        if not dog.get("enabled") or time.time() - self.last_probe < dog["interval"]:
            return
        self.last_probe = time.time()
        ok, reason, seconds = self.probe()
        running_for = time.time() - self.started_at(server_raw)
        if ok:
            self.probe_failures = 0
            self.proven = True
        else:
            self.probe_failures += 1
        verdict = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ok": ok, "reason": reason,
                   "seconds": seconds, "failures_in_a_row": self.probe_failures}
        if self.state.get("watchdog", {}).get("ok") != ok or not ok:
            self.say("watchdog: %s (%ss)%s" % (reason, seconds, "" if ok else ", %d in a row" % self.probe_failures))
        self.state["watchdog"] = verdict
        self.save()
        if not ok and watchdog_due(self.probe_failures, dog["failures"], self.proven, running_for, dog["grace"]):
            self.record("stop", self.config["server_container"],
                        "watchdog: %d generations failed in a row (last: %s)" % (self.probe_failures, reason))
            self.docker.stop(self.config["server_container"], grace=self.config.get("stop_grace", 30))
            # The whole gang again: a new head makes every worker's supervisor restart its Ray, then the gate.
            self.started_with = None
            self.reset_watchdog()
            if not self.ensure_firewall():
                return
            self.record("restart", self.config["ray_container"], "watchdog: the gang restarts in order")
            self.docker.restart(self.config["ray_container"])

    def reset_watchdog(self):
        self.probe_failures = 0
        self.proven = False
        self.last_probe = time.time()

    def watch_fabric(self):
        """Read the fabric and compare it with what the deploy proved; log and keep each change and the return to
        what was deployed. Returns the differences (empty when as deployed or not watched)."""
        watch = self.config.get("fabric")
        if not watch:
            return []
        now = read_fabric(watch.get("sysfs") or "/sys", watch)
        changes = fabric_changes(watch, now)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kept = self.state.get("fabric") or {}
        self.state["fabric"] = {"ok": not changes, "changes": changes, "interface": watch["interface"],
                                "mtu": now.get("mtu"), "deployed_mtu": watch.get("mtu"), "read_at": at,
                                "since": kept.get("since") if kept.get("changes") == changes and kept.get("since") else at}
        if changes != self.fabric_changed:
            if changes:
                self.record("fabric", watch["interface"], "changed under the deployment: " + "; ".join(changes))
            else:
                self.record("fabric", watch["interface"], "as deployed again (was: %s)" % "; ".join(self.fabric_changed))
            self.fabric_changed = changes
        return changes

    def stand_down(self, name, changes, what, grace=None):
        """While the fabric differs from what the deploy proved, this node's part of the gang stays down: `name` is
        stopped if it runs (a server stopped rather than a collective hung on a broken link) and not started."""
        found = container_state(self.docker.inspect(name))
        if found is not None and found["running"]:
            self.record("stop", name, "the fabric changed under it: " + "; ".join(changes))
            self.docker.stop(name, grace=self.config.get("stop_grace", 30) if grace is None else grace)
        self.phase("waiting", "the fabric is not as deployed (%s); %s once it is" % ("; ".join(changes), what))

    def prove_collective(self, head_container):
        """The deploy's collective check, run in the head's Ray container and judged with the collection's rule:
        (ok, line). Kept in state.json as 'collective'."""
        check = self.config["collective"]
        run = check.get("run") or {}
        argv = ["python3", "-c", self.collective_script, "--world", str(run.get("world", 1)),
                "--size-mb", str(run.get("size_mb", 64)), "--iterations", str(run.get("iterations", 5)),
                "--timeout", str(run.get("timeout", 60))]
        self.phase("proving", "the collective across every GPU before the server starts again")
        started = time.time()
        try:
            out, _code = self.docker.exec_output(head_container, argv, timeout=int(run.get("timeout", 60)) + 120)
            ok, line = judge_collective(last_json(out), check)
        except (RuntimeError, ValueError, OSError, socket.error) as exc:
            ok, line = False, "the check could not run: %s" % exc
        self.state["collective"] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ok": ok, "said": line,
                                    "seconds": round(time.time() - started, 1)}
        self.save()
        return ok, line

    def ensure_firewall(self):
        """The deploy's host firewall, restored if it is not in place (a reboot or a firewall reload clears it),
        before any container starts: True when it is in place or none is kept; False when it could not be restored."""
        for family, tool in ((4, "iptables"), (6, "ip6tables")):
            wanted = (self.config.get("firewall") or {}).get("v%d" % family) or []
            if not wanted:
                continue
            try:
                listing = subprocess.run(HOST + [tool, "-w", "-S"], capture_output=True, text=True, check=True,
                                         timeout=60).stdout
                if firewall_in_place(listing, wanted):
                    continue
                subprocess.run(HOST + [tool + "-restore", "--noflush", "--wait"], input=firewall_restore_text(wanted, listing),
                               capture_output=True, text=True, check=True, timeout=60)
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                self.phase("waiting", "the host firewall (%s) could not be restored, so nothing starts: %s"
                           % (tool, " ".join(str(detail).split())[:300]))
                return False
            self.record("restore", "firewall (IPv%d)" % family,
                        "the %s chain and its jump were not in place (a reboot or a firewall reload); restored "
                        "before any container starts" % CHAIN)
        return True

    def phase(self, name, detail=""):
        if self.state.get("phase") != name or self.state.get("phase_detail") != detail:
            self.state["phase"] = name
            self.state["phase_detail"] = detail
            self.state["phase_since"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.say("%s%s" % (name, ": " + detail if detail else ""))
            self.save()

    def step_head(self, changes=()):
        cfg = self.config
        names = {"head": cfg["ray_container"], "server": cfg.get("server_container")}
        if changes:
            self.started_with = None
            if cfg.get("serve"):
                self.stand_down(names["server"], changes, "the server starts again after the gate and the collective")
            else:
                self.phase("waiting", "the fabric is not as deployed (%s)" % "; ".join(changes))
            return
        head = container_state(self.docker.inspect(names["head"]))
        server = container_state(self.docker.inspect(names["server"])) if cfg.get("serve") else None
        document = None
        if head is not None and head["running"] and cfg.get("serve") and server is not None:
            # Waiting in the reader (one process for the whole wait) while the server is down and the gate unmet.
            wait_for = cfg["gate_wait"] if not server["running"] else None
            document = self.read_cluster(names["head"], wait_for)
        silent = []
        if server is not None and not server["running"] and document is not None and not document.get("error"):
            silent = [address for address in raylets(document) if not tcp_open(*address.rsplit(":", 1), timeout=2.0)]
        settled = True
        if server is None or server["running"]:
            self.whole = (None, 0.0)  # the settling counts from the server's stop, never from an earlier one
        else:
            nodes = frozenset(members(document).values()) if document and not document.get("error") else None
            if nodes != self.whole[0]:
                self.whole = (nodes, time.time())
            settled = nodes is not None and time.time() - self.whole[1] >= cfg.get("gate_settle", 10)
        actions, gang = decide_head(head, server, cfg.get("serve"), document, cfg["expect"], self.started_with, silent,
                                    settled)
        self.started_with = gang
        for action, kind, reason in actions:
            name = names.get(kind)
            if action == "wait":
                self.phase("waiting", reason)
            elif action == "adopt":
                self.phase("serving", "%s %s" % (name, reason))
                self.reset_watchdog()
                self.proven = True  # found serving on a whole cluster: the deploy proved it
            elif action == "stop":
                self.record("stop", name, reason)
                self.docker.stop(name, grace=cfg.get("stop_grace", 30))
            elif action == "start":
                if not self.ensure_firewall() or not self.may_start(name):
                    self.started_with = None
                    return
                if kind == "server" and self.collective_script:
                    proved, said = self.prove_collective(names["head"])
                    if not proved:
                        # Tried again after the start's backoff: a fabric that just came back may need a moment.
                        self.record("refuse", name, "the collective failed: " + said)
                        self.phase("waiting", "the collective failed: " + said)
                        self.started_with = None
                        return
                    reason = "%s; collective passed (%s)" % (reason, said)
                self.record("start", name, reason)
                self.docker.start(name)
                self.phase("serving" if kind == "server" else "forming",
                           "%s started" % name if kind == "server" else "the Ray head started; waiting for the gate")
        if any(action == "start" and kind == "server" for action, kind, _reason in actions):
            self.reset_watchdog()
        if not actions and head is not None and head["running"]:
            self.phase("serving" if cfg.get("serve") else "ray", "the gang is whole")
            if cfg.get("serve") and self.started_with is not None:
                self.watch_generation(self.docker.inspect(names["server"]))

    def step_worker(self, changes=()):
        cfg = self.config
        name = cfg["ray_container"]
        if changes:
            # A Ray worker keeps nothing worth a graceful stop, and in the lab its container outlived SIGTERM for the
            # whole 30 s of stop_grace (then killed, exit 137): a long grace only delays the head's sight of the
            # broken gang.
            self.stand_down(name, changes, "its Ray starts again", grace=FABRIC_STOP_GRACE)
            return
        raw = self.docker.inspect(name)
        worker = container_state(raw)
        head_host, head_port = cfg["gcs_address"].rsplit(":", 1)
        reachable = tcp_open(head_host, int(head_port))
        running_for = None
        stopped_for = None
        document = None
        if worker is not None and worker["running"]:
            running_for = time.time() - self.started_at(raw)
            # Whether the head's cluster lists this node: a read every MEMBER_EVERY seconds is enough.
            if running_for >= cfg["member_grace"] and time.time() - self.last_member_check >= MEMBER_EVERY:
                self.last_member_check = time.time()
                document = self.read_cluster(name)
        elif worker is not None and reachable:
            # Before a start: does the head's GCS still list this node's old Ray node?
            stopped_for = time.time() - self.finished_at(raw)
            document = self.read_cluster(None)
        for action, kind, reason in decide_worker(worker, reachable, document, cfg["fabric_ip"], running_for,
                                                  cfg["member_grace"], stopped_for):
            if action == "wait":
                self.phase("waiting", reason)
            elif action in ("start", "restart"):
                if not self.ensure_firewall() or not self.may_start(name):
                    return
                self.record(action, name, reason)
                (self.docker.start if action == "start" else self.docker.restart)(name)
                self.phase("joining", "%s %sed" % (name, action.rstrip("e")))
        if worker is not None and worker["running"] and running_for is not None and running_for >= cfg["member_grace"]:
            self.phase("member", "running in the head's cluster")

    @staticmethod
    def started_at(raw, field="StartedAt"):
        text = ((raw or {}).get("State") or {}).get(field) or ""
        try:
            return calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            return time.time()

    @classmethod
    def finished_at(cls, raw):
        """When the container stopped (now when Docker does not say: a container never started)."""
        return cls.started_at(raw, "FinishedAt")

    def may_start(self, name):
        """False (and a line saying when) while a container this supervisor started lately waits out its backoff."""
        left = backoff_left(self.starts.get(name, []), time.time(), self.config["interval"], self.config["backoff_cap"])
        if left > 0:
            self.phase("backing off", "%s was started %d time(s) in the last %ds; next try in %ds"
                       % (name, len(self.starts.get(name, [])), BACKOFF_WINDOW, left))
            return False
        self.starts[name] = [t for t in self.starts.get(name, []) if time.time() - t < BACKOFF_WINDOW] + [time.time()]
        return True

    def run(self):
        self.say("watching %s as the %s (every %ss)"
                 % (self.config["ray_container"], self.config["role"], self.config["interval"]))
        while True:
            try:
                if self.held():
                    self.started_with = None
                    self.phase("held", "a deploy is changing this node")
                    continue
                # A firewall reload (or another tool's flush) while everything runs opens the ports until the next
                # start: the rules are checked on their own every firewall_interval seconds, and put back.
                if firewall_due(self.firewall_checked, time.time(), self.config.get("firewall_interval", 30)):
                    self.firewall_checked = time.time()
                    self.ensure_firewall()
                changes = self.watch_fabric()
                if self.config["role"] == "head":
                    self.step_head(changes)
                else:
                    self.step_worker(changes)
            except Exception as exc:  # pylint: disable=broad-except
                self.say("step failed: %s" % exc, key="step")
            finally:
                time.sleep(self.config["interval"])


def main(argv):
    path = argv[1] if len(argv) > 1 else "/supervisor/config.json"
    with open(path) as handle:
        config = json.load(handle)
    Supervisor(config, os.path.dirname(os.path.abspath(path))).run()


if __name__ == "__main__":
    main(sys.argv)
