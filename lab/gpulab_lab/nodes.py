# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What runs in each lab node: its own Docker daemon (with the lab's NVIDIA hook stand-in) and its own sshd."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from .common import CACHE, PROJECT, RUN, netns_path, node_dirs, ok, pid_alive, run, stop_pid, wait_for
from .config import LabConfig
from .models import bind_data_command


# The stand-in for the NVIDIA container toolkit's hook (lab/gpu/nvidia_hook.py), installed under the name
# dockerd looks for in a folder on the PATH of every node's dockerd only.
GPU_HOOK_SOURCE = PROJECT / "lab" / "gpu" / "nvidia_hook.py"


GPU_HOOK_NAME = "nvidia-container-runtime-hook"


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
        'hostname "$0" && mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && '
        + bind_data_command(name) + ' && shift 2 && exec "$@"',
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
        # The node's own disk for the model (lab/gpulab_lab/models.py), in its SSH sessions as for its containers.
        ' && ' + bind_data_command(name) +
        ' && exec /usr/sbin/sshd -f "$2"',
        name, str(d["run"]), "/run/sshd_config", str(write_node_etc(cfg, name)),
    ]
    run(cmd)
    wait_for(lambda: pid_alive(d["run"] / "sshd.pid") is not None, 15, f"sshd of {name}")
