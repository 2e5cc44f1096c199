# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory rule of unified-memory nodes (a DGX Spark's GB10): what the server will take there, against what the
node has available, decided before Ray and vLLM start.

On a GB10 the GPU's memory is the host's: vLLM's --gpu-memory-utilization is a share of the host's MemTotal (CUDA's
total on GB10 is MemTotal), and everything else on the node (Ray, the API server, the OS, the page cache) must fit
beside it. A node whose GPU has memory of its own is not this rule's business.
"""

from __future__ import annotations

import math

GIB = 1024 ** 3
# vLLM's own default when --gpu-memory-utilization is not given.
VLLM_DEFAULT_UTILIZATION = 0.9
# Estimates, not recordings of our own (docs/hardware.md, section 3, says what only hardware can prove):
# - on every node, outside vLLM's share: the container, the CUDA context and Ray's raylet and worker processes. On
#   GB10 vLLM's own free-memory reading ran 2.6 to 2.7 GiB under MemAvailable once its container and CUDA context
#   existed (llamastash/llamastash pull request 81, vLLM 0.28); rounded up for the raylet.
NODE_OVERHEAD_GIB = 3.0
# - on the head besides: the API server process, the engine core and Ray's GCS and dashboard.
HEAD_OVERHEAD_GIB = 4.0
# - kept free for the OS, sshd, Docker and the page cache the node needs to stay reachable while vLLM loads.
MARGIN_GIB = 4.0
# The containers whose memory the rule would count twice: the deployment already runs on the node.
_DEPLOYED_ROLES = ("ray-head", "ray-worker", "vllm-server")


def _gib(value):
    return "%.1f GiB" % (value / GIB)


def _not_given(utilization) -> bool:
    """No --gpu-memory-utilization: null, or null as a template renders it."""
    return utilization is None or str(utilization).strip().lower() in ("", "none", "null")


def deployed_here(node: dict) -> bool:
    """Whether the node's Ray container or the server already runs: its memory is in use by them, not free."""
    return any(container.get("running") and container.get("role") in _DEPLOYED_ROLES
               for container in ((node or {}).get("containers") or {}).values())


def memory_budget(node: dict, utilization=None, head: bool = False) -> dict:
    """What the server and the deployment's other processes will take on a node, against MemAvailable.

    `applies` is false (and nothing else is computed) where the node read has no memory figures, the GPU's memory
    is not the host's, or the deployment already runs there. Else, in bytes: `server` (utilization x MemTotal),
    `overhead` (every node's, and the head's), `margin`, `needed` (their sum), `available` (MemAvailable), `total`,
    and `max_utilization`, the largest utilization (two decimals, rounded down) that fits, or 0.0 when none does."""
    memory = (node or {}).get("memory") or {}
    if not memory.get("unified") or not memory.get("total") or memory.get("available") is None or deployed_here(node):
        return {"applies": False}
    share = VLLM_DEFAULT_UTILIZATION if _not_given(utilization) else float(utilization)
    total, available = memory["total"], memory["available"]
    overhead = (NODE_OVERHEAD_GIB + (HEAD_OVERHEAD_GIB if head else 0.0)) * GIB
    margin = MARGIN_GIB * GIB
    server = share * total
    fits = math.floor((available - overhead - margin) / total * 100 + 1e-9) / 100
    return {"applies": True, "utilization": share, "server": server, "overhead": overhead, "margin": margin,
            "needed": server + overhead + margin, "available": available, "total": total,
            "max_utilization": max(fits, 0.0)}


def memory_problem(node: dict, host: str, utilization=None, head: bool = False,
                   setting: str = "vllm_server_gpu_memory_utilization") -> str:
    """Empty when the server fits the node's available memory (or the rule does not apply, see memory_budget);
    else one line: the node, what the server and the rest would take, what is available, and the fix."""
    budget = memory_budget(node, utilization, head)
    if not budget["applies"] or budget["needed"] <= budget["available"]:
        return ""
    given = " (vLLM's default)" if _not_given(utilization) else ""
    others = "the head's Ray, API server and engine core" if head else "Ray and the CUDA context"
    found = "%s available (MemAvailable)" % _gib(budget["available"])
    if budget["max_utilization"] > 0:
        fix = "lower %s to %.2f or less" % (setting, budget["max_utilization"])
    else:
        fix = "%s cannot fit here at any value" % setting
    return (f"{host}: unified memory (the GPU's memory is the host's): the server would take {_gib(budget['server'])} "
            f"({budget['utilization']:.2f}{given} x {_gib(budget['total'])}), {others} about {_gib(budget['overhead'])}, "
            f"with a {_gib(budget['margin'])} margin {_gib(budget['needed'])} in all, but the node has {found}; "
            f"{fix}, or free memory on the node (stop other programs and containers there, log out of its desktop)")


class FilterModule:
    def filters(self):
        return {"memory_budget": memory_budget, "memory_problem": memory_problem, "memory_deployed_here": deployed_here}
