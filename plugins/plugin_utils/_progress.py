# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Long waits that say what they wait for, on the controller, while they wait.

A module cannot print while it runs: a wait of ten minutes inside one module call is ten silent minutes. The
collection's action plugins for its waiting modules run the module in slices of ``progress_interval`` seconds
within ``wait_timeout`` instead, and print one line per node between slices: what the wait is for, how long it has
waited, and what it has seen so far. Each slice carries what the earlier ones spent (``wait_resume``), so the last
result and its message count the whole wait. A slice that ends before its time is final (the module saw a
permanent error, or a server that exited): no further slice is run.
"""

from __future__ import annotations

import math
import time

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display

display = Display()


def _number(value, default):
    try:
        return float(value)
    except (TypeError, ValueError):
        return float(default)


def run_in_slices(action, task_vars, default_timeout, describe, progress, advance=None, stalled=None, carry=None,
                  stall_limit=None):
    """The module's result, waited for in slices with a progress line between them.

    describe(args): what the wait is for; progress(result): what the last slice saw (one line). advance(result),
    when given, is what must change for the wait to count as advancing; with a stall limit above 0, a wait whose
    advance() has not changed for that long ends failed, with stalled(result, seconds) as its message. The limit is
    args' stall_timeout, or stall_limit(result, args) when given (a limit that depends on what the wait has seen).
    carry(result), when given, is what the next slice must know of the last one (a dict, added to wait_resume)."""
    args = dict(action._task.args)
    module = action._task.resolved_action or action._task.action
    interval = _number(args.get("progress_interval", 30), 30)
    if not boolean(args.get("wait", False), strict=False) or interval <= 0:
        return action._execute_module(module_name=module, module_args=args, task_vars=task_vars)
    timeout = _number(args.get("wait_timeout"), default_timeout)
    host = task_vars.get("inventory_hostname", "?")
    stall = _number(args.get("stall_timeout", 0), 0) if advance is not None else 0
    started = time.monotonic()
    polls = 0
    seen, since = None, started
    carried = {}
    while True:
        remaining = timeout - (time.monotonic() - started)
        share = max(1, int(math.ceil(min(interval, remaining))))
        resume = dict(carried, elapsed=round(time.monotonic() - started, 3), polls=polls)
        args.update(wait_timeout=share, wait_resume=resume)
        called = time.monotonic()
        result = action._execute_module(module_name=module, module_args=args, task_vars=task_vars)
        took = time.monotonic() - called
        polls = _polls(result, polls)
        carried = carry(result) if carry is not None else {}
        waited = time.monotonic() - started
        if not result.get("failed") or took < 0.9 * share or waited >= timeout - 0.5:
            return result
        limit = stall_limit(result, args) if stall_limit is not None and advance is not None else stall
        if limit > 0:
            now_seen = advance(result)
            if now_seen != seen:
                seen, since = now_seen, time.monotonic()
            elif time.monotonic() - since >= limit:
                result["msg"] = stalled(result, time.monotonic() - since)
                result["stalled"] = True
                # The module's own failure travels with the result (ansible-core 2.19 and later build the error line
                # from it): without it, the error is built from this message.
                result.pop("exception", None)
                return result
        # On stderr, as progress goes: a machine-readable stdout (the json callback) stays one document.
        display.display("  [%s] waiting for %s: %.0f s of %.0f s; %s" % (host, describe(args), waited, timeout, progress(result)),
                        stderr=True)


def _polls(result, before):
    waited = result.get("waited") or ((result.get("ansible_facts") or {}).get("ray_cluster") or {}).get("wait") or {}
    try:
        return int(waited.get("polls", before))
    except (TypeError, ValueError):
        return before
