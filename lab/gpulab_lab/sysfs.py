"""Sysfs trees as recorded fixtures: record the RDMA part of a host's sysfs, write a recorded tree back to a
folder (for the unit tests), and present one to a lab node in place of its /sys/class."""

from __future__ import annotations

import json
import os
from pathlib import Path

# What the roles read: the RDMA devices and their ports, and the interfaces of PCI devices.
DEVICE_FILES = ("node_guid", "sys_image_guid", "hca_type", "fw_ver", "node_type")
PORT_FILES = ("state", "phys_state", "link_layer", "rate")
NET_FILES = ("operstate", "dev_port", "speed", "mtu")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def record(sysfs: Path = Path("/sys")) -> dict:
    """The RDMA devices under class/infiniband and every interface backed by a device (a `device` link) under
    class/net, with the attributes the roles read, as {relative path: text or {'link': target}}."""
    tree: dict = {}

    def link(rel: str) -> Path:
        path = sysfs / rel
        tree[rel] = {"link": os.readlink(path)}
        return Path(os.path.realpath(path))

    def files(real: Path, names, prefix: str) -> None:
        for name in names:
            text = _read(real / name)
            if text is not None:
                tree[f"{prefix}/{name}"] = text

    def rel_of(real: Path) -> str:
        return os.path.relpath(real, os.path.realpath(sysfs))

    for cls in ("infiniband", "net"):
        folder = sysfs / "class" / cls
        if not folder.is_dir():
            continue
        for name in sorted(os.listdir(folder)):
            if not (folder / name / "device").exists():
                continue  # a virtual interface (lo, bridges, veth): no hardware to map
            real = link(f"class/{cls}/{name}")
            prefix = rel_of(real)
            link(f"{prefix}/device")
            if cls == "net":
                files(real, NET_FILES, prefix)
                continue
            files(real, DEVICE_FILES, prefix)
            for port in sorted(os.listdir(real / "ports")):
                port_dir = real / "ports" / port
                files(port_dir, PORT_FILES, f"{prefix}/ports/{port}")
                for index in sorted(os.listdir(port_dir / "gids"), key=int):
                    gid = _read(port_dir / "gids" / index)
                    if gid is None or gid.strip() == ZERO_GID:
                        continue
                    tree[f"{prefix}/ports/{port}/gids/{index}"] = gid
                    for attr in ("types", "ndevs"):
                        value = _read(port_dir / "gid_attrs" / attr / index)
                        if value is not None:
                            tree[f"{prefix}/ports/{port}/gid_attrs/{attr}/{index}"] = value
    return tree


def _ipv4_gid(address: str) -> str:
    """192.168.177.12 -> 0000:0000:0000:0000:0000:ffff:c0a8:b10c, the IPv4-mapped GID the kernel lists for it."""
    a, b, c, d = (int(part) for part in address.split("."))
    return "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % (a, b, c, d)


def with_addresses(tree: dict, addresses: dict) -> dict:
    """The tree with the IPv4 GIDs the kernel would list for these addresses ({interface: [IPv4, ...]}, in the order
    the interface holds them): on each RoCE port, the GIDs of the recorded addresses go, and for each address of an
    interface the port's GIDs name, one GID per type the port lists (RoCE v1, RoCE v2) is added at the next free
    indices, as the kernel adds them when an address comes up."""
    out = dict(tree)
    ports: dict = {}
    for rel, value in tree.items():
        if "/gids/" in rel and isinstance(value, str):
            port, index = rel.rsplit("/gids/", 1)
            ports.setdefault(port, {})[int(index)] = value.strip()
    for port, gids in sorted(ports.items()):
        types = {index: str(tree.get(f"{port}/gid_attrs/types/{index}", "")).strip() for index in gids}
        netdevs = {index: str(tree.get(f"{port}/gid_attrs/ndevs/{index}", "")).strip() for index in gids}
        for index, gid in gids.items():
            if gid.startswith("0000:0000:0000:0000:0000:ffff:"):
                for rel in (f"{port}/gids/{index}", f"{port}/gid_attrs/types/{index}", f"{port}/gid_attrs/ndevs/{index}"):
                    out.pop(rel, None)
        kept = {index for index, gid in gids.items() if not gid.startswith("0000:0000:0000:0000:0000:ffff:")}
        kinds = sorted({types[index] for index in kept if types[index]}, key=lambda kind: ("v2" in kind, kind))
        named = sorted({netdevs[index] for index in kept if netdevs[index]})
        free = (index for index in range(len(gids) + 64) if index not in kept)
        for netdev in named:
            for address in addresses.get(netdev, []):
                for kind in kinds:
                    index = next(free)
                    out[f"{port}/gids/{index}"] = _ipv4_gid(address) + "\n"
                    out[f"{port}/gid_attrs/types/{index}"] = kind + "\n"
                    out[f"{port}/gid_attrs/ndevs/{index}"] = netdev + "\n"
    return out


def materialize(tree: dict, root: Path) -> Path:
    """Write a recorded tree below root (files and relative links, as recorded); returns root."""
    for rel, value in sorted(tree.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, dict):
            os.symlink(value["link"], path)
        else:
            path.write_text(value)
    return root


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())["tree"]


def class_overlay(tree_root: str, real_class: Path, overlay: Path) -> None:
    """Fill overlay (to be bound onto /sys/class) with every entry of the real /sys/class as an absolute link, then
    the recorded tree's class entries (links into tree_root, as the node will see it) over them."""
    for cls in sorted(os.listdir(real_class)):
        (overlay / cls).mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(real_class / cls)):
            target = os.path.normpath(os.path.join(real_class / cls, os.readlink(real_class / cls / name))) \
                if os.path.islink(real_class / cls / name) else str(real_class / cls / name)
            os.symlink(target, overlay / cls / name)
    recorded = Path(tree_root) / "class"
    for cls in sorted(os.listdir(recorded)):
        (overlay / cls).mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(recorded / cls)):
            entry = overlay / cls / name
            if entry.is_symlink():
                entry.unlink()
            os.symlink(str(recorded / cls / name), entry)


# Where a presented tree and the /sys/class made from it live, inside the node's run folder (its /run over SSH).
TREE = "gpulab-sysfs"
OVERLAY = "gpulab-sysfs-class"
# The verbs device node a host with an HCA has; the lab makes one (char 231:192, as ib_uverbs registers it) while a
# node is presented a tree, so that the roles find /dev/infiniband and hand it to the containers.
DEV_INFINIBAND = Path("/dev/infiniband")
UVERBS0 = (231, 192)


def fixture_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return path
    named = Path(__file__).resolve().parents[2] / "tests" / "unit" / "fixtures" / "sysfs" / f"{name_or_path}.json"
    if not named.exists():
        known = sorted(p.stem for p in named.parent.glob("*.json"))
        raise FileNotFoundError(f"no sysfs fixture {name_or_path!r}; choose from {known} or give a .json path")
    return named
