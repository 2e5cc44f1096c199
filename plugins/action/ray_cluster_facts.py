# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpulab.vllm.ray_cluster_facts on the controller: a long wait says what it has seen so far (plugin_utils._progress)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpulab.vllm.plugins.plugin_utils._progress import run_in_slices


def _describe(args):
    wanted = []
    if args.get("expected_nodes"):
        wanted.append("%s node(s)" % args["expected_nodes"])
    if args.get("expected_gpus"):
        wanted.append("%s GPU(s)" % args["expected_gpus"])
    return "the Ray cluster (%s)" % (", ".join(wanted) or "readable")


def _progress(result):
    cluster = (result.get("ansible_facts") or {}).get("ray_cluster") or {}
    alive = [node for node in cluster.get("nodes") or [] if node.get("alive")]
    seen = "seen %d node(s) alive (%s), %s GPU(s)" % (
        len(alive), ", ".join(node.get("node_ip") or "?" for node in alive) or "none", cluster.get("gpus", 0))
    missing = cluster.get("missing_node_ips") or []
    if missing:
        seen += "; not yet: %s" % ", ".join(missing)
    return seen


def _carry(result):
    # Since when each node's raylet has been silent to the head: the next slice goes on counting from there.
    cluster = (result.get("ansible_facts") or {}).get("ray_cluster") or {}
    return {"silent": dict((raylet["node_id"], raylet["silent_since"]) for raylet in cluster.get("unreachable_raylets") or []
                           if raylet.get("silent_since") is not None)}


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(run_in_slices(self, task_vars or {}, 300, _describe, _progress, carry=_carry))
        return result
