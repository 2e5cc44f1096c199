"""Record the RDMA part of this host's sysfs as a fixture for tests/unit/fixtures/sysfs/.

Run on a real host (a DGX Spark, an H100 node, ...): python3 tests/fixtures_record_sysfs.py NAME "what the host is"
and commit tests/unit/fixtures/sysfs/NAME.json with the interface that carries the fabric address and the ports
NCCL should use ("expected"), checked against ibdev2netdev and the host's NCCL logs. Only the attributes the roles
read are kept (no MAC addresses).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

from gpulab_lab.sysfs import record  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: fixtures_record_sysfs.py NAME DESCRIPTION [OUT_DIR]")
    name, host = sys.argv[1], sys.argv[2]
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).resolve().parent / "unit" / "fixtures" / "sysfs"
    try:
        addresses = json.loads(subprocess.run(["ip", "-j", "-4", "address", "show"], capture_output=True, text=True,
                                              check=True).stdout or "[]")
    except (OSError, subprocess.CalledProcessError):
        addresses = []  # no iproute2 here: the fixture says which interface carries the fabric by hand
    tree = record()
    backed = {rel.split("/")[-1] for rel in tree if rel.startswith("class/net/")}
    doc = {
        "source": "recorded with tests/fixtures_record_sysfs.py",
        "host": host,
        "tree": tree,
        "ip_addresses": {link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
                         for link in addresses if link.get("ifname") in backed},
        "expected": {},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(out / f"{name}.json")


if __name__ == "__main__":
    main()
