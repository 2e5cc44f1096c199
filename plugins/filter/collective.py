# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collective check showed, judged against what the fabric promised.

``collective_problems(info, expect)`` takes the check's report (``collective_info``: per node the network and the
devices NCCL took, each rank's NCCL build, each link's rate, the floor) and, by fabric address, what each node must
show (``{ip: {host, network, ports, interface}}``: ``network`` 'IB' for RDMA, 'Socket' for TCP; ``ports`` the fabric
role's RDMA ports). It returns one line per problem; an empty list passes.
"""

from __future__ import annotations

import re

# NCCL's own TCP plugin; every other network plugin NCCL names (IB, or an external one such as IBext_v8) runs RDMA.
SOCKET = "Socket"

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
    if floor <= 0:
        return ""
    slow = ["%s: its link to the head carried %s Gbit/s" % (_where(node, expect.get(node.get("ip")) or {}), node["link_gbps"])
            for node in info.get("nodes") or [] if node.get("link_gbps") is not None and node["link_gbps"] < floor]
    busbw = info.get("busbw_gbps")
    if not slow and busbw is not None and busbw < floor:
        slow.append("the all-reduce reached %s Gbit/s of bus bandwidth with every link above the floor" % busbw)
    if not slow:
        return ""
    return "%s; floor %s Gbit/s (%s): %s" % ("; ".join(slow), info.get("floor_gbps"), info.get("floor"), FLOOR_FIX)


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
        return {"collective_problems": collective_problems, "nccl_port": nccl_port}
