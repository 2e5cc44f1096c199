# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory rule of unified-memory nodes (a DGX Spark's GB10): what the server will take there, against what the
node has available, decided before Ray and vLLM start.

On a GB10 the GPU's memory is the host's: vLLM's --gpu-memory-utilization is a share of the host's MemTotal (CUDA's
total on GB10 is MemTotal), and everything else on the node (Ray, the API server, the OS, the page cache) must fit
beside it. A node whose GPU has memory of its own is not this rule's business.
"""

from __future__ import annotations

import json
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


def memory_guard_nodes(hosts, reads, ray_containers, head: str, server_container: str = "gpulab-vllm") -> list:
    """The nodes whose memory the guard watches while the model loads, and what it kills on each to end the load.

    hosts, reads (each node's read, gpulab_node) and ray_containers (each node's Ray container) side by side: every
    node whose read says unified memory, as {'host', 'containers'}; the head's server first on the head."""
    out = []
    for host, read, ray in zip(hosts or [], reads or [], ray_containers or []):
        if not ((read or {}).get("memory") or {}).get("unified"):
            continue
        containers = ([server_container] if host == head else []) + ([ray] if ray else [])
        out.append({"host": host, "containers": containers})
    return out


def _verdict(output):
    """The guard's verdict from what its finish printed (a JSON line), or {} when there is none."""
    if isinstance(output, dict):
        return output
    for line in reversed(str(output or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return {}
    return {}


def memory_guard_said(hosts, outputs) -> dict:
    """What each node's memory guard saw while the model loaded (roles/vllm_server/files/gpulab_memory_guard.py).

    hosts and outputs side by side (outputs: what `finish` printed on each). 'stopped': one line for each node where
    the guard ended the load, naming memory, both figures and the fix; 'seen': one line for each node it watched."""
    stopped, seen = [], []
    for host, output in zip(hosts or [], outputs or []):
        verdict = _verdict(output)
        if not verdict or verdict.get("missing"):
            continue
        dropped = verdict.get("dropped") or {}
        drop_said = ""
        if dropped:
            drop_said = ", the page cache dropped once at %s (%s after)" % (
                _gib(dropped.get("before_bytes") or 0), _gib(dropped.get("after_bytes") or 0))
            if dropped.get("error"):
                drop_said = ", dropping the page cache failed (%s)" % dropped["error"]
        stop = verdict.get("stopped") or {}
        if stop:
            stopped.append(
                f"{host}: the memory guard stopped the load at {_gib(stop.get('available_bytes') or 0)} available "
                f"(MemAvailable), under its floor of {_gib(verdict.get('stop_bytes') or 0)} (vllm_server_memory_stop_gib)"
                f"{drop_said}, killing {', '.join(stop.get('containers') or []) or 'nothing it could find'}: the model's "
                f"ranks would have taken more than the node has, and the kernel's OOM killer or a reboot was next; lower "
                f"vllm_server_gpu_memory_utilization (qwen35_gpu_memory_utilization for deploy_qwen35) or "
                f"--max-model-len, or free memory on the node")
        elif not verdict.get("armed"):
            seen.append(f"{host}: no rank of the model ran while the memory guard watched")
        else:
            lowest = verdict.get("lowest_bytes")
            seen.append(f"{host}: memory held while the model loaded: at least "
                        f"{_gib(lowest) if lowest is not None else 'an unknown amount'} available (floors: "
                        f"{_gib(verdict.get('drop_bytes') or 0)} to drop the page cache, "
                        f"{_gib(verdict.get('stop_bytes') or 0)} to stop){drop_said}")
    return {"stopped": stopped, "seen": seen}


class FilterModule:
    def filters(self):
        return {"memory_budget": memory_budget, "memory_problem": memory_problem, "memory_deployed_here": deployed_here,
                "memory_guard_said": memory_guard_said, "memory_guard_nodes": memory_guard_nodes}
