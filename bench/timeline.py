# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the JSON-lines timeline that callback_plugins/bench_timeline.py writes for one playbook run."""

from __future__ import annotations

import json
import statistics


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
    counted = {"tasks": len(parsed["tasks"]), "host_results": len(ran),
               "module_runs": sum(1 for action, unused in ran if action not in CONTROLLER_ACTIONS)}
    counted.update(task_kinds(parsed))
    return counted


def task_kinds(parsed: dict) -> dict:
    """The tasks by what each cost the run in wall time, hosts running side by side: skipped on every host, run in the
    controller's own process (on at least one host), or a module run on at least one node."""
    kinds = {"skipped_tasks": 0, "controller_tasks": 0, "module_tasks": 0}
    for task in parsed["tasks"]:
        if all(h.get("status") in (None, "skipped") for h in task["hosts"].values()):
            kinds["skipped_tasks"] += 1
        elif task["action"] in CONTROLLER_ACTIONS:
            kinds["controller_tasks"] += 1
        else:
            kinds["module_tasks"] += 1
    return kinds


def task_profile(parsed: dict) -> list[dict]:
    """Per task: role, name, wall seconds and the slowest host's seconds, in run order."""
    return [{"role": t["role"] or "-", "task": t["task"], "action": t["action"], "duration": t["duration"], "host_max": t["host_max"]}
            for t in parsed["tasks"]]


# How many tasks of each kind the unit-cost plays run (bench/run.py, unit_playbooks).
UNIT_TASKS = 60
UNIT_MODULE_RUNS = 12


def unit_playbooks(hosts: str = "ray_head:ray_workers") -> dict[str, str]:
    """The four plays Ansible's unit costs are taken from, on every lab node at once: none, UNIT_TASKS set_fact tasks,
    UNIT_TASKS tasks skipped on every host, and UNIT_MODULE_RUNS module runs that do nothing (`command: true`).
    Written as JSON, which YAML reads."""

    def play(tasks: list) -> str:
        return json.dumps([{"name": "Ansible's unit cost", "hosts": hosts, "gather_facts": False, "tasks": tasks}], indent=1)

    return {
        "empty": play([]),
        "controller": play([{"name": "Keep %d" % i, "ansible.builtin.set_fact": {"bench_unit_%d" % i: "{{ %d + 1 }}" % i}}
                            for i in range(UNIT_TASKS)]),
        "skipped": play([{"name": "Skip %d" % i, "ansible.builtin.debug": {"msg": "unused"}, "when": False} for i in range(UNIT_TASKS)]),
        "module": play([{"name": "Run %d" % i, "ansible.builtin.command": "true", "changed_when": False}
                        for i in range(UNIT_MODULE_RUNS)]),
    }


def unit_cost_rounds(samples: dict) -> dict:
    """Seconds per unit, round by round, from the wall times of the unit-cost plays (lists of seconds by play, one per
    round): the play's start (the empty play), and a controller task, a task skipped on every host and a module run on
    every node, each its play's time less the empty play's of the same round, divided by the play's count."""
    rounds = min(len(samples[kind]) for kind in ("empty", "controller", "skipped", "module"))
    empty = samples["empty"][:rounds]
    return {"start_s": empty,
            "controller_task_s": [(samples["controller"][i] - empty[i]) / UNIT_TASKS for i in range(rounds)],
            "skipped_task_s": [(samples["skipped"][i] - empty[i]) / UNIT_TASKS for i in range(rounds)],
            "module_run_s": [(samples["module"][i] - empty[i]) / UNIT_MODULE_RUNS for i in range(rounds)]}


def unit_costs(samples: dict) -> dict:
    """The median of each unit cost over the rounds (unit_cost_rounds)."""
    return {unit: round(statistics.median(values), 4) for unit, values in unit_cost_rounds(samples).items()}


def own_cost(counted: dict, costs: dict) -> float:
    """What a run's counts cost at those unit costs: the play's start, and each task at its kind's cost. Hosts run a
    task side by side, so a task counts once however many hosts ran it; a module run's own work is not in it."""
    return round(costs["start_s"] + counted["controller_tasks"] * costs["controller_task_s"]
                 + counted["skipped_tasks"] * costs["skipped_task_s"] + counted["module_tasks"] * costs["module_run_s"], 2)
