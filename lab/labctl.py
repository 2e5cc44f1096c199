"""The lab in a box: several simulated GPU hosts on one Linux machine.

Each lab node is a network namespace with two interfaces, like a real lab host:
a management one (default route, SSH) and a fabric one named like a ConnectX
port (the RoCE/InfiniBand link). Every node runs its own Docker daemon and its
own sshd; a registry on the machine serves the lab images to every node.

    labctl.py up       bring the lab up (idempotent)
    labctl.py down     remove everything the lab made (safe to run twice)
    labctl.py status   print the lab's state as JSON
    labctl.py images   build and push the lab images only
    labctl.py link NODE up|down   plug or pull a node's fabric cable (failure drills)
    labctl.py docker NODE start|stop   start or stop a node's Docker daemon

Parameters come from the environment: NODES, FABRIC_SUBNET, MGMT_SUBNET,
FABRIC_IF (one name for every node, or one per node), GPUS_PER_NODE,
UNIFIED_MEMORY_NODES, LAB_REGISTRY_PORT, LAB_IMAGES (which images to build).
Must run as root.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import secrets
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
BUILD = PROJECT / "build"
CACHE = BUILD / "cache"
IMAGES_DIR = Path(__file__).resolve().parent / "images"
INVENTORY = PROJECT / "inventories" / "local_lab" / "hosts.yml"
# Runtime state lives on tmpfs with short paths: unix socket paths are limited to 108 bytes.
RUN = Path("/run/gpulab-lab")
STATE_FILE = RUN / "state.json"
NODE_FILES = BUILD / "lab" / "node-files"

NS_PREFIX = "gpl-node"
MGMT_BRIDGE = "gpl-mgmt"
FABRIC_BRIDGE = "gpl-fab"
IPT_COMMENT = "gpulab-lab"
BASE_IMAGE = "gpulab-lab/bookworm:base"
# name -> (recipe folder, repository in the registry, tag)
LAB_IMAGES = {
    "ray": ("ray", "gpulab/ray", "2.60.0"),
    "vllm": ("vllm-cpu", "gpulab/vllm-cpu", "0.32.0"),
}
MAX_NODES = 8
# One ConnectX-style fabric interface name per node, all different, as on real labs where the
# cable sits in another port (or the HCA enumerates elsewhere) on each host.
DEFAULT_FABRIC_IFS = ("enp1s0f0np0", "enP2p1s0f1np1", "enp1s0f1np1", "enP2p1s0f0np0",
                      "enp65s0f0np0", "enp65s0f1np1", "enp193s0f0np0", "enp193s0f1np1")
# The stand-in for the NVIDIA container toolkit's hook (lab/gpu/nvidia_hook.py), installed under the name
# dockerd looks for in a folder on the PATH of every node's dockerd only.
GPU_HOOK_SOURCE = Path(__file__).resolve().parent / "gpu" / "nvidia_hook.py"
GPU_HOOK_NAME = "nvidia-container-runtime-hook"


class LabError(Exception):
    """A one-line, actionable error about the lab."""


def _int_param(env, name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError as exc:
        raise LabError(f"{name}={env[name]!r} is not a number") from exc


@dataclass
class LabConfig:
    nodes: int = 2
    fabric_subnet: str = "10.220.0.0/24"
    mgmt_subnet: str = "10.210.0.0/24"
    fabric_if: str = " ".join(DEFAULT_FABRIC_IFS)
    gpus_per_node: int = 1
    # Nodes whose GPU shares the host's memory (GB10, as in a DGX Spark); the others have their own.
    unified_memory_nodes: str = "node2"
    registry_port: int = 5055
    node_names: list[str] = field(default_factory=list)

    @classmethod
    def from_env(cls) -> "LabConfig":
        env = os.environ
        try:
            nodes = int(env.get("NODES", "2"))
        except ValueError as exc:
            raise LabError(f"NODES={env['NODES']!r} is not a number; use NODES=2..{MAX_NODES}") from exc
        cfg = cls(
            nodes=nodes,
            fabric_subnet=env.get("FABRIC_SUBNET", cls.fabric_subnet),
            mgmt_subnet=env.get("MGMT_SUBNET", cls.mgmt_subnet),
            fabric_if=" ".join((env.get("FABRIC_IF") or cls.fabric_if).replace(",", " ").split()),
            gpus_per_node=_int_param(env, "GPUS_PER_NODE", cls.gpus_per_node),
            unified_memory_nodes=" ".join(env.get("UNIFIED_MEMORY_NODES", cls.unified_memory_nodes).replace(",", " ").split()),
            registry_port=int(env.get("LAB_REGISTRY_PORT", cls.registry_port)),
        )
        cfg.validate()
        cfg.node_names = [f"node{i}" for i in range(1, cfg.nodes + 1)]
        return cfg

    def validate(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise LabError(f"NODES={self.nodes} is out of range; use NODES=1..{MAX_NODES}")
        nets = {}
        for name in ("fabric_subnet", "mgmt_subnet"):
            value = getattr(self, name)
            try:
                net = ipaddress.ip_network(value, strict=True)
            except ValueError as exc:
                raise LabError(f"{name.upper()}={value!r} is not a network such as 10.220.0.0/24: {exc}") from exc
            if net.version != 4 or net.num_addresses < 16:
                raise LabError(f"{name.upper()}={value} must be an IPv4 network of at least 16 addresses (/28 or larger)")
            nets[name] = net
        if nets["fabric_subnet"].overlaps(nets["mgmt_subnet"]):
            raise LabError(f"FABRIC_SUBNET={self.fabric_subnet} overlaps MGMT_SUBNET={self.mgmt_subnet}; choose two separate networks")
        names = self.fabric_if.split()
        if len(names) != 1 and len(names) < self.nodes:
            raise LabError(f"FABRIC_IF names {len(names)} interfaces for {self.nodes} nodes; give one name, or one per node")
        for name in names:
            if not (1 <= len(name) <= 15) or "/" in name:
                raise LabError(f"FABRIC_IF: {name!r} is not a valid interface name (1 to 15 characters, no '/')")
            if name in ("eth0", "lo"):
                raise LabError(f"FABRIC_IF: {name} collides with the node's management or loopback interface; pick another name")
        if not 0 <= self.gpus_per_node <= 8:
            raise LabError(f"GPUS_PER_NODE={self.gpus_per_node} is out of range; use 0..8")
        # A name beyond NODES is allowed (the default names node2, a one-node lab has none).
        unknown = [n for n in self.unified_memory_nodes.split()
                   if not (n.startswith("node") and n[4:].isdigit() and 1 <= int(n[4:]) <= MAX_NODES)]
        if unknown:
            raise LabError(f"UNIFIED_MEMORY_NODES names {unknown}, not lab nodes (node1..node{MAX_NODES}); "
                           f"list lab nodes, or leave it empty")

    def node_fabric_if(self, i: int) -> str:
        """The fabric interface name of node i (1-based)."""
        names = self.fabric_if.split()
        return names[0] if len(names) == 1 else names[i - 1]

    def unified_memory(self, name: str) -> bool:
        return name in self.unified_memory_nodes.split()

    def _host(self, subnet: str, index: int) -> str:
        return str(ipaddress.ip_network(subnet)[index])

    @property
    def prefix(self) -> int:
        return ipaddress.ip_network(self.mgmt_subnet).prefixlen

    @property
    def fabric_prefix(self) -> int:
        return ipaddress.ip_network(self.fabric_subnet).prefixlen

    @property
    def mgmt_gateway(self) -> str:
        return self._host(self.mgmt_subnet, 1)

    def mgmt_ip(self, i: int) -> str:
        return self._host(self.mgmt_subnet, 10 + i)

    def fabric_ip(self, i: int) -> str:
        return self._host(self.fabric_subnet, 10 + i)

    @property
    def registry(self) -> str:
        """The registry as the nodes reach it."""
        return f"{self.mgmt_gateway}:{self.registry_port}"

    def image_ref(self, key: str, for_nodes: bool = True) -> str:
        repo, tag = LAB_IMAGES[key][1:]
        host = self.registry if for_nodes else f"127.0.0.1:{self.registry_port}"
        return f"{host}/{repo}:{tag}"


# --------------------------------------------------------------------------- helpers

def log(msg: str) -> None:
    print(f"lab: {msg}", flush=True)


def run(cmd: list[str], check: bool = True, capture: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, text=True, capture_output=capture, check=False, **kw)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise LabError(f"command failed ({proc.returncode}): {' '.join(cmd)}: {detail[-1] if detail else 'no output'}")
    return proc


def ok(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def stop_pid(pidfile: Path, timeout: float = 30.0) -> None:
    pid = pid_alive(pidfile)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")


def node_dirs(name: str) -> dict[str, Path]:
    run_dir = RUN / name
    return {
        "run": run_dir / "run",  # bound onto /run inside the node's sshd mount namespace
        "exec": run_dir / "x",
        "data": CACHE / "nodes" / name / "docker",
        "log": BUILD / "lab" / "logs",
    }


def netns_path(name: str) -> str:
    return f"/run/netns/{NS_PREFIX}{name[len('node'):]}"


def ns_name(name: str) -> str:
    return f"{NS_PREFIX}{name[len('node'):]}"


def existing_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith(NS_PREFIX))


# --------------------------------------------------------------------------- network

def ensure_bridge(bridge: str, address: str | None) -> None:
    if not ok(["ip", "link", "show", bridge]):
        run(["ip", "link", "add", bridge, "type", "bridge"])
    if address:
        current = run(["ip", "-o", "-4", "addr", "show", "dev", bridge]).stdout
        if address.split("/")[0] + "/" not in current:
            run(["ip", "addr", "add", address, "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])


def iptables_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT", "-m", "comment", "--comment", IPT_COMMENT]


def ensure_forwarding(bridge: str) -> None:
    # Docker sets FORWARD to DROP and bridged frames traverse iptables: without
    # this rule traffic between lab nodes silently disappears.
    if not ok(["iptables", "-C", *iptables_rule(bridge)]):
        run(["iptables", "-I", *iptables_rule(bridge)])


def remove_forwarding(bridge: str) -> None:
    while ok(["iptables", "-C", *iptables_rule(bridge)]):
        run(["iptables", "-D", *iptables_rule(bridge)])


def ensure_node_network(cfg: LabConfig, i: int) -> None:
    name = cfg.node_names[i - 1]
    ns = ns_name(name)
    if not Path(netns_path(name)).exists():
        run(["ip", "netns", "add", ns])
    nsx = ["ip", "netns", "exec", ns]
    run([*nsx, "ip", "link", "set", "lo", "up"])
    for kind, host_if, inner_if, bridge, addr, prefix in (
        ("m", f"gplm{i}", "eth0", MGMT_BRIDGE, cfg.mgmt_ip(i), cfg.prefix),
        ("f", f"gplf{i}", cfg.node_fabric_if(i), FABRIC_BRIDGE, cfg.fabric_ip(i), cfg.fabric_prefix),
    ):
        if not ok([*nsx, "ip", "link", "show", inner_if]):
            if ok(["ip", "link", "show", host_if]):
                run(["ip", "link", "del", host_if])
            run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", f"gpl{kind}{i}p"])
            run(["ip", "link", "set", f"gpl{kind}{i}p", "netns", ns])
            run([*nsx, "ip", "link", "set", f"gpl{kind}{i}p", "name", inner_if])
        run(["ip", "link", "set", host_if, "master", bridge])
        run(["ip", "link", "set", host_if, "up"])
        current = run([*nsx, "ip", "-o", "-4", "addr", "show", "dev", inner_if]).stdout
        if f" {addr}/" not in current:
            run([*nsx, "ip", "addr", "add", f"{addr}/{prefix}", "dev", inner_if])
        run([*nsx, "ip", "link", "set", inner_if, "up"])
    routes = run([*nsx, "ip", "route", "show", "default"]).stdout
    if cfg.mgmt_gateway not in routes:
        run([*nsx, "ip", "route", "replace", "default", "via", cfg.mgmt_gateway, "dev", "eth0"])


def set_fabric_link(cfg: LabConfig, name: str, state: str) -> None:
    """Pull (down) or plug (up) the node's fabric cable: the switch side of its link.

    The node's own interface stays administratively up, as when a cable or a switch
    port fails, so the node only notices by not reaching its peers.
    """
    if name not in cfg.node_names:
        raise LabError(f"no lab node named {name!r}; the lab has {cfg.node_names}")
    i = cfg.node_names.index(name) + 1
    run(["ip", "link", "set", f"gplf{i}", state])


# --------------------------------------------------------------------------- daemons

def start_node_docker(cfg: LabConfig, name: str) -> None:
    d = node_dirs(name)
    pidfile = d["run"] / "docker.pid"
    if pid_alive(pidfile):
        return
    for key in ("run", "exec", "data", "log"):
        d[key].mkdir(parents=True, exist_ok=True)
    sock = d["run"] / "docker.sock"
    etc = write_node_etc(cfg, name)
    logf = open(d["log"] / f"{name}-dockerd.log", "ab")
    # nsenter --net keeps the host's mounts (ip netns exec would remount /sys and
    # dockerd would fail); a private UTS namespace gives the node its own hostname,
    # a private mount namespace its own /etc/hosts and /etc/resolv.conf, which
    # host-network containers copy.
    cmd = [
        "nsenter", f"--net={netns_path(name)}", "--",
        "unshare", "--uts", "--mount", "--propagation", "private", "--",
        "sh", "-c",
        'hostname "$0" && mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"',
        name, str(etc / "hosts"), str(etc / "resolv.conf"),
        "dockerd",
        "--data-root", str(d["data"]),
        "--exec-root", str(d["exec"]),
        "--pidfile", str(pidfile),
        "-H", f"unix://{sock}",
        "--bridge", "none", "--iptables=false", "--ip-masq=false",
        "--insecure-registry", cfg.registry,
        "--log-level", "warn",
    ]
    # dockerd looks for the NVIDIA hook on its PATH when it starts and passes its own environment
    # to the hook: the node's GPUs are described there.
    env = dict(os.environ)
    env["PATH"] = f"{install_gpu_hook()}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    env["GPULAB_LAB_NODE"] = name
    env["GPULAB_LAB_GPUS"] = str(cfg.gpus_per_node)
    env["GPULAB_LAB_UNIFIED_MEMORY"] = "1" if cfg.unified_memory(name) else "0"
    subprocess.Popen(cmd, stdout=logf, stderr=logf, start_new_session=True, env=env)
    wait_for(lambda: ok(["docker", "-H", f"unix://{sock}", "info", "--format", "{{.Name}}"]),
             60, f"the Docker daemon of {name} (log: build/lab/logs/{name}-dockerd.log)")


def install_gpu_hook() -> Path:
    """The folder that holds the lab's NVIDIA hook under the toolkit's program name."""
    folder = RUN / "gpu-hook"
    folder.mkdir(parents=True, exist_ok=True)
    hook = folder / GPU_HOOK_NAME
    hook.write_text(f"#!/bin/sh\nexec /usr/bin/python3 {shlex.quote(str(GPU_HOOK_SOURCE))} \"$@\"\n")
    hook.chmod(0o755)
    return folder


def write_node_etc(cfg: LabConfig, name: str) -> Path:
    """The node's name service, as a lab's hosts file would have it.

    Lab nodes reach no DNS server: without their own names in /etc/hosts, every
    lookup of a node's name (Ray and vLLM make several) waits for a resolver
    timeout. The resolver points at the node itself, so other lookups fail at once.
    """
    etc = RUN / name / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{cfg.mgmt_ip(i)} {node}" for i, node in enumerate(cfg.node_names, start=1)]
    (etc / "hosts").write_text("\n".join(lines) + "\n")
    (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    return etc


def clear_node_docker(name: str) -> None:
    """Remove the node's containers and volumes; keep its images (they are the cache)."""
    sock = node_dirs(name)["run"] / "docker.sock"
    if pid_alive(node_dirs(name)["run"] / "docker.pid") is None:
        return
    docker = ["docker", "-H", f"unix://{sock}"]
    ids = run([*docker, "ps", "-aq"], check=False).stdout.split()
    if ids:
        run([*docker, "rm", "-f", *ids], check=False)
    run([*docker, "volume", "prune", "-f"], check=False)


def stop_node_docker(name: str) -> None:
    stop_pid(node_dirs(name)["run"] / "docker.pid", timeout=60)


def ensure_ssh_keys() -> Path:
    ssh = CACHE / "ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    os.chmod(ssh, 0o700)
    key = ssh / "id_ed25519"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpulab-lab", "-f", str(key)])
    hostkey = ssh / "ssh_host_ed25519_key"
    if not hostkey.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpulab-lab-host", "-f", str(hostkey)])
    shutil.copyfile(key.with_suffix(".pub"), ssh / "authorized_keys")
    os.chmod(ssh / "authorized_keys", 0o600)
    return key


def start_node_sshd(cfg: LabConfig, i: int) -> None:
    name = cfg.node_names[i - 1]
    d = node_dirs(name)
    if pid_alive(d["run"] / "sshd.pid"):
        return
    ssh = CACHE / "ssh"
    conf = d["run"] / "sshd_config"  # seen as /run/sshd_config once the node's /run is bound
    conf.write_text(
        "\n".join([
            f"ListenAddress {cfg.mgmt_ip(i)}",
            "Port 22",
            f"HostKey {ssh / 'ssh_host_ed25519_key'}",
            "PidFile /run/sshd.pid",
            f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PrintMotd no",
            "MaxStartups 200:30:400",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            "",
        ])
    )
    # The node's sshd sees the node's own run folder as /run, so inside an SSH
    # session /run/docker.sock (and /var/run/docker.sock) is that node's daemon.
    cmd = [
        "nsenter", f"--net={netns_path(name)}", "--",
        "unshare", "--mount", "--uts", "--propagation", "private", "--",
        "sh", "-c",
        # A sysfs mounted here shows the node's own interfaces, so gathered facts are the node's.
        'hostname "$0" && mount -t sysfs sysfs /sys && mount --bind "$3/hosts" /etc/hosts'
        ' && mount --bind "$3/resolv.conf" /etc/resolv.conf && mount --bind "$1" /run && mkdir -p /run/sshd'
        ' && exec /usr/sbin/sshd -f "$2"',
        name, str(d["run"]), "/run/sshd_config", str(write_node_etc(cfg, name)),
    ]
    run(cmd)
    wait_for(lambda: pid_alive(d["run"] / "sshd.pid") is not None, 15, f"sshd of {name}")


def start_registry(cfg: LabConfig) -> None:
    pidfile = RUN / "registry.pid"
    if pid_alive(pidfile):
        return
    storage = CACHE / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    conf = RUN / "registry.yml"
    # Listens on all addresses: the machine pushes over loopback, the nodes pull
    # over the management bridge. No authentication: it only holds lab images.
    conf.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: :{cfg.registry_port}\n"
    )
    (BUILD / "lab" / "logs").mkdir(parents=True, exist_ok=True)
    logf = open(BUILD / "lab" / "logs" / "registry.log", "ab")
    proc = subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=logf, stderr=logf, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    import urllib.request

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{cfg.registry_port}/v2/", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(answers, 30, f"the lab registry on port {cfg.registry_port} (log: build/lab/logs/registry.log)")


# --------------------------------------------------------------------------- images

def recipe_hash(folder: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(folder).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def image_label(ref: str, label: str) -> str | None:
    proc = run(["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', ref], check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_base_image() -> None:
    if image_label(BASE_IMAGE, "org.gpulab.lab.base") is not None:
        return
    rootfs = CACHE / "rootfs-bookworm"
    if not (rootfs / "usr" / "bin" / "apt-get").exists():
        log("making a Debian bookworm root file system (debootstrap, once)")
        shutil.rmtree(rootfs, ignore_errors=True)
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs)], capture=True)
    log(f"importing {BASE_IMAGE}")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run(["docker", "import", "--change", "LABEL org.gpulab.lab.base=bookworm",
         "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE], stdin=tar.stdout)
    tar.wait()


def ensure_wheelhouse(key: str, folder: Path) -> Path:
    house = CACHE / "wheelhouse" / key
    house.mkdir(parents=True, exist_ok=True)
    stamp = house / ".requirements"
    req = (folder / "requirements.txt").read_text()
    if stamp.exists() and stamp.read_text() == req:
        return house
    log(f"downloading wheels for the {key} image into {house.relative_to(PROJECT)}")
    pip_extra = os.environ.get("LAB_PIP_ARGS", "").split()
    run([sys.executable, "-m", "pip", "download", "--quiet", "-d", str(house),
         "-r", str(folder / "requirements.txt"), *pip_extra], capture=True)
    stamp.write_text(req)
    return house


def ensure_image(cfg: LabConfig, key: str) -> None:
    folder_name = LAB_IMAGES[key][0]
    folder = IMAGES_DIR / folder_name
    local_ref = cfg.image_ref(key, for_nodes=False)
    digest = recipe_hash(folder, extra=run(["docker", "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]).stdout)
    if image_label(local_ref, "org.gpulab.lab.recipe") != digest:
        house = ensure_wheelhouse(key, folder)
        context = BUILD / "context" / key
        shutil.rmtree(context, ignore_errors=True)
        shutil.copytree(folder, context)
        # Hard links: the wheels are large and the context only needs to be read.
        shutil.copytree(house, context / "wheelhouse", copy_function=os.link)
        log(f"building {local_ref} (recipe {digest})")
        started = time.monotonic()
        with open(BUILD / "lab" / "logs" / f"build-{key}.log", "w") as build_log:
            proc = subprocess.run(
                ["docker", "build", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                 "--label", f"org.gpulab.lab.recipe={digest}", "-t", local_ref, str(context)],
                stdout=build_log, stderr=subprocess.STDOUT, check=False,
            )
        if proc.returncode != 0:
            raise LabError(f"building the {key} image failed; see build/lab/logs/build-{key}.log")
        log(f"built {local_ref} in {time.monotonic() - started:.0f}s")
        shutil.rmtree(context, ignore_errors=True)
    run(["docker", "push", "--quiet", local_ref])


# --------------------------------------------------------------------------- inventory

def lab_secrets() -> dict:
    """The lab's Ray token and vLLM API key: random per machine, kept root-only in the cache."""
    path = CACHE / "secrets.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"ray_cluster_auth_token": secrets.token_hex(32),
                       "vllm_server_api_key": secrets.token_hex(32)}, out)
    return json.loads(path.read_text())


def pinned_ref(cfg: LabConfig, key: str) -> str:
    """The nodes' reference of a lab image, pinned by the digest the registry gave it (as a real lab
    should pin its images): the roles can then pull only what is missing. The tag when the image was
    never pushed from this machine."""
    local = cfg.image_ref(key, for_nodes=False)
    proc = run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", local], check=False)
    repo = local.rsplit(":", 1)[0]
    digests = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
    for entry in digests or []:
        if entry.startswith(repo + "@"):
            return cfg.image_ref(key).rsplit(":", 1)[0] + "@" + entry.split("@", 1)[1]
    return cfg.image_ref(key)


def write_inventory(cfg: LabConfig) -> None:
    key = CACHE / "ssh" / "id_ed25519"
    hosts = {}
    for i, name in enumerate(cfg.node_names, start=1):
        hosts[name] = {"ansible_host": cfg.mgmt_ip(i), "lab_fabric_ip": cfg.fabric_ip(i),
                       "lab_fabric_if": cfg.node_fabric_if(i), "lab_unified_memory": cfg.unified_memory(name)}
    head, workers = cfg.node_names[0], cfg.node_names[1:]
    inventory = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                "ansible_python_interpreter": "/usr/bin/python3",
                "fabric_subnet": cfg.fabric_subnet,
                "lab_gpus_per_node": cfg.gpus_per_node,
                "lab_mgmt_subnet": cfg.mgmt_subnet,
                "lab_registry": cfg.registry,
                "lab_ray_image": pinned_ref(cfg, "ray"),
                "lab_vllm_image": pinned_ref(cfg, "vllm"),
                # A real lab keeps these in Ansible Vault; the lab makes its own per machine.
                **lab_secrets(),
                # Lab nodes share the machine's disk: the files the roles write go under the lab's
                # own folder, which `make lab-down` removes.
                "ray_cluster_secrets_dir": str(NODE_FILES / "secrets"),
                "vllm_server_config_dir": str(NODE_FILES / "vllm"),
            },
            "children": {
                "ray_head": {"hosts": {head: hosts[head]}},
                "ray_workers": {"hosts": {n: hosts[n] for n in workers}},
            },
        }
    }
    INVENTORY.parent.mkdir(parents=True, exist_ok=True)
    body = "# Generated by `make lab-up` for the lab that is up now. Do not edit.\n" + json.dumps(inventory, indent=2) + "\n"
    fd = os.open(INVENTORY, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(body)
    os.chmod(INVENTORY, 0o600)  # it carries the lab's secrets


# --------------------------------------------------------------------------- up / down

def read_state() -> dict | None:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, bridges, daemons); run it as root")
    for tool in ("ip", "iptables", "nsenter", "unshare", "dockerd", "docker", "docker-registry", "ssh-keygen", "debootstrap"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            raise LabError(f"{tool} is not installed; run `make deps` (installs the lab's Debian packages)")
    if not ok(["docker", "info"]):
        raise LabError("the machine's Docker engine is not answering; run `make deps` to install and start it")


def up(cfg: LabConfig, images: list[str]) -> None:
    check_prerequisites()
    previous = read_state()
    wanted = asdict(cfg)
    if previous and previous != wanted:
        log("the lab that is up has other parameters: taking it down first")
        down()
    started = time.monotonic()
    RUN.mkdir(parents=True, exist_ok=True)
    (BUILD / "lab" / "logs").mkdir(parents=True, exist_ok=True)
    ensure_bridge(MGMT_BRIDGE, f"{cfg.mgmt_gateway}/{cfg.prefix}")
    ensure_bridge(FABRIC_BRIDGE, None)
    ensure_forwarding(MGMT_BRIDGE)
    ensure_forwarding(FABRIC_BRIDGE)
    ensure_ssh_keys()
    start_registry(cfg)
    for i, name in enumerate(cfg.node_names, start=1):
        ensure_node_network(cfg, i)
        (RUN / name).mkdir(parents=True, exist_ok=True)
        start_node_docker(cfg, name)
        start_node_sshd(cfg, i)
    STATE_FILE.write_text(json.dumps(wanted))
    ensure_base_image()
    for key in images:
        ensure_image(cfg, key)
    write_inventory(cfg)
    fabric = ", ".join(f"{n}={cfg.node_fabric_if(i)}" for i, n in enumerate(cfg.node_names, start=1))
    log(f"up: {cfg.nodes} node(s), fabric {cfg.fabric_subnet} on {fabric}, {cfg.gpus_per_node} lab GPU(s) per node"
        f"{', unified memory on ' + cfg.unified_memory_nodes if cfg.unified_memory_nodes else ''}, "
        f"management {cfg.mgmt_subnet}, registry {cfg.registry} ({time.monotonic() - started:.1f}s)")


def lab_mounts() -> list[str]:
    markers = (str(RUN), str(CACHE / "nodes"))
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(markers):
            mounts.append(target)
    return mounts


def down() -> None:
    state = read_state()
    names = {f"node{ns[len(NS_PREFIX):]}" for ns in existing_namespaces()}
    if RUN.exists():
        names |= {p.name for p in RUN.iterdir() if p.is_dir() and p.name.startswith("node")}
    for name in sorted(names):
        stop_pid(node_dirs(name)["run"] / "sshd.pid", timeout=10)
        clear_node_docker(name)
        stop_node_docker(name)
    stop_pid(RUN / "registry.pid", timeout=10)
    # Whatever dockerd did not unmount (a killed daemon), unmount deepest first.
    for target in sorted(lab_mounts(), key=len, reverse=True):
        run(["umount", "-l", target], check=False)
    for ns in existing_namespaces():
        run(["ip", "netns", "del", ns], check=False)
    for bridge in (MGMT_BRIDGE, FABRIC_BRIDGE):
        remove_forwarding(bridge)
        if ok(["ip", "link", "show", bridge]):
            run(["ip", "link", "del", bridge])
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(NODE_FILES, ignore_errors=True)
    if INVENTORY.exists():
        INVENTORY.unlink()
    log("down: no namespace, bridge, daemon, sshd, registry, container or rule of the lab is left"
        + ("" if state or names else " (nothing was up)"))


def status() -> dict:
    state = read_state() or {}
    nodes = {}
    for ns in existing_namespaces():
        name = f"node{ns[len(NS_PREFIX):]}"
        d = node_dirs(name)
        nodes[name] = {
            "namespace": ns,
            "dockerd": pid_alive(d["run"] / "docker.pid") is not None,
            "sshd": pid_alive(d["run"] / "sshd.pid") is not None,
            "docker_host": f"unix://{d['run'] / 'docker.sock'}",
        }
    return {"config": state, "registry": pid_alive(RUN / "registry.pid") is not None, "nodes": nodes}


def current_config() -> LabConfig:
    state = read_state()
    if not state:
        raise LabError("the lab is not up; run `make lab-up` first")
    return LabConfig(**state)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    try:
        verb = argv[0]
        if verb == "up":
            images = [k for k in os.environ.get("LAB_IMAGES", "ray vllm").split() if k]
            unknown = [k for k in images if k not in LAB_IMAGES]
            if unknown:
                raise LabError(f"LAB_IMAGES names unknown image(s) {unknown}; choose from {sorted(LAB_IMAGES)}")
            up(LabConfig.from_env(), images)
        elif verb == "down":
            down()
        elif verb == "status":
            print(json.dumps(status(), indent=2))
        elif verb == "images":
            cfg = current_config()
            ensure_base_image()
            for key in argv[1:] or list(LAB_IMAGES):
                ensure_image(cfg, key)
        elif verb == "link" and len(argv) == 3 and argv[2] in ("up", "down"):
            set_fabric_link(current_config(), argv[1], argv[2])
        elif verb == "docker" and len(argv) == 3 and argv[2] in ("start", "stop"):
            cfg = current_config()
            if argv[1] not in cfg.node_names:
                raise LabError(f"no lab node named {argv[1]!r}; the lab has {cfg.node_names}")
            (start_node_docker if argv[2] == "start" else lambda c, n: stop_node_docker(n))(cfg, argv[1])
        else:
            print(__doc__)
            return 2
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
