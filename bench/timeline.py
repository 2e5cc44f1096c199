# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the JSON-lines timeline that callback_plugins/bench_timeline.py writes for one playbook run."""

from __future__ import annotations

import json


def parse(lines: list[str]) -> dict:
    """Tasks in run order with their wall time, per-host results, the recap and the changed count.

    A task's wall time runs from its start to the next task's start (or the recap): with the
    linear strategy that is the time every host spent on it plus Ansible's own overhead.
    """
    events = [json.loads(line) for line in lines if line.strip()]
    tasks, by_uuid, stats, first, last = [], {}, {}, None, None
    for event in events:
        first = event["t"] if first is None else first
        last = event["t"]
        kind = event["event"]
        if kind == "task_start":
            if tasks and tasks[-1]["end"] is None:
                tasks[-1]["end"] = event["t"]
            task = {"task": event["task"], "role": event.get("role"), "action": event.get("action"), "uuid": event["uuid"],
                    "start": event["t"], "end": None, "hosts": {}}
            tasks.append(task)
            by_uuid[event["uuid"]] = task
        elif kind in ("host_start", "host_result") and event.get("uuid") in by_uuid:
            host = by_uuid[event["uuid"]]["hosts"].setdefault(event["host"], {})
            if kind == "host_start":
                host["start"] = event["t"]
            else:
                host.update(end=event["t"], status=event["status"], changed=event["changed"])
                if event.get("ray_wait"):
                    host["ray_wait"] = event["ray_wait"]
                if event.get("copy"):
                    host["copy"] = event["copy"]
        elif kind == "stats":
            stats = event["hosts"]
            if tasks and tasks[-1]["end"] is None:
                tasks[-1]["end"] = event["t"]
    for task in tasks:
        task["end"] = task["end"] if task["end"] is not None else last
        task["duration"] = round(task["end"] - task["start"], 3)
        spans = [h["end"] - h["start"] for h in task["hosts"].values() if "start" in h and "end" in h]
        task["host_max"] = round(max(spans), 3) if spans else 0.0
    return {
        "first_event": first,
        "last_event": last,
        "tasks": tasks,
        "stats": stats,
        "changed": sum(host.get("changed", 0) for host in stats.values()),
        "failed": sum(host.get("failures", 0) + host.get("unreachable", 0) for host in stats.values()),
    }


def read(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return parse(handle.readlines())


def result_time(parsed: dict, action: str, status: str = "ok") -> tuple[float, dict] | tuple[None, None]:
    """When the first host finished the last task that ran `action` with `status`, and that host's record."""
    for task in reversed(parsed["tasks"]):
        if task["action"] != action:
            continue
        done = sorted((h["end"], name) for name, h in task["hosts"].items() if h.get("status") == status and "end" in h)
        if done:
            return done[0][0], task["hosts"][done[0][1]]
    return None, None


# Actions that Ansible runs in the controller's own process: no module run on a node.
CONTROLLER_ACTIONS = frozenset(
    "ansible.builtin." + name for name in (
        "set_fact", "assert", "debug", "fail", "include_tasks", "include_role", "import_role", "import_tasks",
        "validate_argument_spec", "meta", "add_host", "group_by", "include_vars", "set_stats", "pause"))


def work(parsed: dict) -> dict:
    """What a run did, counted rather than timed: tasks started, host results that were not skipped, and of those the
    module runs on a node (every action but the controller's own). Unlike wall time, these do not move with the
    machine's load: a change that removes a module run shows here in every run."""
    ran = [(t["action"], h) for t in parsed["tasks"] for h in t["hosts"].values() if h.get("status") not in (None, "skipped")]
    return {"tasks": len(parsed["tasks"]), "host_results": len(ran),
            "module_runs": sum(1 for action, unused in ran if action not in CONTROLLER_ACTIONS)}


def task_profile(parsed: dict) -> list[dict]:
    """Per task: role, name, wall seconds and the slowest host's seconds, in run order."""
    return [{"role": t["role"] or "-", "task": t["task"], "action": t["action"], "duration": t["duration"], "host_max": t["host_max"]}
            for t in parsed["tasks"]]
