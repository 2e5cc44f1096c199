"""Record what iptables and ip6tables print for the fabric role's firewall, in a scratch network namespace.

Writes tests/unit/fixtures/firewall/*.json: the chain and the jump as `iptables -S` prints them after the role's
restore input, then after an operator's `-I INPUT 1 -i eth0 -j ACCEPT` (drift), then after the restore again.
Run as root: python3 tests/fixtures_record_firewall.py
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "collections"))

from ansible_collections.gpulab.vllm.plugins.filter.firewall import firewall_restore, firewall_rules  # noqa: E402
from ansible_collections.gpulab.vllm.plugins.module_utils._node import split_iptables_listing  # noqa: E402

NS = "gpulab-fwrecord"
FABRIC = {"interface": "enp1s0f0np0", "network": "10.220.0.0/24"}
OPENINGS = [{"name": "vllm clients", "port": 8000, "sources": ["10.210.0.1/32", "fd00:210::1/128"]},
            {"name": "node exporter", "port": 9100, "sources": ["0.0.0.0/0"]}]


def ns(*cmd: str, stdin: str | None = None) -> str:
    return subprocess.run(["ip", "netns", "exec", NS, *cmd], input=stdin, capture_output=True, text=True,
                          check=True).stdout


def main() -> None:
    out = ROOT / "tests" / "unit" / "fixtures" / "firewall"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        for family, tool in ((4, "iptables"), (6, "ip6tables")):
            wanted = firewall_rules(family, FABRIC, 22, OPENINGS)
            chains = ["INPUT", "GPULAB-INPUT"]
            steps = {}
            ns(f"{tool}-restore", "--noflush", stdin=firewall_restore(wanted, split_iptables_listing(ns(tool, "-S"), chains)))
            steps["applied"] = ns(tool, "-S")
            ns(tool, "-I", "INPUT", "1", "-i", "eth0", "-j", "ACCEPT")
            steps["drifted"] = ns(tool, "-S")
            ns(f"{tool}-restore", "--noflush", stdin=firewall_restore(wanted, split_iptables_listing(steps["drifted"], chains)))
            steps["repaired"] = ns(tool, "-S")
            version = subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout.strip()
            (out / f"ipv{family}.json").write_text(json.dumps({
                "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "tool": version, "fabric": FABRIC, "ssh_port": 22, "openings": OPENINGS, "listings": steps,
            }, indent=1, sort_keys=True) + "\n")
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


if __name__ == "__main__":
    main()
