# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's wires: two bridges, one network namespace per node with a management and a fabric interface."""

from __future__ import annotations

from pathlib import Path

from .common import LabError, netns_path, ns_name, ok, run
from .config import LabConfig


MGMT_BRIDGE = "gpl-mgmt"


FABRIC_BRIDGE = "gpl-fab"


IPT_COMMENT = "gpulab-lab"


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
