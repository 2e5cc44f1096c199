# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jinja tests about addresses and networks."""

from __future__ import annotations

import ipaddress


def in_network(address, network) -> bool:
    """True when address (an IP) lies inside network (CIDR); false for anything malformed."""
    try:
        return ipaddress.ip_address(str(address)) in ipaddress.ip_network(str(network), strict=False)
    except ValueError:
        return False


class TestModule:
    def tests(self):
        return {"in_network": in_network}
