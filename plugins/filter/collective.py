# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collective check showed, judged against what the fabric promised.

``collective_problems(info, expect)`` takes the check's report (``collective_info``: per node the network and the
devices NCCL took, each rank's NCCL build, each link's rate, the floor) and, by fabric address, what each node must
show (``{ip: {host, network, ports, interface}}``: ``network`` 'IB' for RDMA, 'Socket' for TCP; ``ports`` the fabric
role's RDMA ports). It returns one line per problem; an empty list passes.

``collective_problems`` stands on the standard library alone: the supervisor (gpulab.vllm.supervisor) judges the
collective it runs before it starts a server again with this file's own rule, in a Python without Ansible.
"""

from __future__ import annotations

import re

# NCCL's own TCP plugin; every other network plugin NCCL names (IB, or an external one such as IBext_v8) runs RDMA.
SOCKET = "Socket"

RAILS_FIX = ("every link to the head passed, so NCCL crosses fewer rails than the fabric has: check that NCCL's "
             "'NET/IB : Using' line on each node lists every rail (NCCL_IB_HCA), that each rail is ACTIVE at its rate "
             "(ibstat), and GPU-to-HCA affinity (nvidia-smi topo -m); or lower collective_min_gbps if fewer rails are "
             "meant")

FLOOR_FIX = ("check the link's speed and errors (ethtool, ibstat), the MTU on both ends, a throttled or shared port "
             "(tc qdisc), or lower collective_min_gbps if this fabric is slower on purpose")


def nccl_port(label: str) -> str:
    """A device as NCCL's network plugin lists it, as the fabric names it: 'mlx5_0:1/RoCE' is 'mlx5_0:1' (HCA and
    port); 'eth0:10.0.0.1<0>' (the socket plugin's interface and address) is 'eth0'."""
    label = str(label)
    found = re.match(r"^(.+?):(\d+)/\w+$", label)
    if found:
        return "%s:%s" % found.groups()
    return re.sub(r":[^:]*<\d+>$", "", label)


def _port_names(ports) -> list:
    return [item if isinstance(item, str) else "%s:%s" % (item["device"], item["port"]) for item in ports or []]


def _where(node: dict, want: dict) -> str:
    return "%s (%s)" % (want.get("host") or node.get("ip"), node.get("ip"))


def _network_problem(node: dict, want: dict) -> str:
    network = node.get("network")
    where = _where(node, want)
    if want["network"] == SOCKET:
        if network != SOCKET:
            return ("%s: NCCL took NET/%s where TCP on %s was expected: NCCL_IB_DISABLE and NCCL_SOCKET_IFNAME are not "
                    "what the fabric role set" % (where, network, want.get("interface")))
        taken = sorted({nccl_port(device) for device in node.get("devices") or []})
        if taken and taken != [want.get("interface")]:
            return ("%s: NCCL's sockets are on %s, not on the fabric interface %s: NCCL_SOCKET_IFNAME is not what the "
                    "fabric role set" % (where, ", ".join(taken), want.get("interface")))
        return ""
    expected = _port_names(want.get("ports"))
    if network in (None, SOCKET):
        return ("%s: NCCL took NET/%s where RDMA through %s was expected: check that the container has /dev/infiniband, "
                "the image libibverbs and the mlx5 provider, and NCCL_IB_HCA" % (where, network, ", ".join(expected)))
    taken = sorted({nccl_port(device) for device in node.get("devices") or []})
    if not taken or not expected or taken == sorted(expected):
        return ""
    roles = {name: (item.get("role") if isinstance(item, dict) else None) for name, item in zip(expected, want["ports"])}
    left_out = ["%s%s" % (name, " (%s)" % roles[name] if roles.get(name) else "") for name in expected if name not in taken]
    foreign = [name for name in taken if name not in expected]
    said = []
    if left_out:
        said.append("left out %s" % ", ".join(left_out))
    if foreign:
        said.append("took %s, which %s not the fabric's (a storage HCA or another rail)"
                    % (", ".join(foreign), "is" if len(foreign) == 1 else "are"))
    return ("%s: NCCL's %s plugin %s; the fabric's ports are %s: NCCL_IB_HCA in the Ray containers' environment must name "
            "exactly these (the fabric role sets it; fabric_rdma_devices overrides) and each must be ACTIVE"
            % (where, network, " and ".join(said), ", ".join(expected)))


def _build(rank: dict) -> tuple:
    """What makes two NCCL builds one: the set of SHA-256 digests of the libraries mapped when they were read (a rank
    given an LD_PRELOAD maps two, each with its digest, one build if their bytes are one), else path and version."""
    sha256 = rank.get("sha256") or ""
    if sha256 and not sha256.startswith("unreadable"):
        return (frozenset(sha256.split(":")),)
    return (rank.get("path"), rank.get("version"))


def _digests(sha256) -> str:
    """A rank's digests as the problem names them: 12 characters of each (two where an LD_PRELOAD mapped two)."""
    if not sha256:
        return "not read"
    if sha256.startswith("unreadable"):
        return sha256[:12]
    return ":".join(digest[:12] for digest in sha256.split(":"))


def _library_problem(ranks: list, expect: dict) -> str:
    builds = {}
    for rank in sorted(ranks, key=lambda item: item.get("rank", 0)):
        builds.setdefault(_build(rank), []).append(rank)
    if len(builds) < 2:
        return ""
    said = []
    for members in builds.values():
        first = members[0]
        nodes = []
        for rank in members:
            where = "%s (%s)" % ((expect.get(rank.get("ip")) or {}).get("host") or rank.get("ip"), rank.get("ip"))
            if where not in nodes:
                nodes.append(where)
        said.append("rank%s %s on %s: %s, NCCL %s, sha256 %s" % (
            "s" if len(members) > 1 else "", ", ".join(str(rank.get("rank")) for rank in members), ", ".join(nodes),
            first.get("path") or "linked into PyTorch", first.get("version") or "of unknown version",
            _digests(first.get("sha256"))))
    return ("the ranks load %d different NCCL builds (%s): every rank must load one build, as two builds of one version "
            "have hung a serve mid-run; run the same image on every node and check LD_LIBRARY_PATH and LD_PRELOAD in "
            "the Ray containers of the node that differs" % (len(builds), "; ".join(said)))


def _floor_problem(info: dict, expect: dict) -> str:
    floor = float(info.get("floor_gbps") or 0)
    # Each node's link to the head is one pair of ranks: held to one port's floor (the same floor on one rail).
    link_floor = float(info.get("link_floor_gbps") if info.get("link_floor_gbps") is not None else floor)
    slow = ["%s: its link to the head carried %s Gbit/s" % (_where(node, expect.get(node.get("ip")) or {}), node["link_gbps"])
            for node in info.get("nodes") or [] if link_floor > 0 and node.get("link_gbps") is not None
            and node["link_gbps"] < link_floor]
    if slow:
        return "%s; floor %s Gbit/s (%s): %s" % ("; ".join(slow), info.get("link_floor_gbps", info.get("floor_gbps")),
                                                 info.get("link_floor", info.get("floor")), FLOOR_FIX)
    busbw = info.get("busbw_gbps")
    if floor > 0 and busbw is not None and busbw < floor:
        return ("the all-reduce reached %s Gbit/s of bus bandwidth with every link above the floor; floor %s Gbit/s "
                "(%s): %s" % (busbw, info.get("floor_gbps"), info.get("floor"),
                              RAILS_FIX if " rails " in str(info.get("floor")) else FLOOR_FIX))
    return ""


def collective_expectations(hosts, fabrics, networks=None) -> dict:
    """What the collective must show on each node, by fabric address, from what the fabric role published.

    hosts: the nodes' names; fabrics: each node's fabric_info; networks: each node's network read (for the speed of
    an interface without RDMA). Per node: 'host', 'network' ('IB' for RDMA, 'Socket' for TCP), 'ports' and
    'interface' (what collective_problems compares NCCL's devices with), 'rate_gbps' (what the node's fabric carries at
    most: over RDMA the sum of its physical ports, the interface's and each rail's, a twin being a second path to a
    port already counted; over TCP the interface's speed), 'port_gbps' (its slowest physical port; the interface's
    speed over TCP) and 'rails' (how many physical ports are summed)."""
    # Here, not at the top: the verdict (collective_problems) must load where the collection is not installed.
    from ansible_collections.gpulab.vllm.plugins.filter.fabric import port_gbps  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpulab.vllm.plugins.module_utils._node import facts_key  # pylint: disable=import-outside-toplevel

    out = {}
    networks = list(networks or [])
    for index, (host, fabric) in enumerate(zip(hosts, fabrics)):
        fabric = fabric or {}
        ports = list(fabric.get("rdma_ports") or [])
        if fabric.get("transport") == "rdma":
            rates = [port_gbps(port.get("rate")) for port in ports if port.get("role") != "twin"]
            rates = [rate for rate in rates if rate > 0]
            aggregate, slowest = sum(rates), (min(rates) if rates else 0.0)
        else:
            network = (networks[index] if index < len(networks) else None) or {}
            iface = str(fabric.get("interface") or "")
            info = network.get(facts_key(iface)) or network.get(iface) or {}
            aggregate = slowest = float(info.get("speed") or 0) / 1000
            rates = [aggregate] if aggregate > 0 else []
        out[fabric.get("ip")] = {
            "host": host, "network": "IB" if fabric.get("transport") == "rdma" else SOCKET, "ports": ports,
            "interface": fabric.get("interface"), "rate_gbps": aggregate, "port_gbps": slowest, "rails": len(rates)}
    return out


def collective_floor(expect: dict, min_gbps=None, fraction=0.25) -> dict:
    """The floors the collective is held to, and where each comes from.

    'floor_gbps' for the all-reduce's bus bandwidth: collective_min_gbps when given, else fraction x the slowest
    node's rate_gbps (on a multi-rail host its rails together: one rail of eight falls under it);
    'link_floor_gbps' for each node's link to the head (one pair of ranks): the same given value, else fraction x
    the slowest physical port. 0.0 with 'no floor' when no rate is known."""
    if min_gbps is not None and str(min_gbps) != "":
        return {"floor_gbps": float(min_gbps), "floor": "collective_min_gbps",
                "link_floor_gbps": float(min_gbps), "link_floor": "collective_min_gbps"}
    fraction = float(fraction)
    known = [want for want in (expect or {}).values() if float(want.get("rate_gbps") or 0) > 0]
    if not known:
        return {"floor_gbps": 0.0, "floor": "no floor: no fabric rate known",
                "link_floor_gbps": 0.0, "link_floor": "no floor: no fabric rate known"}
    slowest = min(known, key=lambda want: float(want["rate_gbps"]))
    port = min(float(want.get("port_gbps") or want["rate_gbps"]) for want in known)
    rate = float(slowest["rate_gbps"])
    rails = int(slowest.get("rails") or 1)
    link = {"link_floor_gbps": round(port * fraction, 3),
            "link_floor": "%s x %s Gbit/s, the slowest fabric rate" % (fraction, _number(port))}
    if rails > 1:
        return dict(link, floor_gbps=round(rate * fraction, 3),
                    floor="%s x %s Gbit/s, the slowest node's %d rails together (%s)"
                    % (fraction, _number(rate), rails, slowest.get("host")))
    return dict(link, floor_gbps=round(rate * fraction, 3),
                floor="%s x %s Gbit/s, the slowest fabric rate" % (fraction, _number(rate)))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def collective_problems(info: dict, expect: dict) -> list:
    """Every way the collective's report falls short of the fabric: one line each."""
    info = info or {}
    expect = expect or {}
    problems = []
    if info.get("backend") == "nccl":
        for node in info.get("nodes") or []:
            want = expect.get(node.get("ip"))
            if want:
                problems.append(_network_problem(node, want))
        problems.append(_library_problem(info.get("nccl_ranks") or [], expect))
    problems.append(_floor_problem(info, expect))
    return [problem for problem in problems if problem]


class FilterModule:
    def filters(self):
        return {"collective_problems": collective_problems, "nccl_port": nccl_port,
                "collective_expectations": collective_expectations, "collective_floor": collective_floor}
