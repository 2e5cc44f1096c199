# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What node_facts reads on a node: the collection's containers, listening ports, firewall chains, files, the
platform its Docker daemon pulls for and the platforms of images.

Pure functions where possible, so that unit tests run them on listings recorded from the lab.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
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


def _docker_raw(docker_host, path, timeout, headers=None):
    """GET one Engine API path; (status, body bytes)."""
    conn = _connection(docker_host, timeout)
    try:
        conn.request("GET", path, headers=dict(headers or {}, Host="docker"))
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise DockerError(str(exc) or exc.__class__.__name__)
    finally:
        conn.close()


def docker_get(docker_host, path, timeout, headers=None):
    """GET one Engine API path; (status, parsed JSON body or None)."""
    status, body = _docker_raw(docker_host, path, timeout, headers)
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
        "finished_at": state.get("FinishedAt"),
        "oom_killed": bool(state.get("OOMKilled")),
        # The daemon's own words when it could not start the container (a missing device, a bad mount), else null.
        "error": state.get("Error") or None,
        "restart_count": doc.get("RestartCount", 0),
        "last_error": None,
    }


def absent_container():
    return {"exists": False, "running": False, "status": None, "image_id": None, "labels": {}, "role": None,
            "started_at": None, "exit_code": None, "finished_at": None, "oom_killed": False, "error": None,
            "restart_count": 0, "last_error": None}


# What a process's exit code says when a signal ended it (128 + the signal's number).
_SIGNALS = {130: "SIGINT", 134: "SIGABRT", 135: "SIGBUS", 137: "SIGKILL", 139: "SIGSEGV", 143: "SIGTERM"}
# Words that mark a line of a log as an error, and lines that only point at another line (vLLM's engine ends with
# "Engine core initialization failed. See root cause above."): the cause is further up.
_ERROR_MARKERS = ("Error", "error:", "Exception", "Traceback", "failed", "FATAL", "Killed")
_POINTERS = ("root cause above", "stack trace (above)", "see above", "See the log above")
# A log line at warning level (vLLM's, Ray's and Python's logging formats).
_WARNING = re.compile(r"(^|\s|\]\s?)(WARNING|WARN)(\s|:|\])")
# pydantic's error line, whose cause is on the lines after it, and the bookkeeping it ends each of them with.
_VALIDATION_ERROR = re.compile(r"\d+ validation errors? for \w+$")
_VALIDATION_DETAILS = 1
_PYDANTIC_TAIL = re.compile(r"\s*\[type=[^\]]*\]\s*$")


def cause_line(log_text, limit=300):
    """The line of a log that most likely names why a process ended: the last line that reads like an error and
    is not a pointer to another line nor a traceback frame; trimmed to `limit`. None when there is none."""
    lines = [line.strip() for line in (log_text or "").splitlines() if line.strip()]
    fallback = None
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if not any(marker in line for marker in _ERROR_MARKERS) or line.startswith(("File ", "^", "Traceback")):
            continue
        # A warning that happens to say "failed" (vLLM's "failed to automatically increase" the fd limit) is not why
        # a process ended: only when nothing else reads like an error.
        if any(pointer in line for pointer in _POINTERS) or _WARNING.search(line):
            fallback = fallback or line
            continue
        # pydantic names the model on the error's line and the failed check on the lines below it (vLLM's config
        # classes: "1 validation error for ModelConfig", then "Value error, User-specified max_model_len ...").
        if _VALIDATION_ERROR.search(line):
            details = [detail for detail in lines[index + 1:index + 1 + 2 * _VALIDATION_DETAILS]
                       if not detail.startswith("For further information")][:_VALIDATION_DETAILS]
            line = ": ".join([line] + [_PYDANTIC_TAIL.sub("", detail) for detail in details])
        return line if len(line) <= limit else line[:limit] + "..."
    if fallback is not None:
        return fallback if len(fallback) <= limit else fallback[:limit] + "..."
    return None


def stop_reason(container):
    """One phrase for why a container that exists is not running, from its inspected state (summarize_inspect):
    OOM, a signal, an exit code, or the daemon's error; with the cause line of its log when one was read."""
    if not container.get("exists"):
        return "no such container"
    if container.get("running"):
        return None
    code = container.get("exit_code")
    if container.get("status") == "created":
        said = "created but never started"
    elif container.get("oom_killed"):
        said = "killed by the kernel's OOM killer (exit %s): the node ran out of memory" % code
    elif code in _SIGNALS:
        said = "ended by %s (exit %s)%s" % (_SIGNALS[code], code,
                                            ": killed (docker kill, or the OOM killer outside the container's cgroup)"
                                            if code == 137 else "")
    elif code == 0:
        said = "exited normally (exit 0)"
    else:
        said = "exited with code %s" % code
    if container.get("error"):
        said += "; Docker: %s" % container["error"]
    if container.get("finished_at") and not str(container["finished_at"]).startswith("0001-"):
        said += "; at %s" % container["finished_at"]
    if container.get("last_error"):
        said += "; last error line: %s" % container["last_error"]
    return said


def add_stop_causes(docker_host, containers, lines, timeout):
    """For each container that exists and is not running, the cause line of the last `lines` lines of its log."""
    for name, container in containers.items():
        if container["exists"] and not container["running"] and lines > 0:
            try:
                container["last_error"] = cause_line(docker_logs(docker_host, name, lines, timeout))
            except DockerError:
                container["last_error"] = None
    return containers


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


class LogFrames(object):
    """A container's log as the Engine API sends it, put together as it arrives: for a container without a TTY,
    frames of an 8-byte header (stream, 3 zero bytes, big-endian length) and the payload, stdout and stderr
    interleaved in the order they were written, a frame possibly split across reads; a TTY container's raw text."""

    def __init__(self, tty=False):
        self.tty = tty
        self.pending = b""
        self.text = ""

    def feed(self, data):
        """Add what arrived; returns the text it completed."""
        if self.tty:
            out = data.decode("utf-8", "replace")
        else:
            self.pending += data
            chunks = []
            while len(self.pending) >= 8:
                size = int.from_bytes(self.pending[4:8], "big")
                if len(self.pending) < 8 + size:
                    break
                chunks.append(self.pending[8:8 + size])
                self.pending = self.pending[8 + size:]
            out = b"".join(chunks).decode("utf-8", "replace")
        self.text += out
        return out


def split_log_stream(raw):
    """The text of a whole log as the Engine API sends it (LogFrames); raw text that does not start with a frame
    header (a TTY container) is returned as it is."""
    framed = len(raw) >= 8 and raw[0] in (0, 1, 2) and raw[1:4] == b"\x00\x00\x00"
    frames = LogFrames(tty=not framed)
    frames.feed(raw)
    return frames.text


def docker_logs(docker_host, name, tail, timeout):
    """The last `tail` lines a container wrote to stdout and stderr, in order."""
    status, raw = _docker_raw(docker_host, "/containers/%s/logs?stdout=1&stderr=1&tail=%d" % (quote(name, safe=""), tail), timeout)
    if status != 200:
        raise DockerError("reading the log of %s answered HTTP %s" % (name, status))
    return split_log_stream(raw)


def docker_platform(docker_host, timeout):
    """The platform the node's Docker daemon pulls for, as OCI names it: {'os': 'linux', 'architecture': 'arm64'}.

    GET /version answers with the daemon's own Os and Arch (Go's names, which are OCI's): the platform it picks
    from an image index and the one it compares a single image with. /info's Architecture is the kernel's
    (uname: x86_64, aarch64), which a 32-bit daemon on a 64-bit kernel does not pull for."""
    status, doc = docker_get(docker_host, "/version", timeout)
    if status != 200:
        raise DockerError("asking the daemon's version answered HTTP %s: %s" % (status, _message(doc)))
    return platform_of_version(doc)


def platform_of_version(doc):
    return {"os": (doc or {}).get("Os"), "architecture": (doc or {}).get("Arch")}


def absent_image(error=None):
    return {"present": False, "id": None, "repo_digests": [], "entrypoint": [], "os": None, "architecture": None,
            "variant": None, "error": error, "registry": None}


def summarize_image(doc):
    """The part of an image's inspect document (GET /images/REF/json) the roles decide on."""
    return {"present": True, "id": doc.get("Id"), "repo_digests": doc.get("RepoDigests") or [],
            "entrypoint": (doc.get("Config") or {}).get("Entrypoint") or [], "os": doc.get("Os"),
            "architecture": doc.get("Architecture"), "variant": doc.get("Variant"), "error": None, "registry": None}


def summarize_distribution(status, doc):
    """The daemon's answer to GET /distribution/REF/json: the registry's digest and media type of the reference,
    the platforms it lists (an image index lists each of its images; for a single image the daemon reads the
    platform from the image's config, except that Docker 20.10 lists none for an OCI image manifest: null), or
    the error in the registry's (or the daemon's) own words, on one line."""
    if status == 200:
        descriptor = (doc or {}).get("Descriptor") or {}
        platforms = [dict((key, item.get(key)) for key in ("os", "architecture", "variant"))
                     for item in (doc or {}).get("Platforms") or []]
        return {"digest": descriptor.get("digest"), "media_type": descriptor.get("mediaType"),
                "platforms": platforms or None, "error": None}
    message = " ".join(_message(doc).split()) if isinstance(doc, dict) and doc.get("message") else "HTTP %s" % status
    return {"digest": None, "media_type": None, "platforms": None, "error": message}


def registry_of(ref):
    """The registry a reference names, as Docker reads it: the first part when it has a dot or a port or is
    localhost, else Docker Hub."""
    first, sep = ref.partition("/")[:2]
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


# Docker Hub's key in a client's config.json, as the docker CLI writes it.
_DOCKER_HUB_KEY = "https://index.docker.io/v1/"


def _config_key(registry):
    return _DOCKER_HUB_KEY if registry in ("docker.io", "index.docker.io", "registry-1.docker.io") else registry


def _host_of(key):
    """The host of a config.json key, which may be a URL (https://host/v1/)."""
    return key.split("://", 1)[-1].split("/", 1)[0]


def docker_config_path(environ=None):
    """The docker client's config file of the user the module runs as: $DOCKER_CONFIG/config.json or
    ~/.docker/config.json, as the docker CLI and community.docker read it."""
    environ = os.environ if environ is None else environ
    folder = environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(folder, "config.json")


def read_docker_config(path):
    """The client's config file, parsed; {} when there is none or it cannot be read."""
    try:
        with open(path) as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def registry_credentials(ref, config, ask_helper):
    """The credentials the docker client of this node would send for ref's registry, as the Engine API takes
    them (a dict for X-Registry-Auth), or None.

    As the docker CLI: the credential helper the config names for the registry (credHelpers), else its
    credsStore, asked through ask_helper(NAME, SERVER) (`docker-credential-NAME get`, its JSON answer or None);
    else the registry's entry of `auths`. The Docker daemon keeps no credentials of its own: the client sends
    them with each pull, and so must a query of the registry."""
    registry = registry_of(ref)
    key = _config_key(registry)
    helpers = config.get("credHelpers") or {}
    helper = helpers.get(registry) or helpers.get(key) or config.get("credsStore")
    if helper:
        answer = ask_helper(helper, key)
        if not isinstance(answer, dict) or not answer.get("Secret"):
            return None
        if answer.get("Username") == "<token>":
            return {"identitytoken": answer["Secret"], "serveraddress": key}
        return {"username": answer.get("Username") or "", "password": answer["Secret"], "serveraddress": key}
    auths = config.get("auths") or {}
    entry = auths.get(key) or next((value for name, value in auths.items() if _host_of(name) == _host_of(key)), None)
    if not isinstance(entry, dict):
        return None
    credentials = {"serveraddress": key}
    if entry.get("auth"):
        try:
            user, _sep, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        credentials.update(username=user, password=password)
    elif entry.get("username"):
        credentials.update(username=entry["username"], password=entry.get("password") or "")
    for name in ("identitytoken", "registrytoken"):
        if entry.get(name):
            credentials[name] = entry[name]
    return credentials if len(credentials) > 1 else None


def registry_auth_header(credentials):
    """X-Registry-Auth: the credentials as URL-safe base64 of their JSON, as the docker CLI sends them."""
    return {"X-Registry-Auth": base64.urlsafe_b64encode(json.dumps(credentials).encode()).decode()} if credentials else {}


def docker_distribution(docker_host, ref, timeout, credentials=None):
    """Ask the registry, through the node's Docker daemon (its registry settings: mirrors, insecure registries,
    certificates; the client's credentials), for the platforms of ref. Never fails: an error is part of the answer."""
    try:
        status, doc = docker_get(docker_host, "/distribution/%s/json" % quote(ref, safe="/:@"), timeout,
                                 registry_auth_header(credentials))
    except DockerError as exc:
        text = str(exc)
        if "timed out" in text:
            text = "no answer through the node's Docker daemon within %g s" % timeout
        return {"digest": None, "media_type": None, "platforms": None, "error": text}
    return summarize_distribution(status, doc)


def needs_registry(ask_registry, ref, image):
    """Whether to ask the registry about ref: never; for an image the node lacks (absent); or also for one it has
    by tag (always: a pull would fetch whatever the tag names now; a digest names one image for good)."""
    if ask_registry == "never" or image.get("error"):
        return False
    if not image["present"]:
        return True
    return ask_registry == "always" and "@" not in ref


def docker_images(docker_host, refs, timeout, ask_registry="never", credentials_for=None):
    """By reference: whether the daemon has the image, its ID, repository digests, entrypoint and platform; a
    reference the daemon refuses is absent with the daemon's words in `error`; with ask_registry (needs_registry),
    the registry's answer (summarize_distribution) in `registry`, asked with credentials_for(REF)."""
    images = {}
    for ref in refs:
        if not ref:
            images[ref] = absent_image("empty image reference")
            continue
        status, doc = docker_get(docker_host, "/images/%s/json" % quote(ref, safe="/:@"), timeout)
        if status == 404:
            images[ref] = absent_image()
        elif status == 200:
            images[ref] = summarize_image(doc)
        elif status == 400:
            images[ref] = absent_image(" ".join(_message(doc).split()))
        else:
            raise DockerError("inspecting image %s answered HTTP %s: %s" % (ref, status, _message(doc)))
        if needs_registry(ask_registry, ref, images[ref]):
            credentials = credentials_for(ref) if credentials_for else None
            images[ref]["registry"] = docker_distribution(docker_host, ref, timeout, credentials)
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


def add_link_speeds(network, sysfs="/sys"):
    """Each interface's speed in Mbit/s as its driver reports it (C(speed) in Ansible's facts); None where the
    driver reports none (-1, or EINVAL for a link that is down)."""
    for name in network.get("interfaces", []):
        text = _read_text(os.path.join(sysfs, "class", "net", name, "speed"))
        speed = int(text) if text and text.lstrip("-").isdigit() else None
        network[facts_key(name)]["speed"] = speed if speed is not None and speed > 0 else None
    return network


def _file_sha1(path):
    digest = hashlib.sha1()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(65536), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def describe_file(path, sha1=None, digest=False):
    """Whether a file or folder exists, its kind, mode and owner; whether its content has the given SHA-1 (a secret's
    file: the digest itself is never returned); with `digest`, for a file that holds no secret, its SHA-1."""
    try:
        info = os.stat(path)
    except OSError:
        described = {"exists": False, "isdir": False, "mode": None, "uid": None, "gid": None, "matches": False if sha1 else None}
        if digest:
            described["sha1"] = None
        return described
    regular = stat.S_ISREG(info.st_mode)
    matches = None
    if sha1:
        found = _file_sha1(path) if regular else None
        matches = found is not None and found == sha1.lower()
    described = {"exists": True, "isdir": stat.S_ISDIR(info.st_mode), "mode": "%04o" % stat.S_IMODE(info.st_mode),
                 "uid": info.st_uid, "gid": info.st_gid, "matches": matches}
    if digest:
        described["sha1"] = _file_sha1(path) if regular else None
    return described


def _read_text(path):
    """A sysfs attribute's value, stripped; None when it cannot be read (absent, or EINVAL for an unused GID slot)."""
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _sysfs_state(text):
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'; None stays None."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip()


def _pci_address(path):
    """The PCI address (0000:01:00.1) a sysfs `device` link leads to, else None (a virtual device)."""
    if not os.path.exists(path):
        return None
    name = os.path.basename(os.path.realpath(path))
    parts = name.split(":")
    if len(parts) == 3 and "." in parts[2]:
        return name
    return None


_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read_port(port_dir):
    gids = []
    gid_dir = os.path.join(port_dir, "gids")
    for index in sorted(int(entry) for entry in _listdir(gid_dir) if entry.isdigit()):
        gid = _read_text(os.path.join(gid_dir, str(index)))
        if not gid or gid == _ZERO_GID:
            continue
        gids.append({
            "index": index,
            "gid": gid,
            "type": _read_text(os.path.join(port_dir, "gid_attrs", "types", str(index))),
            "netdev": _read_text(os.path.join(port_dir, "gid_attrs", "ndevs", str(index))),
        })
    return {
        "state": _sysfs_state(_read_text(os.path.join(port_dir, "state"))),
        "phys_state": _sysfs_state(_read_text(os.path.join(port_dir, "phys_state"))),
        "link_layer": _read_text(os.path.join(port_dir, "link_layer")),
        "rate": _read_text(os.path.join(port_dir, "rate")),
        "gids": gids,
    }


def _listdir(path, key=None):
    """A folder's entries, sorted; none when it cannot be read."""
    try:
        return sorted(os.listdir(path), key=key)
    except OSError:
        return []


def read_rdma(sysfs="/sys"):
    """The node's RDMA devices and the network interfaces that sit on them, from sysfs.

    {'devices': {NAME: {'pci', 'node_guid', 'sys_image_guid', 'ports': {'1': {'state', 'phys_state', 'link_layer',
    'rate', 'gids': [{'index', 'gid', 'type', 'netdev'}]}}}},
     'netdevs': {IFNAME: {'pci', 'dev_port', 'rdma_devices': [NAME]}}}; netdevs lists only interfaces of a device
    that has RDMA devices (an interface's own `device/infiniband`, the link the kernel gives every netdev of an HCA).
    """
    devices = {}
    class_dir = os.path.join(sysfs, "class", "infiniband")
    for name in _listdir(class_dir):
        device_dir = os.path.join(class_dir, name)
        ports = {}
        for port in _listdir(os.path.join(device_dir, "ports"), key=lambda p: int(p) if p.isdigit() else 0):
            ports[port] = _read_port(os.path.join(device_dir, "ports", port))
        devices[name] = {
            "pci": _pci_address(os.path.join(device_dir, "device")),
            "node_guid": _read_text(os.path.join(device_dir, "node_guid")),
            "sys_image_guid": _read_text(os.path.join(device_dir, "sys_image_guid")),
            "ports": ports,
        }
    netdevs = {}
    net_dir = os.path.join(sysfs, "class", "net")
    for interface in _listdir(net_dir):
        on_device = _listdir(os.path.join(net_dir, interface, "device", "infiniband"))
        if not on_device:
            continue
        dev_port = _read_text(os.path.join(net_dir, interface, "dev_port"))
        netdevs[interface] = {
            "pci": _pci_address(os.path.join(net_dir, interface, "device")),
            "dev_port": int(dev_port) if dev_port and dev_port.isdigit() else 0,
            "rdma_devices": on_device,
        }
    return {"devices": devices, "netdevs": netdevs}


def controller_address(proc="/proc", pid=None):
    """The address the controller's SSH connection comes from (OpenSSH's SSH_CLIENT), looked up in this process's
    environment and then its ancestors': sudo (become) drops SSH_CLIENT, the login shell under it still holds it.
    None over another connection."""
    pid = pid or os.getpid()
    for unused in range(16):
        try:
            with open(os.path.join(proc, str(pid), "environ"), "rb") as handle:
                environ = handle.read().split(b"\0")
            with open(os.path.join(proc, str(pid), "stat"), "rb") as handle:
                stat_fields = handle.read().rsplit(b")", 1)[-1].split()
        except OSError:
            return None
        for item in environ:
            if item.startswith(b"SSH_CLIENT="):
                address = item[len(b"SSH_CLIENT="):].split(b" ")[0].decode("ascii", "replace")
                return address or None
        parent = int(stat_fields[1]) if len(stat_fields) > 1 and stat_fields[1].isdigit() else 0
        if parent <= 1:
            return None
        pid = parent
    return None


# /proc/meminfo fields the memory rules read, by the key the read reports them under.
_MEMINFO_FIELDS = {"MemTotal": "total", "MemFree": "free", "MemAvailable": "available", "Cached": "cached",
                   "Buffers": "buffers", "Dirty": "dirty", "SwapTotal": "swap_total", "SwapFree": "swap_free"}


def parse_meminfo(text):
    """/proc/meminfo as bytes by our key (total, free, available, cached, buffers, dirty, swap_total, swap_free);
    a field the kernel does not print is None."""
    found = dict((key, None) for key in _MEMINFO_FIELDS.values())
    for line in (text or "").splitlines():
        name, sep, rest = line.partition(":")
        if not sep or name.strip() not in _MEMINFO_FIELDS:
            continue
        fields = rest.split()
        if not fields or not fields[0].isdigit():
            continue
        unit = fields[1].lower() if len(fields) > 1 else ""
        found[_MEMINFO_FIELDS[name.strip()]] = int(fields[0]) * (1024 if unit == "kb" else 1)
    return found


def parse_gpu_query(text):
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`: one dict per GPU, its `name` and
    `memory_total_mib` (None where the driver reports no memory of the GPU's own, as on GB10)."""
    gpus = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        name, unused_sep, memory = line.rpartition(",")
        memory = memory.strip()
        gpus.append({"name": name.strip(),
                     "memory_total_mib": int(memory) if memory.isdigit() else None})
    return gpus


def node_memory(meminfo_text, gpus, unified="auto"):
    """The node's memory as the memory rules read it: /proc/meminfo's figures in bytes, the GPUs nvidia-smi lists
    (None: no nvidia-smi on the node), and whether the GPUs' memory is the host's (`unified`).

    Unified when a GPU has no memory of its own to report (GB10: memory.total is [N/A]); `unified` given as true or
    false overrides that, for a node whose driver the rule reads wrongly; `unified_from` says which decided."""
    memory = parse_meminfo(meminfo_text)
    memory["gpus"] = gpus
    wanted = str(unified).lower()
    if wanted in ("true", "false"):
        memory["unified"] = wanted == "true"
        memory["unified_from"] = "setting"
    else:
        memory["unified"] = bool(gpus) and any(gpu["memory_total_mib"] is None for gpu in gpus)
        memory["unified_from"] = "nvidia-smi" if gpus is not None else "no nvidia-smi"
    return memory
