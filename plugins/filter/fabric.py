# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn a host's network facts (gathered, or read by node_facts) into its fabric identity."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError

from ansible_collections.gpulab.vllm.plugins.module_utils._node import facts_key


def _interface_addresses(facts: dict) -> list[tuple[str, str]]:
    """Every (interface, IPv4 address) pair in gathered facts, primaries first."""
    pairs = []
    for name in facts.get("interfaces", []):
        info = facts.get(facts_key(name), {}) or facts.get(name, {})
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
            f"{host} has several interfaces on the fabric subnet {network} ({listed}); set fabric_address for {host} "
            f"to the one Ray, Gloo and NCCL's bootstrap are to use (NCCL takes every rail on its own), or narrow the subnet"
        )
    iface, addr = inside[0]
    info = facts.get(facts_key(iface), {}) or facts.get(iface, {}) or {}
    if info.get("active") is False:
        raise AnsibleFilterError(
            f"{host}: the fabric interface {iface} ({addr}) is down; bring it up (ip link set {iface} up) "
            f"and check its cable and switch port"
        )
    mtu = info.get("mtu")
    return {"interface": iface, "address": addr, "prefix": network.prefixlen, "network": str(network),
            "mtu": int(mtu) if mtu else None}


def _pci_parts(pci):
    """'0002:01:00.1' -> ('0002', '01:00', '1'); None for a device without a PCI address."""
    if not pci or pci.count(":") != 2 or "." not in pci:
        return None
    domain, bus, rest = pci.split(":")
    slot, function = rest.split(".", 1)
    return domain, bus + ":" + slot, function


def _port_of(device: dict, interface: str, netdev: dict) -> str | None:
    """The port of device that carries interface: the one port, else the port whose GIDs name the interface,
    else the interface's dev_port + 1 (IPoIB on a multi-port function)."""
    ports = device.get("ports") or {}
    if len(ports) == 1:
        return next(iter(ports))
    for number, port in sorted(ports.items()):
        if any(gid.get("netdev") == interface for gid in port.get("gids") or []):
            return number
    guess = str(int(netdev.get("dev_port") or 0) + 1)
    return guess if guess in ports else None


def _entry(name: str, number: str, device: dict, role: str) -> dict:
    port = device["ports"][number]
    return {"device": name, "port": int(number), "pci": device.get("pci"), "link_layer": port.get("link_layer"),
            "rate": port.get("rate"), "state": port.get("state"), "role": role}


def port_gbps(rate) -> float:
    """'400 Gb/sec (4X NDR)' -> 400.0: a port's rate in Gbit/s as sysfs gives it; 0.0 when it gives none."""
    head = str(rate or "").split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return 0.0


def _port_netdevs(name: str, number: str, device: dict, netdevs: dict) -> list:
    """The interfaces on a device's port: those the kernel lists with the device, and those its GIDs name (a VLAN or
    a bond on top of it)."""
    found = {netdev for netdev, info in netdevs.items()
             if name in ((info or {}).get("rdma_devices") or []) and _port_of(device, netdev, info or {}) == number}
    found.update(gid["netdev"] for gid in device["ports"][number].get("gids") or [] if gid.get("netdev"))
    return sorted(found)


def _rails(devices: dict, netdevs: dict, chosen: list, addresses: dict, network) -> list:
    """The other compute ports of a multi-rail host, beside the fabric interface's own: every ACTIVE port with the
    interface port's link layer and rate, unless an interface on it holds an address off the fabric subnet (it
    serves another network: storage, in-band management). On Ethernet a rail must hold an address on the fabric
    subnet, as RoCE v2 reaches a port by its address; an InfiniBand port needs none."""
    base = next((entry for entry in chosen if entry["role"] == "interface"), None)
    if base is None:
        return []
    taken = {entry["device"] for entry in chosen}
    rails = []
    for name, device in sorted(devices.items()):
        if name in taken:
            continue
        for number, port in sorted((device.get("ports") or {}).items()):
            if (port.get("state") != "ACTIVE" or port.get("link_layer") != base["link_layer"]
                    or port_gbps(port.get("rate")) != port_gbps(base["rate"])):
                continue
            held = [address for netdev in _port_netdevs(name, number, device, netdevs)
                    for address in addresses.get(netdev, [])]
            if network is not None and any(ipaddress.ip_address(address) not in network for address in held):
                continue
            if base["link_layer"] == "Ethernet" and not held:
                continue
            rails.append(_entry(name, number, device, "rail"))
    return rails


def _twins(devices: dict, chosen: list) -> list:
    """Another PCIe function of the same adapter (same system image GUID) with the same function number behind
    another PCIe link reaches the same physical port (a DGX Spark's two x4 links); NCCL uses both when both are
    ACTIVE."""
    twins = []
    for entry in chosen:
        parts = _pci_parts(entry["pci"])
        guid = devices[entry["device"]].get("sys_image_guid")
        if parts is None or not guid:
            continue
        for name, device in sorted(devices.items()):
            other = _pci_parts(device.get("pci"))
            if (name in [item["device"] for item in chosen + twins] or other is None
                    or device.get("sys_image_guid") != guid or other[2] != parts[2] or other[:2] == parts[:2]):
                continue
            for number, port in sorted((device.get("ports") or {}).items()):
                if port.get("state") == "ACTIVE" and port.get("link_layer") == entry["link_layer"]:
                    twins.append(_entry(name, number, device, "twin"))
    return twins


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address an IPv4-mapped GID carries ('0000:...:ffff:c0a8:b10c' -> '192.168.177.12'), else None."""
    try:
        mapped = ipaddress.IPv6Address(str(gid).strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def _gid_valid(gid: str) -> bool:
    """As NCCL judges a GID: configured (not all zero, not fe80:: alone) and not link-local (fe80::/64)."""
    try:
        packed = ipaddress.IPv6Address(str(gid).strip()).packed
    except ValueError:
        return False
    head, trailer = packed[:4], packed[4:]
    if not any(packed) or (head == b"\xfe\x80\x00\x00" and not any(trailer)):
        return False
    return not (head == b"\xfe\x80\x00\x00" and not any(packed[4:8]))


def _gid_version(gid: dict) -> int:
    kind = str(gid.get("type") or "")
    return 2 if kind.startswith("RoCE v2") else 1 if "v1" in kind else -1


def nccl_roce_gid(gids: list) -> dict | None:
    """The GID NCCL takes on a RoCE port when NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE and
    NCCL_IB_ROCE_VERSION_NUM are left alone (IPv4, RoCE v2), by the rule NCCL's IB transport applies to the port's
    GID table: start at index 0, move to a candidate of the wanted family where the current one is of the other, and
    within the family to a valid candidate of the wanted version where the current one differs in version or is not
    valid. On a port whose only GIDs are link-local (an interface without an address) that leaves index 0."""
    table = {int(gid["index"]): gid for gid in gids or [] if str(gid.get("index", "")).isdigit()}
    if not table:
        return None
    current = table.get(0, {"index": 0, "gid": "::", "type": None})
    for index in sorted(number for number in table if number > 0):
        candidate = table[index]
        v4 = gid_ipv4(candidate.get("gid")) is not None
        if v4 != (gid_ipv4(current.get("gid")) is not None) and v4:
            current = candidate
            continue
        if not v4 or not _gid_valid(candidate.get("gid")):
            continue
        if ((_gid_version(current) != _gid_version(candidate) or not _gid_valid(current.get("gid")))
                and _gid_version(candidate) == 2):
            current = candidate
    return current


def _gid_said(gid: dict | None) -> str:
    if not gid:
        return "no GID"
    address = gid_ipv4(gid.get("gid"))
    what = address if address else ("link-local " if str(gid.get("gid")).startswith("fe80") else "") + str(gid.get("gid")).strip()
    return f"GID {gid.get('index')} ({what}, {gid.get('type')})"


def _roce_v2_problem(host: str, entry: dict, device: dict, interface: str, addresses=()) -> str:
    """Why NCCL would not reach the other nodes through this RoCE port, or ''. A port holding fabric addresses (the
    interface's, a rail's) must have NCCL take a RoCE v2 GID for one of them: a GID for another address, or none
    for it (the address on a bridge or macvlan over the port, not on the port's own interface, a VLAN or a bond),
    sends NCCL's traffic from an address the fabric does not route."""
    if entry["link_layer"] != "Ethernet":
        return ""
    gids = device["ports"][str(entry["port"])].get("gids") or []
    where = f"{host}: RDMA port {entry['device']}:{entry['port']} ({interface})"
    if not any(gid.get("type") == "RoCE v2" for gid in gids):
        seen = ", ".join(sorted({str(gid.get("type")) for gid in gids})) or "none"
        return (f"{where} has no RoCE v2 GID (GID types: {seen}), "
                f"so NCCL cannot reach the other nodes over routed RoCE; enable RoCE v2 on the adapter "
                f"(cma_roce_mode / mlxconfig) and give the interface its address again, or set fabric_transport: socket")
    if not addresses:
        return ""
    chosen = nccl_roce_gid(gids)
    if chosen and chosen.get("type") == "RoCE v2" and gid_ipv4(chosen.get("gid")) in addresses:
        return ""
    held = ", ".join(sorted({gid_ipv4(gid.get("gid")) for gid in gids if gid_ipv4(gid.get("gid"))})) or "none"
    return (f"{where} has no RoCE v2 GID NCCL would take for its fabric address {', '.join(addresses)}: NCCL would use "
            f"{_gid_said(chosen)} (the port's IPv4 GIDs: {held}); put the address on {interface} itself (or a VLAN or "
            f"bond on it, not a bridge or macvlan over it) and first among its addresses, check the table with "
            f"show_gids or rdma link, or set fabric_transport: socket")


def fabric_rdma(node_rdma: dict, interface: str, host: str = "this host", override=None, transport: str = "auto",
                network_facts=None, subnet=None) -> list:
    """The RDMA ports NCCL and UCX are to use, sorted by PCI address: the fabric interface's own, its twins, and on a
    multi-rail host every other compute port (rail).

    [{'device', 'port', 'pci', 'link_layer', 'rate', 'state', 'role'}] where role is 'interface' (the interface's own
    device), 'twin' (the other PCIe function of the same physical port, as on a DGX Spark, where each port is reached
    over two PCIe x4 links), 'rail' (another ACTIVE port of the interface port's link layer and rate, as the eight
    compute HCAs of a DGX H100; see _rails for the ports left out) or 'override'. Only ACTIVE ports; empty when the
    interface has no RDMA device (sockets). network_facts and subnet (the node's addresses and the fabric subnet)
    tell a rail from a port that serves another network. A RoCE port also says the GID NCCL takes on it
    ('gid_index', 'gid' said in words, 'gid_value', 'gid_type'; nccl_roce_gid), and the interface's and each rail's must be a RoCE v2 GID for its address.
    """
    if transport not in ("auto", "rdma", "socket"):
        raise AnsibleFilterError(f"{host}: fabric_transport is {transport!r}; use auto, rdma or socket")
    if transport == "socket":
        return []
    devices = (node_rdma or {}).get("devices") or {}
    netdevs = (node_rdma or {}).get("netdevs") or {}
    addresses: dict = {}
    for netdev, address in _interface_addresses(network_facts or {}):
        addresses.setdefault(netdev, []).append(address)
    try:
        fabric_net = ipaddress.ip_network(subnet, strict=False) if subnet else None
    except ValueError:
        fabric_net = None  # fabric_interface names a bad subnet
    chosen = []
    if override:
        for item in override:
            name, unused_sep, number = str(item).partition(":")
            device = devices.get(name)
            if device is None:
                raise AnsibleFilterError(
                    f"{host}: fabric_rdma_devices names {name}, which this node does not have "
                    f"(its RDMA devices: {', '.join(sorted(devices)) or 'none'}); correct fabric_rdma_devices")
            number = number or min(device.get("ports") or {"1": None}, key=int)
            if number not in (device.get("ports") or {}):
                raise AnsibleFilterError(
                    f"{host}: fabric_rdma_devices names port {number} of {name}, which has ports "
                    f"{', '.join(sorted(device.get('ports') or {})) or 'none'}; correct fabric_rdma_devices")
            entry = _entry(name, number, device, "override")
            if entry["state"] != "ACTIVE":
                raise AnsibleFilterError(
                    f"{host}: fabric_rdma_devices names {name}:{number}, whose port is {entry['state']}; "
                    f"check its cable and switch port, or name an ACTIVE port")
            chosen.append(entry)
    else:
        own = list((netdevs.get(interface) or {}).get("rdma_devices") or [])
        if not own:
            # A VLAN, bond or macvlan on top of an HCA's interface has no device of its own: the GIDs name it.
            own = sorted(name for name, device in devices.items()
                         if any(gid.get("netdev") == interface
                                for port in (device.get("ports") or {}).values() for gid in port.get("gids") or []))
        for name in own:
            device = devices.get(name)
            number = _port_of(device, interface, netdevs.get(interface) or {}) if device else None
            if number is None:
                continue
            entry = _entry(name, number, device, "interface")
            if entry["state"] != "ACTIVE":
                raise AnsibleFilterError(
                    f"{host}: the fabric interface {interface} sits on RDMA device {name} port {number}, which is "
                    f"{entry['state']} ({device['ports'][number].get('phys_state')}); check the cable and the switch "
                    f"port, or set fabric_transport: socket to run the collectives over TCP")
            chosen.append(entry)
        chosen += _rails(devices, netdevs, chosen, addresses, fabric_net)
        chosen += _twins(devices, chosen)
    if transport == "rdma" and not chosen:
        have = ", ".join(f"{name}: {', '.join((netdevs.get(name) or {}).get('rdma_devices') or [])}" for name in sorted(netdevs))
        raise AnsibleFilterError(
            f"{host}: fabric_transport is rdma but the fabric interface {interface} sits on no RDMA device "
            f"(interfaces with one: {have or 'none'}); put the fabric on an HCA's interface, name the ports in "
            f"fabric_rdma_devices, or set fabric_transport: auto")
    for entry in chosen:
        device = devices[entry["device"]]
        on = _port_netdevs(entry["device"], str(entry["port"]), device, netdevs) if entry["role"] != "override" else []
        held = [] if fabric_net is None else [
            address for netdev in on for address in addresses.get(netdev, [])
            if ipaddress.ip_address(address) in fabric_net]
        problem = _roce_v2_problem(host, entry, device, next((name for name in on if addresses.get(name)), interface),
                                   held if entry["role"] in ("interface", "rail") else ())
        if problem:
            raise AnsibleFilterError(problem)
        if entry["link_layer"] == "Ethernet":
            gid = nccl_roce_gid(device["ports"][str(entry["port"])].get("gids") or [])
            entry["gid_index"] = gid.get("index") if gid else None
            entry["gid"] = _gid_said(gid)
            # The GID itself, which the supervisor compares with the port's table while it serves.
            entry["gid_value"] = gid.get("gid") if gid else None
            entry["gid_type"] = gid.get("type") if gid else None
    return sorted(chosen, key=lambda item: (item["pci"] or "", item["device"], item["port"]))


def nccl_gids_said(ports, host: str = "this host") -> str:
    """One line saying which GID NCCL takes on each RoCE port (fabric_rdma's 'gid'), where a twin holds no address;
    '' elsewhere."""
    roce = [port for port in ports or [] if port.get("link_layer") == "Ethernet"]
    if not any(port.get("role") == "twin" for port in roce):
        return ""
    said = "; ".join("%s (%s) %s" % (port["device"], port["role"], port.get("gid") or "no GID read") for port in roce)
    return (f"{host}: NCCL takes {said}; a link-local GID reaches the other nodes only within one L2 segment (a direct "
            f"cable, one VLAN), never through a router")


def fabric_env(fabric: dict, head_address: str, rdma_ports=None, extra=None) -> dict:
    """Environment that pins Ray, vLLM and the collective libraries to the fabric.

    rdma_ports: the fabric_rdma list (or 'device:port' strings). With ports, NCCL and UCX use exactly those; without,
    NCCL is kept off every RDMA device (a storage HCA would otherwise be tried) and talks TCP on the interface.
    """
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
    ports = [item if isinstance(item, str) else f"{item['device']}:{item['port']}" for item in rdma_ports or []]
    if ports:
        # '=': NCCL takes the names exactly, not as prefixes (mlx5_1 would also match mlx5_10 and mlx5_11).
        env["NCCL_IB_HCA"] = "=" + ",".join(ports)
        env["UCX_NET_DEVICES"] = ",".join(ports)
    else:
        env["NCCL_IB_DISABLE"] = "1"
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


def fabric_problem(facts: dict, subnet: str, host: str = "this host", expected: str | None = None) -> str:
    """Why fabric_interface would refuse the host (a link down, no or several addresses on the subnet), or ''.

    A task asserts on it, so that the play stops with the sentence itself, not inside Ansible's report of a
    filter that failed."""
    try:
        fabric_interface(facts, subnet, host, expected)
    except AnsibleFilterError as exc:
        return str(exc.message if hasattr(exc, "message") else exc)
    return ""


def fabric_duplicates(addresses) -> list:
    """The addresses that more than one node holds, each once, in the order the nodes are listed.

    addresses: every node's fabric address, one per node, as the fabric role found them; the role stops the play
    before anything changes when this is not empty."""
    counts: dict = {}
    for address in addresses:
        counts[address] = counts.get(address, 0) + 1
    return [address for address, count in counts.items() if count > 1]


def fabric_mtu_problem(mtus) -> str:
    """Why the nodes' fabric MTUs cannot carry the collectives, or ''.

    mtus: [host, interface, mtu] per node, as the fabric role found them. Nodes whose fabric interfaces differ in MTU
    lose every frame larger than the smallest one (a NIC reset to 1500 beside nodes at 9000): RDMA and TCP stall or
    crawl instead of failing, so the play stops here, before anything changes."""
    known = []
    for host, iface, mtu in mtus or []:
        try:
            known.append((str(host), str(iface), int(mtu)))
        except (TypeError, ValueError):
            continue  # no MTU in the node's read ('None' where a template made it a string): not judged
    if len({mtu for unused_host, unused_iface, mtu in known}) < 2:
        return ""
    # The fix: the MTU most nodes have; between as many, the larger (a NIC reset to 1500 beside one at 9000).
    most = max({mtu for unused_host, unused_iface, mtu in known},
               key=lambda value: (sum(1 for item in known if item[2] == value), value))
    listed = ", ".join(f"{host} {iface} {mtu}" for host, iface, mtu in known)
    odd = [f"ip link set dev {iface} mtu {most} on {host}" for host, iface, mtu in known if mtu != most]
    return (f"the fabric interfaces differ in MTU ({listed}): frames larger than the smallest are lost between them; "
            f"give every node's fabric interface and the switch one MTU ({'; '.join(odd)}), and in the host's network "
            f"configuration so that a reboot keeps it")


class FilterModule:
    def filters(self):
        return {"fabric_interface": fabric_interface, "fabric_rdma": fabric_rdma, "fabric_env": fabric_env,
                "cidr_problem": cidr_problem, "fabric_problem": fabric_problem, "fabric_duplicates": fabric_duplicates,
                "fabric_mtu_problem": fabric_mtu_problem, "nccl_roce_gid": nccl_roce_gid,
                "nccl_gids_said": nccl_gids_said}
