# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpulab.vllm.vllm_health on the controller: a long wait reports what the server is doing (plugin_utils._progress)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpulab.vllm.plugins.plugin_utils._progress import run_in_slices


def _describe(args):
    return "vLLM at %s to answer a completion" % args.get("base_url")


def _load(result):
    load = result.get("load") or {}
    if not load:
        return None
    return load["stage"] + (" (%s)" % load["detail"] if load.get("stage") == "weights" and load.get("detail") else "")


def _progress(result):
    stage = result.get("failed_stage") or "?"
    said = str(result.get("msg") or "").split(": stage %s: " % stage, 1)[-1]
    line = ("loading: %s; " % _load(result) if _load(result) else "") + "not answering yet (%s: %s)" % (stage, said[:160])
    if result.get("last_log_line"):
        line += "; the server's last line: %s" % result["last_log_line"]
    return line


def _advance(result):
    """What changes while a start advances: its stage and shard count, the server's last line, the probe's stage."""
    load = result.get("load") or {}
    return (load.get("stage"), load.get("shards_done"), result.get("last_log_line"), result.get("failed_stage"))


def _stalled(result, seconds, container):
    load = result.get("load") or {}
    return ("vLLM's start stalled at stage %s: nothing new from the server for %.0f s (stall_timeout); its last line: %s; "
            "read `docker logs %s` on the head, or raise the stall timeout if this stage is this slow for this model"
            % (_load(result) or load.get("stage") or result.get("failed_stage"), seconds,
               result.get("last_log_line") or "none", container))


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        container = self._task.args.get("container")
        result.update(run_in_slices(self, task_vars or {}, 900, _describe, _progress, _advance,
                                    lambda found, seconds: _stalled(found, seconds, container)))
        return result
