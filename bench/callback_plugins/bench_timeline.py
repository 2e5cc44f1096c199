# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a timeline of a playbook run (task starts, per-host results, recap) as JSON lines.

Used by bench/run.py only. Enabled with ANSIBLE_CALLBACKS_ENABLED=bench_timeline and
ANSIBLE_CALLBACK_PLUGINS=bench/callback_plugins; the file is named by BENCH_TIMELINE.
Times are wall-clock seconds (time.time()), comparable with Ray's own node start times.
Results are never written whole: only status, changed, the gate's wait record and a model copy's own
figures (bytes received, seconds), so no secret a task handles can reach the file.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: bench_timeline
type: aggregate
short_description: JSON-lines timeline of tasks and results, for the benchmarks
description:
  - Writes one JSON object per event to the file named by the environment variable BENCH_TIMELINE.
requirements:
  - enable in configuration
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_timeline"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        path = os.environ.get("BENCH_TIMELINE")
        self._out = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - closed at stats

    def _emit(self, event, **fields):
        if self._out is None:
            return
        fields["event"] = event
        fields["t"] = time.time()
        self._out.write(json.dumps(fields, sort_keys=True, default=str) + "\n")
        self._out.flush()

    @staticmethod
    def _task_fields(task):
        role = getattr(task, "_role", None)
        return {"task": task.get_name(), "uuid": task._uuid, "action": task.action, "role": role.get_name() if role else None}

    def v2_playbook_on_start(self, playbook):
        self._emit("playbook_start", playbook=os.path.basename(playbook._file_name))

    def v2_playbook_on_play_start(self, play):
        self._emit("play_start", play=play.get_name())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._emit("task_start", **self._task_fields(task))

    def v2_playbook_on_handler_task_start(self, task):
        self._emit("task_start", handler=True, **self._task_fields(task))

    def v2_runner_on_start(self, host, task):
        self._emit("host_start", host=host.get_name(), uuid=task._uuid)

    def _result(self, status, result):
        data = result.result
        facts = data.get("ansible_facts") or {}
        wait = (facts.get("ray_cluster") or {}).get("wait")
        copy = None
        if result.task.action == "gpulab.vllm.weights_fetch" and "received_bytes" in data:
            copy = {"received_bytes": data.get("received_bytes"), "seconds": data.get("seconds")}
        self._emit("host_result", status=status, host=result.host.get_name(), uuid=result.task._uuid,
                   changed=bool(data.get("changed")), ray_wait=wait, copy=copy)

    def v2_runner_on_ok(self, result):
        self._result("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result("ignored" if ignore_errors else "failed", result)

    def v2_runner_on_skipped(self, result):
        self._result("skipped", result)

    def v2_runner_on_unreachable(self, result):
        self._result("unreachable", result)

    def v2_playbook_on_stats(self, stats):
        hosts = {host: stats.summarize(host) for host in sorted(stats.processed)}
        self._emit("stats", hosts=hosts)
        if self._out is not None:
            self._out.close()
            self._out = None
