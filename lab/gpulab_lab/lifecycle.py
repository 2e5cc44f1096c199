# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bringing the whole lab up and down, and saying what is up."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from .common import BUILD, CACHE, INVENTORY, NODE_FILES, NS_PREFIX, RUN, STATE_FILE, LabError, existing_namespaces, log, node_dirs, ok, pid_alive, run, stop_pid
from .config import LabConfig
from .images import ensure_base_image, ensure_image, image_is_current, prefetch_wheels, wait_for_pulls
from . import hub
from .inventory import vllm_image_key, write_inventory
from .models import DATA_MOUNT, NODE_DATA, model_folder, prepare_data
from .network import FABRIC_BRIDGE, MGMT_BRIDGE, ensure_bridge, ensure_forwarding, ensure_node_network, remove_forwarding
from .nodes import clear_node_docker, ensure_ssh_keys, start_node_docker, start_node_sshd, stop_node_docker
from .registry import start_registry


def read_state() -> dict | None:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def _need_tools(tools) -> None:
    for tool in tools:
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            raise LabError(f"{tool} is not installed; run `make deps` (installs the lab's Debian packages)")


def check_build_prerequisites() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, bridges, daemons); run it as root")
    _need_tools(("docker", "debootstrap", "docker-registry"))
    if not ok(["docker", "info"]):
        raise LabError("the machine's Docker engine is not answering; run `make deps` to install and start it")


def check_prerequisites() -> None:
    check_build_prerequisites()
    _need_tools(("ip", "iptables", "nsenter", "unshare", "dockerd", "ssh-keygen"))


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
    prepare_data(cfg.node_names)
    for i, name in enumerate(cfg.node_names, start=1):
        ensure_node_network(cfg, i)
        (RUN / name).mkdir(parents=True, exist_ok=True)
        start_node_docker(cfg, name)
        start_node_sshd(cfg, i)
    STATE_FILE.write_text(json.dumps(wanted))
    # Every wheel set an image to build needs downloads at once, beside the base image and the first build; each
    # image is pulled onto the nodes right after its push, while the next one builds.
    prefetch_wheels([key for key in images if not image_is_current(cfg, key)])
    if images:
        ensure_base_image()
    for key in images:
        ensure_image(cfg, key)
    wait_for_pulls()
    # The lab's model as a folder on the controller, for the weights role (from the vLLM image's own layer).
    model = model_folder(cfg, vllm_image_key(images)) if {"vllm", "vllm-seed"} & set(images) else None
    # The seed's own model beside it, for a deployment of the seed's image on a lab up with both (the seed's chain).
    seed_model = model_folder(cfg, "vllm-seed") if "vllm-seed" in images else None
    write_inventory(cfg, images, model, seed_model)
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
    hub.stop()
    # Whatever dockerd did not unmount (a killed daemon), unmount deepest first.
    for target in sorted(lab_mounts(), key=len, reverse=True):
        run(["umount", "-l", target], check=False)
    for ns in existing_namespaces():
        run(["ip", "netns", "del", ns], check=False)
    for bridge in (MGMT_BRIDGE, FABRIC_BRIDGE):
        remove_forwarding(bridge)
        if ok(["ip", "link", "show", bridge]):
            run(["ip", "link", "del", bridge])
    # The verbs device node the lab made while a node was shown a recorded sysfs tree (labctl.py rdma).
    if (RUN / "dev-infiniband.made").exists():
        shutil.rmtree("/dev/infiniband", ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(NODE_FILES, ignore_errors=True)
    # The nodes' own disks (the models the weights role copied) and their mount point on the machine.
    shutil.rmtree(NODE_DATA, ignore_errors=True)
    try:
        DATA_MOUNT.rmdir()  # empty on the machine: only the nodes' namespaces had their folders there
    except OSError:
        pass
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
