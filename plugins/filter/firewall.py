# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host firewall the fabric role keeps: default-deny for new TCP on every interface but loopback and the
fabric, the fabric open to the fabric subnet only, for IPv4 and IPv6 alike. Rules are written exactly as
`iptables -S` / `ip6tables -S` print them, so that what a node has can be compared with what it should have."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError

CHAIN = "GPULAB-INPUT"
JUMP = '-A INPUT -m comment --comment "gpulab: default deny" -j ' + CHAIN


def _network(value, what):
    try:
        return ipaddress.ip_network(str(value), strict=False)
    except ValueError as exc:
        raise AnsibleFilterError(f"{what}: {value!r} is not an address or network in CIDR form ({exc})") from exc


def _source(network) -> str:
    """The -s part as iptables prints it: nothing for the whole address space, /32 and /128 spelled out."""
    if network.prefixlen == 0:
        return ""
    return f"-s {network} "


def firewall_rules(family: int, fabric: dict, ssh_port, openings=None) -> list:
    """The chain's rules for one family (4 or 6), in order.

    fabric: fabric_info (interface, network). openings: [{'name', 'port', 'sources': [CIDR, ...]}]; each opening
    admits new TCP to its port from its sources of this family (a source of the other family is left to the other
    chain). Everything else new over TCP is refused with a reset, on every interface but loopback and the fabric.
    """
    if family not in (4, 6):
        raise AnsibleFilterError(f"family must be 4 or 6, not {family!r}")
    comment = '-m comment --comment "gpulab: %s"'
    iface = fabric["interface"]
    subnet = _network(fabric["network"], "fabric_subnet")
    rules = [
        f"-A {CHAIN} -i lo {comment % 'loopback'} -j ACCEPT",
        f"-A {CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED {comment % 'replies'} -j ACCEPT",
    ]
    if subnet.version == family:
        rules.append(f"-A {CHAIN} {_source(subnet)}-i {iface} {comment % 'the fabric subnet'} -j ACCEPT")
    rules.append(f"-A {CHAIN} -i {iface} {comment % 'nothing else on the fabric'} -j DROP")
    rules.append(f"-A {CHAIN} -p tcp -m tcp --dport {int(ssh_port)} {comment % 'ssh'} -j ACCEPT")
    for opening in openings or []:
        name = str(opening.get("name") or f"port {opening['port']}")
        if '"' in name:
            raise AnsibleFilterError(f"firewall opening name {name!r} must not hold a double quote")
        for source in opening.get("sources") or []:
            network = _network(source, f"the sources of {name}")
            if network.version != family:
                continue
            rules.append(f"-A {CHAIN} {_source(network)}-p tcp -m tcp --dport {int(opening['port'])} "
                         f"{comment % name} -j ACCEPT")
    rules.append(f"-A {CHAIN} -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN {comment % 'new TCP refused'} "
                 f"-j REJECT --reject-with tcp-reset")
    return rules


def firewall_drift(listing: dict | None, wanted: list | None = None) -> list:
    """What differs between a node's rules (node_facts' iptables or ip6tables: {'INPUT': [...], CHAIN: [...]}) and
    the wanted chain with its one jump first in INPUT; empty when in place. Without wanted (status.yml, which does
    not know the node's openings) only the shape: the chain ends with the refusal, one jump, first."""
    listing = listing or {}
    problems = []
    have = [rule for rule in (listing.get(CHAIN) or []) if rule.startswith("-A ")]
    if listing.get(CHAIN) is None:
        problems.append(f"no {CHAIN} chain")
    elif wanted is None:
        if not have or "new TCP refused" not in have[-1]:
            problems.append(f"{CHAIN} does not end with the refusal of new TCP")
    elif have != wanted:
        problems.append(f"{CHAIN} differs ({len(have)} rules, {len(wanted)} wanted)")
    appended = [rule for rule in (listing.get("INPUT") or []) if rule.startswith("-A INPUT")]
    jumps = [rule for rule in appended if rule.endswith(f"-j {CHAIN}")]
    if not appended or appended[0] != JUMP:
        problems.append("the jump to %s is not the first rule of INPUT%s" % (
            CHAIN, f" (first: {appended[0]})" if appended and appended[0] not in jumps else ""))
    if len(jumps) > 1:
        problems.append(f"{len(jumps)} jumps to {CHAIN}")
    return problems


def firewall_restore(wanted: list, listing: dict | None, stale=None) -> str:
    """iptables-restore --noflush input that makes the chain exactly wanted and leaves one jump, first in INPUT.

    stale: rules of INPUT to delete besides our jumps (rules of earlier releases)."""
    listing = listing or {}
    lines = ["*filter", f":{CHAIN} - [0:0]"]
    lines += [rule.replace("-A INPUT ", "-D INPUT ", 1) for rule in (listing.get("INPUT") or [])
              if rule.startswith("-A INPUT") and (rule.endswith(f"-j {CHAIN}") or rule in (stale or []))]
    lines += wanted
    lines += [JUMP.replace("-A INPUT ", "-I INPUT 1 ", 1), "COMMIT", ""]
    return "\n".join(lines)


class FilterModule:
    def filters(self):
        return {"firewall_rules": firewall_rules, "firewall_drift": firewall_drift, "firewall_restore": firewall_restore}
