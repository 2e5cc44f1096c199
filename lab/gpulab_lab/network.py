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


HARDENED = "gpulab lab: hardened host"


def _in_node(name: str, cmd: list[str], check: bool = True):
    return run(["nsenter", f"--net={netns_path(name)}", "--", *cmd], check=check)


def set_input_policy(cfg: LabConfig, name: str, state: str) -> None:
    """Harden a node as a security-minded site does (INPUT policy DROP; loopback, replies and SSH admitted),
    or open it again. Nothing else is admitted: whatever the roles need they must open themselves."""
    if name not in cfg.node_names:
        raise LabError(f"no lab node named {name!r}; the lab has {cfg.node_names}")
    listing = _in_node(name, ["iptables", "-w", "-S", "INPUT"]).stdout.splitlines()
    for rule in listing:
        if HARDENED in rule:
            _in_node(name, ["sh", "-c", "iptables -w " + rule.replace("-A INPUT", "-D INPUT", 1)])
    if state == "drop":
        for spec in (["-i", "lo"], ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"], ["-p", "tcp", "--dport", "22"]):
            _in_node(name, ["iptables", "-w", "-A", "INPUT", *spec, "-m", "comment", "--comment", HARDENED, "-j", "ACCEPT"])
    _in_node(name, ["iptables", "-w", "-P", "INPUT", "DROP" if state == "drop" else "ACCEPT"])


def set_fabric_rate(cfg: LabConfig, name: str, rate: str) -> None:
    """Throttle what a node sends on its fabric link to rate (a tc rate: 100mbit), or lift it (off)."""
    if name not in cfg.node_names:
        raise LabError(f"no lab node named {name!r}; the lab has {cfg.node_names}")
    iface = cfg.node_fabric_if(cfg.node_names.index(name) + 1)
    if rate == "off":
        _in_node(name, ["tc", "qdisc", "del", "dev", iface, "root"], check=False)
        return
    _in_node(name, ["tc", "qdisc", "replace", "dev", iface, "root", "tbf", "rate", rate, "burst", "256kbit",
                    "latency", "50ms"])


def present_sysfs(cfg: LabConfig, name: str, fixture: str) -> None:
    """Show a node, over SSH, a recorded sysfs tree (tests/unit/fixtures/sysfs) in place of its /sys/class: its RDMA
    devices and the interfaces on them, and every entry of the node's own /sys/class beside them. "off" removes it.
    While any node is presented one, the machine has /dev/infiniband (one verbs device node)."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from . import sysfs  # noqa: PLC0415
    from .common import RUN, node_dirs, pid_alive  # noqa: PLC0415

    if name not in cfg.node_names:
        raise LabError(f"no lab node named {name!r}; the lab has {cfg.node_names}")
    run_dir = node_dirs(name)["run"]
    pid = pid_alive(run_dir / "sshd.pid")
    if pid is None:
        raise LabError(f"the sshd of {name} is not running; bring the lab up first")
    in_ns = ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--"]
    while run([*in_ns, "mountpoint", "-q", "/sys/class"], check=False).returncode == 0 and \
            run([*in_ns, "findmnt", "-n", "-o", "SOURCE", "/sys/class"], check=False).stdout.strip() != "sysfs":
        run([*in_ns, "umount", "/sys/class"])
    for folder in (sysfs.TREE, sysfs.OVERLAY):
        shutil.rmtree(run_dir / folder, ignore_errors=True)
    marker = RUN / "dev-infiniband.made"
    if fixture == "off":
        others = [node for node in cfg.node_names if node != name and (node_dirs(node)["run"] / sysfs.TREE).exists()]
        if not others and marker.exists():
            shutil.rmtree(sysfs.DEV_INFINIBAND, ignore_errors=True)
            marker.unlink()
        return
    # The node's own IPv4 addresses as GIDs of the ports of its interfaces, as its kernel would list them.
    import json  # noqa: PLC0415

    links = json.loads(_in_node(name, ["ip", "-j", "-4", "address", "show"]).stdout or "[]")
    addresses = {link["ifname"]: [entry["local"] for entry in link.get("addr_info") or [] if entry.get("local")]
                 for link in links if link.get("ifname")}
    try:
        sysfs.materialize(sysfs.with_addresses(sysfs.load(sysfs.fixture_path(fixture)), addresses), run_dir / sysfs.TREE)
    except FileNotFoundError as exc:
        raise LabError(str(exc)) from exc
    lab_dir = str(Path(__file__).resolve().parents[1])
    run([*in_ns, sys.executable, "-c",
         "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); from gpulab_lab.sysfs import class_overlay; "
         "class_overlay('/run/' + sys.argv[2], Path('/sys/class'), Path('/run/' + sys.argv[3]))",
         lab_dir, sysfs.TREE, sysfs.OVERLAY])
    run([*in_ns, "mount", "--bind", f"/run/{sysfs.OVERLAY}", "/sys/class"])
    if not sysfs.DEV_INFINIBAND.exists():
        sysfs.DEV_INFINIBAND.mkdir()
        os.mknod(sysfs.DEV_INFINIBAND / "uverbs0", 0o20666, os.makedev(*sysfs.UVERBS0))
        marker.write_text("made by the lab\n")
