# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn a host's network facts (gathered, or read by node_facts) into its fabric identity."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError


def _interface_addresses(facts: dict) -> list[tuple[str, str]]:
    """Every (interface, IPv4 address) pair in gathered facts, primaries first."""
    pairs = []
    for name in facts.get("interfaces", []):
        info = facts.get(name.replace("-", "_").replace(".", "_").replace(":", "_"), {}) or facts.get(name, {})
        if not isinstance(info, dict):
            continue
        entries = [info.get("ipv4")] + list(info.get("ipv4_secondaries") or [])
        for entry in entries:
            if isinstance(entry, dict) and entry.get("address"):
                pairs.append((info.get("device", name), entry["address"]))
    return pairs


def fabric_interface(facts: dict, subnet: str, host: str = "this host", expected: str | None = None) -> dict:
    """Return {'interface': NAME, 'address': IP} for the host's one address inside subnet.

    With expected (the inventory's fabric address for the host), that address must be
    inside the subnet and present on one of the host's interfaces.
    """
    try:
        network = ipaddress.ip_network(subnet, strict=False)
    except ValueError as exc:
        raise AnsibleFilterError(f"fabric subnet {subnet!r} is not a network such as 192.168.200.0/24 ({exc})") from exc
    pairs = _interface_addresses(facts)
    if expected:
        if ipaddress.ip_address(expected) not in network:
            raise AnsibleFilterError(
                f"{host}: fabric_address {expected} is outside the fabric subnet {network}; "
                f"correct fabric_address or fabric_subnet in the inventory"
            )
        pairs = [(iface, addr) for iface, addr in pairs if addr == expected] or pairs
        if not any(addr == expected for unused_iface, addr in pairs):
            seen = ", ".join(f"{iface}={addr}" for iface, addr in pairs if iface != "lo") or "none"
            raise AnsibleFilterError(
                f"{host} has no interface with its fabric_address {expected}: its addresses are {seen}; "
                f"bring the fabric interface up or correct fabric_address"
            )
    inside = [(iface, addr) for iface, addr in pairs if ipaddress.ip_address(addr) in network]
    if not inside:
        seen = ", ".join(f"{iface}={addr}" for iface, addr in pairs if iface != "lo") or "none"
        raise AnsibleFilterError(
            f"{host} has no address on the fabric subnet {network}: its addresses are {seen}; "
            f"bring the fabric interface up or correct the fabric subnet"
        )
    if len({pair[0] for pair in inside}) > 1:
        listed = ", ".join(f"{iface}={addr}" for iface, addr in inside)
        raise AnsibleFilterError(
            f"{host} has several interfaces on the fabric subnet {network} ({listed}); "
            f"give each host one fabric interface or narrow the subnet"
        )
    iface, addr = inside[0]
    info = facts.get(iface.replace("-", "_").replace(".", "_").replace(":", "_"), {}) or facts.get(iface, {}) or {}
    if info.get("active") is False:
        raise AnsibleFilterError(
            f"{host}: the fabric interface {iface} ({addr}) is down; bring it up (ip link set {iface} up) "
            f"and check its cable and switch port"
        )
    return {"interface": iface, "address": addr, "prefix": network.prefixlen}


def fabric_env(fabric: dict, head_address: str, rdma_devices=None, extra=None) -> dict:
    """Environment that pins Ray, vLLM and the collective libraries to the fabric."""
    iface = fabric["interface"]
    env = {
        "VLLM_HOST_IP": fabric["address"],
        "NCCL_SOCKET_IFNAME": iface,
        "GLOO_SOCKET_IFNAME": iface,
        "TP_SOCKET_IFNAME": iface,
        "OMPI_MCA_btl_tcp_if_include": iface,
        "MASTER_ADDR": head_address,
        "UCX_NET_DEVICES": iface,
    }
    devices = sorted(rdma_devices or [])
    if devices:
        env["NCCL_IB_HCA"] = ",".join(devices)
        env["UCX_NET_DEVICES"] = ",".join(f"{dev}:1" for dev in devices)
    for key, value in (extra or {}).items():
        env[str(key)] = str(value)
    return env


def cidr_problem(value) -> str:
    """Empty when value is an IPv4/IPv6 network in CIDR form, else what is wrong with it."""
    if not isinstance(value, str) or "/" not in value:
        return f"{value!r} is not in CIDR form (address/prefix)"
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        return str(exc)
    return ""


class FilterModule:
    def filters(self):
        return {"fabric_interface": fabric_interface, "fabric_env": fabric_env, "cidr_problem": cidr_problem}
