# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What node_facts reads on a node: the collection's containers, listening ports, firewall chains, files.

Pure functions where possible, so that unit tests run them on listings recorded from the lab.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import stat
from urllib.parse import quote, urlsplit

# /proc/net/tcp state column: 0A is LISTEN.
_TCP_LISTEN = "0A"


class DockerError(Exception):
    """The Docker daemon could not be asked, or answered with an error."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        http.client.HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self._socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection(docker_host, timeout):
    if docker_host.startswith("unix://"):
        return _UnixConnection(docker_host[len("unix://"):], timeout)
    if docker_host.startswith("tcp://"):
        where = urlsplit(docker_host)
        return http.client.HTTPConnection(where.hostname, where.port or 2375, timeout=timeout)
    raise DockerError("docker_host must start with unix:// or tcp://, not %r" % docker_host)


def _docker_raw(docker_host, path, timeout):
    """GET one Engine API path; (status, body bytes)."""
    conn = _connection(docker_host, timeout)
    try:
        conn.request("GET", path, headers={"Host": "docker"})
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise DockerError(str(exc) or exc.__class__.__name__)
    finally:
        conn.close()


def docker_get(docker_host, path, timeout):
    """GET one Engine API path; (status, parsed JSON body or None)."""
    status, body = _docker_raw(docker_host, path, timeout)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        raise DockerError("the daemon answered %s with something that is not JSON" % status)


def summarize_inspect(doc, label):
    """The part of a `docker inspect` document the roles decide on."""
    state = doc.get("State") or {}
    labels = (doc.get("Config") or {}).get("Labels") or {}
    return {
        "exists": True,
        "running": bool(state.get("Running")),
        "status": state.get("Status"),
        "image_id": doc.get("Image"),
        "labels": labels,
        "role": labels.get(label),
        "started_at": state.get("StartedAt"),
        "exit_code": state.get("ExitCode"),
    }


def absent_container():
    return {"exists": False, "running": False, "status": None, "image_id": None, "labels": {}, "role": None,
            "started_at": None, "exit_code": None}


def docker_containers(docker_host, label, names, timeout):
    """Every container carrying `label`, and every one named in `names`, by name."""
    filters = quote(json.dumps({"label": [label]}))
    status, listing = docker_get(docker_host, "/containers/json?all=1&filters=%s" % filters, timeout)
    if status != 200:
        raise DockerError("listing containers answered HTTP %s: %s" % (status, _message(listing)))
    wanted = [entry["Names"][0].lstrip("/") for entry in listing or [] if entry.get("Names")]
    wanted += [name for name in names if name not in wanted]
    containers = {}
    for name in wanted:
        status, doc = docker_get(docker_host, "/containers/%s/json" % quote(name, safe=""), timeout)
        if status == 404:
            containers[name] = absent_container()
        elif status == 200:
            containers[name] = summarize_inspect(doc, label)
        else:
            raise DockerError("inspecting %s answered HTTP %s: %s" % (name, status, _message(doc)))
    return containers


def split_log_stream(raw):
    """The text of a container's log as the Engine API sends it for a container without a TTY: frames of
    an 8-byte header (stream, 3 zero bytes, big-endian length) and the payload, stdout and stderr
    interleaved in the order they were written. Raw text (a TTY container) is returned as it is."""
    if len(raw) < 8 or raw[0] not in (0, 1, 2) or raw[1:4] != b"\x00\x00\x00":
        return raw.decode("utf-8", "replace")
    chunks, offset = [], 0
    while offset + 8 <= len(raw):
        size = int.from_bytes(raw[offset + 4:offset + 8], "big")
        chunks.append(raw[offset + 8:offset + 8 + size])
        offset += 8 + size
    return b"".join(chunks).decode("utf-8", "replace")


def docker_logs(docker_host, name, tail, timeout):
    """The last `tail` lines a container wrote to stdout and stderr, in order."""
    status, raw = _docker_raw(docker_host, "/containers/%s/logs?stdout=1&stderr=1&tail=%d" % (quote(name, safe=""), tail), timeout)
    if status != 200:
        raise DockerError("reading the log of %s answered HTTP %s" % (name, status))
    return split_log_stream(raw)


def docker_images(docker_host, refs, timeout):
    """By reference: whether the daemon has the image, its ID, repository digests and entrypoint."""
    images = {}
    for ref in refs:
        status, doc = docker_get(docker_host, "/images/%s/json" % quote(ref, safe="/:@"), timeout)
        if status == 404:
            images[ref] = {"present": False, "id": None, "repo_digests": [], "entrypoint": []}
        elif status == 200:
            images[ref] = {"present": True, "id": doc.get("Id"), "repo_digests": doc.get("RepoDigests") or [],
                           "entrypoint": (doc.get("Config") or {}).get("Entrypoint") or []}
        else:
            raise DockerError("inspecting image %s answered HTTP %s: %s" % (ref, status, _message(doc)))
    return images


def _message(body):
    return body.get("message") if isinstance(body, dict) and body.get("message") else "no message"


def parse_proc_net_tcp(text):
    """Ports in the LISTEN state in one /proc/net/tcp or tcp6 listing."""
    ports = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == _TCP_LISTEN:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def listening_ports(proc_net="/proc/net"):
    ports = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_net, name)) as handle:
                ports |= parse_proc_net_tcp(handle.read())
        except OSError:
            continue
    return sorted(ports)


def split_iptables_listing(text, chains):
    """Rules of each chain in one `iptables -S` listing of the whole table, as `iptables -S CHAIN` prints
    them; None for a chain that does not exist."""
    rules = dict((chain, None) for chain in chains)
    for line in text.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 2 or fields[1] not in rules:
            continue
        if fields[0] in ("-N", "-P"):
            rules[fields[1]] = (rules[fields[1]] or []) + [line]
        elif fields[0] == "-A" and rules[fields[1]] is not None:
            rules[fields[1]].append(line)
    return rules


def facts_key(name):
    """The key Ansible's gathered facts use for an interface (ansible_facts['eth0_100'] for eth0.100)."""
    return name.replace("-", "_").replace(".", "_").replace(":", "_")


def parse_ip_address_json(text):
    """`ip -j address show` as the part of Ansible's network facts the fabric role reads:
    {'interfaces': [names], KEY: {'device', 'active', 'carrier', 'mtu', 'macaddress', 'ipv4', 'ipv4_secondaries'}}."""
    network = {"interfaces": []}
    for link in json.loads(text or "[]"):
        name = link.get("ifname")
        if not name:
            continue
        flags = link.get("flags") or []
        inet = [entry for entry in link.get("addr_info") or [] if entry.get("family") == "inet" and entry.get("local")]
        addresses = [{"address": entry["local"], "prefix": str(entry.get("prefixlen", ""))} for entry in inet]
        info = {
            "device": name,
            # As Ansible's network facts: a link is active unless the kernel says it is down, which it does
            # for a link set down and for one without carrier (no cable).
            "active": str(link.get("operstate", "")).upper() != "DOWN",
            "carrier": "NO-CARRIER" not in flags and "LOWER_UP" in flags,
            "mtu": link.get("mtu"),
            "macaddress": link.get("address"),
            "ipv4_secondaries": addresses[1:],
        }
        if addresses:
            info["ipv4"] = addresses[0]
        network["interfaces"].append(name)
        network[facts_key(name)] = info
    return network


def describe_file(path, sha1=None):
    try:
        info = os.stat(path)
    except OSError:
        return {"exists": False, "isdir": False, "mode": None, "uid": None, "gid": None, "matches": False if sha1 else None}
    matches = None
    if sha1:
        matches = False
        if stat.S_ISREG(info.st_mode):
            digest = hashlib.sha1()
            try:
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(65536), b""):
                        digest.update(block)
            except OSError:
                digest = None
            matches = digest is not None and digest.hexdigest() == sha1.lower()
    return {"exists": True, "isdir": stat.S_ISDIR(info.st_mode), "mode": "%04o" % stat.S_IMODE(info.st_mode),
            "uid": info.st_uid, "gid": info.st_gid, "matches": matches}
