# Copyright: gpulab.vllm contributors
# Apache License 2.0
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
