# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpulab.vllm.vllm_health on the controller: a long wait reports what the server is doing (plugin_utils._progress)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpulab.vllm.plugins.module_utils import _vllm_probe
from ansible_collections.gpulab.vllm.plugins.plugin_utils._progress import run_in_slices


def _describe(args):
    return "vLLM at %s to answer a completion" % args.get("base_url")


def _load(result):
    return _vllm_probe.load_words(result.get("load") or {})


def _progress(result):
    stage = result.get("failed_stage") or "?"
    said = str(result.get("msg") or "").split(": stage %s: " % stage, 1)[-1]
    line = ("loading: %s; " % _load(result) if _load(result) else "") + "not answering yet (%s: %s)" % (stage, said[:160])
    if result.get("last_log_line"):
        line += "; the server's last line: %s" % result["last_log_line"]
    return line


def _advance(result):
    """What changes while a start advances: its stage, shard count and compile step, the server's last line, the
    probe's stage."""
    load = result.get("load") or {}
    return (load.get("stage"), load.get("shards_done"), load.get("detail"), result.get("last_log_line"),
            result.get("failed_stage"))


def _limit(result, args):
    """The stall limit that judges the start now (module_utils._vllm_probe.stall_limit)."""
    return _vllm_probe.stall_limit((result.get("load") or {}).get("stage"), bool(result.get("first_start")),
                                   args.get("stall_timeout"), args.get("first_start_stall_timeout"))


# Each limit, as the message names it: the module option and the role variable that sets it.
_LIMIT_NAMES = {"stall_timeout": "stall_timeout, vllm_server_stall_timeout in the vllm_server role",
                "first_start_stall_timeout": "first_start_stall_timeout, vllm_server_first_start_stall_timeout in the "
                                             "vllm_server role"}


def _stalled(result, seconds, container, args):
    load = result.get("load") or {}
    limit = _limit(result, args)
    if limit["option"] == "first_start_stall_timeout":
        why = ("the first start's limit while vLLM compiles: image %s has not answered a completion on this node before"
               % result.get("image_id"))
    elif load.get("stage") in _vllm_probe.COMPILE_STAGES and result.get("first_start") is False:
        why = ("the limit of every stage: image %s has answered a completion on this node before, so its compile phases "
               "get no longer" % result.get("image_id"))
    else:
        why = "the limit of every stage"
    return ("vLLM's start stalled at stage %s: nothing new from the server for %.0f s (%s); its last line: %s; "
            "the limit was %.0f s, %s; read `docker logs %s` on the head, or raise %s if this stage is this slow for "
            "this model"
            % (_load(result) or load.get("stage") or result.get("failed_stage"), seconds, limit["option"],
               result.get("last_log_line") or "none", limit["seconds"], why, container, _LIMIT_NAMES[limit["option"]]))


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        container = self._task.args.get("container")
        args = self._task.args
        result.update(run_in_slices(self, task_vars or {}, 900, _describe, _progress, _advance,
                                    lambda found, seconds: _stalled(found, seconds, container, args),
                                    stall_limit=lambda found, given: _limit(found, given)["seconds"]))
        return result
