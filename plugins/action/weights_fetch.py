# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpulab.vllm.weights_fetch on the controller: a copy of many gigabytes says how far it is while it runs.

The module copies for progress_interval seconds and returns what is left; this plugin calls it again until every
file is in place, printing per node the bytes done, the rate and the time left (on stderr, as progress goes). The
partial copies on the node carry the copy from one call to the next, as they carry it across a cut-off run.
"""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights

display = Display()


def progress_line(host, source, done, total, rate, waited):
    """'[node2] copying the model from node1: 1.2 GB of 119.0 GB (1 %), 1.1 GB/s, about 1 min 47 s left'."""
    share = 100.0 * done / total if total else 100.0
    eta = "about %s left" % _weights.human_seconds((total - done) / rate) if rate > 0 else "rate not known yet"
    return "  [%s] copying the model from %s: %s of %s (%.0f %%), %s/s, %s; %s so far" % (
        host, source, _weights.human_bytes(done), _weights.human_bytes(total), share, _weights.human_bytes(rate), eta,
        _weights.human_seconds(waited))


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        module = self._task.resolved_action or self._task.action
        interval = float(args.get("progress_interval", 30) or 0)
        timeout = float(args.get("timeout", 0) or 0)
        host = (task_vars or {}).get("inventory_hostname", "?")
        args["slice"] = interval if interval > 0 else 0
        started = time.monotonic()
        received = 0
        resumed = None
        copied = []
        total = sum(int((entry or {}).get("size", 0)) for entry in (args.get("files") or {}).values())
        while True:
            if timeout > 0 and interval > 0:
                args["slice"] = max(1.0, min(interval, timeout - (time.monotonic() - started)))
            answer = self._execute_module(module_name=module, module_args=args, task_vars=task_vars)
            received += int(answer.get("received_bytes") or 0)
            # What the first call continued was left by an earlier run; later calls continue this run's own slices.
            resumed = int(answer.get("resumed_bytes") or 0) if resumed is None else resumed
            copied.extend(answer.get("copied") or [])
            waited = time.monotonic() - started
            if answer.get("failed") or answer.get("done") or self._play_context.check_mode or interval <= 0:
                break
            if timeout > 0 and waited >= timeout:
                answer["failed"] = True
                answer["msg"] = ("copying the model into %s from %s did not finish within %.0f s: %s of %s left; "
                                 "raise the copy timeout, or look at the fabric's rate between the two") % (
                    args.get("dest"), args.get("source_name", "the source"), timeout,
                    _weights.human_bytes(answer.get("left_bytes") or 0), _weights.human_bytes(total))
                break
            done = total - int(answer.get("left_bytes") or 0)
            display.display(progress_line(host, args.get("source_name", "the source"), done, total, received / waited if waited else 0,
                                          waited), stderr=True)
            # Only the files still to copy go into the next call.
            left = set(answer.get("left") or [])
            args["files"] = {rel: entry for rel, entry in args["files"].items() if rel in left}
        answer["copied"] = sorted(set(copied))
        answer["changed"] = bool(copied)
        answer["received_bytes"] = received
        answer["resumed_bytes"] = resumed or 0
        answer["total_bytes"] = total
        answer["seconds"] = round(time.monotonic() - started, 3)
        answer["rate_bytes_per_s"] = round(received / answer["seconds"]) if answer["seconds"] > 0 else 0
        result.update(answer)
        return result
