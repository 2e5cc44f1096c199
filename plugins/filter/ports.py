# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's port plan checked before anything listens or any firewall rule is written."""

from __future__ import annotations


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def port_problems(ports: dict, ranges: dict | None = None, reserved: dict | None = None) -> list:
    """Every way the plan is wrong, one sentence each; empty when it is sound.

    ports: {variable: port} the deployment will listen on; ranges: {'min_var..max_var': [low, high]} (inclusive);
    reserved: {what: port} that must stay out of all of them (SSH: a firewall rule over it cuts the operator off).
    """
    problems = []
    named = {}
    for name, value in sorted((ports or {}).items()):
        port = _int(value)
        if port is None or not 1 <= port <= 65535:
            problems.append(f"{name}={value} is outside 1..65535")
        else:
            named[name] = port
    spans = {}
    for name, (low, high) in sorted((ranges or {}).items()):
        low_i, high_i = _int(low), _int(high)
        low_name, unused, high_name = name.partition("..")
        if low_i is None or not 1 <= low_i <= 65535:
            problems.append(f"{low_name}={low} is outside 1..65535")
        elif high_i is None or not 1 <= high_i <= 65535:
            problems.append(f"{high_name}={high} is outside 1..65535")
        elif low_i >= high_i:
            problems.append(f"{low_name}={low} must be below {high_name}={high}")
        else:
            spans[name] = (low_i, high_i)
    seen = {}
    for name, port in sorted(named.items(), key=lambda item: (item[1], item[0])):
        if port in seen:
            problems.append(f"{name}={port} is also {seen[port]}")
        else:
            seen[port] = name
        for span, (low, high) in sorted(spans.items()):
            if low <= port <= high:
                problems.append(f"{name}={port} lies inside {span} ({low}..{high})")
    for what, value in sorted((reserved or {}).items()):
        port = _int(value)
        if port is None:
            continue
        if port in seen:
            problems.append(f"{seen[port]}={port} is {what}")
        for span, (low, high) in sorted(spans.items()):
            if low <= port <= high:
                problems.append(f"{what} {port} lies inside {span} ({low}..{high}), which the firewall rules cover")
    return problems


class FilterModule:
    def filters(self):
        return {"port_problems": port_problems}
