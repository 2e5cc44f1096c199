# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's parameters (nodes, subnets, fabric interface names, GPUs), read from the environment and checked."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from .common import LabError


@dataclass(frozen=True)
class LabImage:
    """A lab image: its recipe folder, where it goes in the registry, and the pinned package list
    the recipe installs (requirements-*.txt in the folder). A lock installs with --no-deps: every
    package it needs is listed, pinned, in the lock itself."""
    folder: str
    repo: str
    tag: str
    requirements: str = "requirements.txt"

    @property
    def locked(self) -> bool:
        return self.requirements.endswith(".lock")


LAB_IMAGES = {
    "ray": LabImage("ray", "gpulab/ray", "2.60.0"),
    "vllm": LabImage("vllm-cpu", "gpulab/vllm-cpu", "0.32.0"),
    # The versions of the image our first users run (vLLM 0.17.1, Ray 2.53.0): see lab/README.md.
    "vllm-seed": LabImage("vllm-cpu", "gpulab/vllm-cpu", "0.17.1", "requirements-0.17.1.lock"),
}


MAX_NODES = 8


# One ConnectX-style fabric interface name per node, all different, as on real labs where the
# cable sits in another port (or the HCA enumerates elsewhere) on each host.
DEFAULT_FABRIC_IFS = ("enp1s0f0np0", "enP2p1s0f1np1", "enp1s0f1np1", "enP2p1s0f0np0",
                      "enp65s0f0np0", "enp65s0f1np1", "enp193s0f0np0", "enp193s0f1np1")


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
    def from_env(cls, env=None) -> "LabConfig":
        env = os.environ if env is None else env
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
        repo, tag = LAB_IMAGES[key].repo, LAB_IMAGES[key].tag
        host = self.registry if for_nodes else f"127.0.0.1:{self.registry_port}"
        return f"{host}/{repo}:{tag}"
