# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render bench/results/results.json as the Markdown table of RESULTS.md."""

from __future__ import annotations

from collections import defaultdict

import timeline
from benchlib import summary

GOALS = {"ratio": 1.10, "gate": 1.0, "noop": 10.0, "scale": 1.5}


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else ("%.*f" % (digits, value))


def _row(number: str, what: str, values: list, goal: str = "", met: bool | None = None, digits: int = 2) -> str:
    s = summary(values)
    mark = "" if met is None else ("yes" if met else "**no**")
    return "| %s | %s | %s | %s | %s | %d | %s | %s |" % (
        number, what, _fmt(s["median"], digits), _fmt(s["min"], digits), _fmt(s["max"], digits), s["n"], goal, mark)


def _ok(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r and r.get("rc") == 0]


def _field(runs: list[dict], key: str) -> list:
    return [r.get(key) for r in _ok(runs) if r.get(key) is not None]


def _ratios(rounds: list[dict]) -> list[float]:
    return [p["playbook"]["wall_s"] / p["floor"]["wall_s"] for p in rounds
            if p.get("playbook", {}).get("rc") == 0 and p.get("floor", {}).get("rc") == 0]


def _median(values: list):
    return summary(values)["median"]


def machine_lines(results: dict) -> list[str]:
    m = results.get("machine", {})
    tree = results.get("tree", {})
    lines = [
        "- machine: %s CPU(s) (%s), %s GiB memory, kernel %s, %s" % (
            m.get("nproc"), m.get("cpu_model"), m.get("memory_gib"), m.get("kernel"), m.get("os")),
        "- software: Python %s, ansible-core %s, community.docker %s, Docker %s (client %s), %s" % (
            m.get("python"), m.get("ansible_core"), m.get("community_docker"), m.get("docker_daemon"), m.get("docker_client"),
            results.get("ray_version") or "Ray ?"),
        "- images: %s" % (", ".join(results.get("images", [])) or "-"),
        "- collection: git %s, snapshot %s%s" % (
            m.get("git_head"), tree.get("sha256"),
            (" with uncommitted changes in %d file(s)" % len(tree["uncommitted"])) if tree.get("uncommitted") else ""),
        "- load average at start %s, at end %s; %s run(s) of each kind; started %s, finished %s" % (
            " ".join(m.get("loadavg_start", [])), " ".join(m.get("loadavg_end", [])), results.get("runs"),
            results.get("started"), results.get("finished", "-")),
    ]
    return lines


def own_cost_rows(rounds: list[dict], units: dict | None) -> list[str]:
    """Ansible's unit costs on this lab (a play's start, a controller task, a skipped task, a module run), and what the
    playbook's counts cost at them beside what it took over the floor: how close to the floor its counts allow."""
    if not units or not units.get("samples"):
        return []
    per_round = timeline.unit_cost_rounds(units["samples"])
    costs = timeline.unit_costs(units["samples"])
    out = [_row("1", "Ansible on this lab: an empty play on both nodes, start to end (s)", per_round["start_s"]),
           _row("1", "Ansible on this lab: one task in the controller's process (`set_fact`), both nodes (s)",
                per_round["controller_task_s"], digits=3),
           _row("1", "Ansible on this lab: one task skipped on both nodes (s)", per_round["skipped_task_s"], digits=3),
           _row("1", "Ansible on this lab: one module run on both nodes (`command: true`) (s)", per_round["module_run_s"], digits=3)]
    pairs = [(p["playbook"], p["floor"]) for p in rounds
             if p.get("playbook", {}).get("rc") == 0 and p.get("floor", {}).get("rc") == 0 and p["playbook"].get("work", {}).get("module_tasks") is not None]
    if pairs:
        owns = [timeline.own_cost(playbook["work"], costs) for playbook, unused in pairs]
        out.append(_row("1", "time to ready, playbook: its tasks by kind at these unit costs (s)", owns))
        out.append(_row("1", "time to ready, playbook minus floor, per round (s)", [p["wall_s"] - f["wall_s"] for p, f in pairs]))
        out.append(_row("1", "ratio the playbook's counts allow, per round: (floor + its tasks at unit cost) / floor",
                        [(f["wall_s"] + own) / f["wall_s"] for (unused, f), own in zip(pairs, owns)]))
    return out


def results_table(results: dict) -> list[str]:
    out = ["| # | measure | median | min | max | n | goal | met |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    ready = results.get("ready")
    if ready:
        rounds = ready["rounds"]
        playbook = [r.get("playbook") for r in rounds]
        floor = [r.get("floor") for r in rounds]
        ratios = _ratios(rounds)
        out.append(_row("1", "time to ready, `deploy_qwen35.yml` (s)", _field(playbook, "wall_s")))
        out.append(_row("1", "time to ready, floor `bench/floor.py` (s)", _field(floor, "wall_s")))
        out.append(_row("1", "ratio playbook / floor, per round", ratios, "<= %.2f" % GOALS["ratio"],
                        bool(ratios) and _median(ratios) <= GOALS["ratio"]))
        out.append(_row("1", "machine: fixed CPU work timed before each playbook and floor run (s)",
                        _field(playbook, "calibration_s") + _field(floor, "calibration_s")))
        out.append(_row("1", "time to ready, playbook: controller CPU time (s)", _field(playbook, "controller_cpu_s")))
        out.append(_row("1", "time to ready, playbook: tasks", [r["work"]["tasks"] for r in _ok(playbook) if r.get("work")], digits=0))
        out.append(_row("1", "time to ready, playbook: module runs on the nodes",
                        [r["work"]["module_runs"] for r in _ok(playbook) if r.get("work")], digits=0))
        out += own_cost_rows(rounds, ready.get("unit_costs"))
        gate = _field(playbook, "gate_reaction_s")
        out.append(_row("2", "gate reaction: last node's Ray start to gate passed, playbook (s)", gate, "<= %.1f" % GOALS["gate"],
                        bool(gate) and _median(gate) <= GOALS["gate"]))
        out.append(_row("2", "same, floor (reader looped in one `docker exec`, 0.2 s) (s)", _field(floor, "gate_reaction_s")))
    noop = results.get("noop")
    if noop:
        walls = _field(noop, "wall_s")
        changed = [r.get("changed") for r in _ok(noop)]
        out.append(_row("3", "no-op re-run, `deploy_qwen35.yml` on a healthy 2-node cluster (s)", walls, "<= %.0f" % GOALS["noop"],
                        bool(walls) and _median(walls) <= GOALS["noop"]))
        out.append(_row("3", "no-op re-run, tasks changed", changed, "0", bool(changed) and max(changed) == 0, digits=0))
        out.append(_row("3", "machine: fixed CPU work timed before each no-op (s)", _field(noop, "calibration_s")))
        out.append(_row("3", "no-op re-run, controller CPU time (s)", _field(noop, "controller_cpu_s")))
        for key, what in (("tasks", "tasks"), ("module_runs", "module runs on the nodes")):
            out.append(_row("3", "no-op re-run, %s" % what, [r["work"][key] for r in _ok(noop) if r.get("work")], digits=0))
    scale = results.get("scale") or {}
    base = None
    for nodes in sorted(scale, key=int):
        rounds = scale[nodes]["rounds"]
        walls = _field([r.get("playbook") for r in rounds], "wall_s")
        out.append(_row("4", "Ray-only deploy T(%s), playbook (s)" % nodes, walls))
        out.append(_row("4", "Ray-only deploy, %s nodes, floor (s)" % nodes, _field([r.get("floor") for r in rounds], "wall_s")))
        out.append(_row("4", "Ray-only, %s nodes, ratio playbook / floor" % nodes, _ratios(rounds)))
        if base is None:
            base = (nodes, _median(walls))
        elif base[1] and walls:
            ratio = _median(walls) / base[1]
            goal = "<= %.1f" % GOALS["scale"] if nodes == "8" else ""
            out.append("| 4 | T(%s)/T(%s), ratio of medians | %s | | | | %s | %s |" % (
                nodes, base[0], _fmt(ratio), goal, ("yes" if ratio <= GOALS["scale"] else "**no**") if goal else ""))
    facts = results.get("facts")
    if facts:
        out.append(_row("5", "`gpulab.vllm.ray_cluster_facts`, ad hoc `ansible` command (s)", facts["module_adhoc_s"]))
        out.append(_row("5", "`gpulab.vllm.ray_cluster_facts`, its own read (`docker exec` + GCS reader) (s)", facts["module_read_s"]))
        out.append(_row("5", "GCS reader alone, `docker exec` from the machine (s)", facts["reader_exec_s"]))
        out.append(_row("5", "`ray status` in the head container, `docker exec` (s)", facts["ray_status_s"]))
        module, status = _median(facts["module_read_s"]), _median(facts["ray_status_s"])
        if module and status:
            out.append("| 5 | `ray status` / module read, ratio of medians | %s | | | | | |" % _fmt(status / module, 1))
    return out


def _by_role(runs: list[dict]) -> dict:
    """Median over runs of the seconds each role's tasks took (startup = before the first task)."""
    per_run = []
    for run in _ok(runs):
        totals = defaultdict(float)
        totals["(ansible-playbook start-up)"] = run.get("startup_s") or 0.0
        for task in run["profile"]:
            totals[task["role"] if task["role"] != "-" else "(play-level tasks)"] += task["duration"]
        per_run.append(totals)
    keys = sorted({k for t in per_run for k in t})
    return {k: _median([t.get(k, 0.0) for t in per_run]) for k in keys}


def _top_tasks(runs: list[dict], limit: int) -> list[tuple[str, str, float, float]]:
    per_task = defaultdict(list)
    per_host = defaultdict(list)
    for run in _ok(runs):
        seen = defaultdict(float)
        seen_host = defaultdict(float)
        for task in run["profile"]:
            seen[(task["role"], task["task"])] += task["duration"]
            seen_host[(task["role"], task["task"])] += task["host_max"]
        for key, value in seen.items():
            per_task[key].append(value)
            per_host[key].append(seen_host[key])
    rows = [(role, name, _median(values), _median(per_host[(role, name)])) for (role, name), values in per_task.items()]
    return sorted(rows, key=lambda r: -r[2])[:limit]


def profile_section(title: str, runs: list[dict], limit: int = 12) -> list[str]:
    runs = _ok(runs)
    if not runs:
        return []
    wall = _median([r["wall_s"] for r in runs])
    out = ["", "### %s (median of %d runs, wall %s s, CPU busy %s)" % (
        title, len(runs), _fmt(wall, 1), _fmt(_median([r.get("cpu_busy") for r in runs if r.get("cpu_busy") is not None]), 2)),
        "", "| role | seconds | share |", "| --- | --- | --- |"]
    for role, seconds in sorted(_by_role(runs).items(), key=lambda kv: -kv[1]):
        out.append("| %s | %s | %s%% |" % (role, _fmt(seconds, 1), _fmt(100 * seconds / wall, 0) if wall else "-"))
    out += ["", "| role | task | seconds | slowest host |", "| --- | --- | --- | --- |"]
    for role, name, seconds, host in _top_tasks(runs, limit):
        out.append("| %s | %s | %s | %s |" % (role, name, _fmt(seconds), _fmt(host)))
    return out


def floor_section(rounds: list[dict]) -> list[str]:
    floors = [r["floor"] for r in rounds if r.get("floor", {}).get("rc") == 0 and r["floor"].get("marks")]
    if not floors:
        return []
    steps = list(floors[0]["marks"])
    out = ["", "### Floor, end of each step (median seconds since start, %d runs)" % len(floors), "",
           "| step | seconds |", "| --- | --- |"]
    out += ["| %s | %s |" % (step, _fmt(_median([f["marks"].get(step) for f in floors]))) for step in steps]
    diffs = sorted({d for f in floors for d in f.get("parity_diffs", [])})
    out += ["", "Floor containers against the playbook's (docker inspect): %s." % ("identical" if not diffs else "; ".join(diffs))]
    return out


# The checks both sides run before the load: the playbook's role, and the floor's step (its mark, and the mark before).
CHECK_STAGES = (("image's contract probe (GPU smoke)", "gpulab.vllm.image", "probe", "secrets_firewall_pull"),
                ("model's proof on every node", "gpulab.vllm.weights", "weights_proof", "probe"),
                ("collective across every GPU", "gpulab.vllm.collective", "collective", "gate"))


def stages_section(rounds: list[dict]) -> list[str]:
    """What each check before the load costs, from nothing: the playbook's role (median seconds of its tasks) beside
    the floor's step doing the same work."""
    playbooks = _ok([r.get("playbook") for r in rounds if r.get("playbook")])
    floors = [r["floor"] for r in rounds if r.get("floor", {}).get("rc") == 0 and r["floor"].get("marks")]
    if not playbooks or not floors:
        return []
    roles = _by_role(playbooks)
    out = ["", "### The checks before the load, from nothing (median seconds)", "",
           "| check | playbook (its role) | floor (same work) |", "| --- | --- | --- |"]
    for what, role, step, before in CHECK_STAGES:
        spans = [f["marks"][step] - f["marks"].get(before, f["marks"][step]) for f in floors if step in f["marks"]]
        out.append("| %s | %s | %s |" % (what, _fmt(roles.get(role), 1), _fmt(_median(spans), 1) if spans else "not run"))
    return out


def variants_section(variants: dict) -> list[str]:
    if not variants:
        return []
    out = ["", "## Variants, measured beside the snapshot in the same rounds (Ray-only `deploy.yml`, 2 nodes)", "",
           "| tree | deploy from nothing (s) | gate reaction (s) | no-op re-run (s) | no-op changed |", "| --- | --- | --- | --- | --- |"]
    for name, entry in variants.items():
        cells = []
        for key, field in (("deploy", "wall_s"), ("deploy", "gate_reaction_s"), ("noop", "wall_s")):
            s = summary(_field(entry[key], field))
            cells.append("%s (%s-%s)" % (_fmt(s["median"]), _fmt(s["min"]), _fmt(s["max"])))
        changed = [r.get("changed") for r in _ok(entry["noop"])]
        out.append("| %s | %s | %s |" % (name, " | ".join(cells), max(changed) if changed else "-"))
    base = variants.get("snapshot")
    for name, entry in variants.items():
        if name == "snapshot" or not base:
            continue
        for key, what in (("deploy", "deploy from nothing"), ("noop", "no-op re-run")):
            pairs = [(a.get("wall_s"), b.get("wall_s")) for a, b in zip(entry[key], base[key])
                     if a.get("rc") == 0 and b.get("rc") == 0 and b.get("wall_s")]
            if pairs:
                ratios = sorted(a / b for a, b in pairs)
                out.append("")
                out.append("%s, %s / snapshot, per round: median %s (min %s, max %s, n %d)" % (
                    what, name, _fmt(_median(ratios)), _fmt(ratios[0]), _fmt(ratios[-1]), len(ratios)))
    return out


def weights_section(weights: dict) -> list[str]:
    """The model onto every node: per lab size, the play's wall time, rounds, each node's copy rate (the task's span,
    and the module's own copy), the re-run; and both rates against a raw stream over the same fabric addresses."""
    if not weights:
        return []
    mb = weights.get("model_mb") or 0
    out = ["", "## The model onto every node (weights role, %d MB in %s)" % (mb, "random shards"), "",
           "| nodes | copy play s (median, min-max) | rounds | per-node task MB/s (median) | per-node copy MB/s (median) "
           "| re-run s (median) | runs |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    raw_rates, span_rates, own_rates = [], [], []
    for nodes, size in sorted((weights.get("sizes") or {}).items(), key=lambda kv: int(kv[0])):
        copies = _ok(size.get("copy") or [])
        walls = [c["wall_s"] for c in copies]
        rates = [mb / span for c in copies for span in c.get("copy_spans_s") or [] if span > 0]
        own = [o["received_bytes"] / 1048576 / o["seconds"] for c in copies for o in c.get("copy_own") or []
               if o.get("seconds") and o.get("received_bytes")]
        rounds = sorted({c.get("rounds") for c in copies})
        s = summary(walls)
        out.append("| %s | %s (%s-%s) | %s | %s | %s | %s | %d |" % (
            nodes, _fmt(s["median"], 1), _fmt(s["min"], 1), _fmt(s["max"], 1), "/".join(str(r) for r in rounds) or "-",
            _fmt(_median(rates), 0), _fmt(_median(own), 0), _fmt(_median(_field(size.get("rerun") or [], "wall_s")), 1), s["n"]))
        if size.get("raw_s"):
            raw_rates = [mb / t for t in size["raw_s"] if t > 0]
            span_rates, own_rates = rates, own
    if raw_rates:
        raw = _median(raw_rates)
        span_ratio = _median(span_rates) / raw if span_rates else None
        own_ratio = _median(own_rates) / raw if own_rates else None
        out += ["", "Raw stream over the same fabric addresses (one TCP stream, sendfile from the page cache, read into "
                "nothing): %s MB/s median of %d. The copy with its proof (received, written, hashed, moved into place; the "
                "module's own seconds) reaches %s of it (goal: 0.5 or more); the whole task, with the module's start over "
                "SSH, %s." % (_fmt(raw, 0), len(raw_rates), _fmt(own_ratio, 2), _fmt(span_ratio, 2))]
    return out


def faults_section(found: dict) -> list[str]:
    """The fault matrix: per fault class, seconds from the deploy's start to its stop (median, min-max), whether its
    last line named the cause and the fix in every run, within the row's budget, before any model load, and nothing
    started past the failing stage; then the line itself."""
    if not found:
        return []
    out = ["", "## Time to a correct diagnosis (fault matrix)", "",
           "| fault | stopped at | s to the stop (median, min-max) | named | within budget | before the load | nothing past | runs |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines, hands = [], []
    for key, entry in found.items():
        row = entry["row"]
        hand = row.get("hand") or {}
        if hand.get("ran"):
            hs = hand.get("seconds") or {}
            hands.append("| %s | %s s, %s | %s s, %s |" % (
                row["title"], _fmt(s_median(row), 1), (row["said"] or "-").replace("|", "/")[:160],
                _fmt(hs.get("median"), 1), ("" if hand.get("failed") else "did not stop: ") + (hand.get("said") or "-").replace("|", "/")[:160]))
        else:
            hands.append("| %s | %s s, %s | not run: %s |" % (
                row["title"], _fmt(s_median(row), 1), (row["said"] or "-").replace("|", "/")[:160], hand.get("why_not") or "-"))
        s = row.get("seconds") or {}
        out.append("| %s | %s | %s (%s-%s) | %s | %s (%d s) | %s | %s | %d |" % (
            row["title"], row["stage"], _fmt(s.get("median"), 1), _fmt(s.get("min"), 1), _fmt(s.get("max"), 1),
            "yes" if row["named"] else "**no**", "yes" if row["within_budget"] else "**no**", row["budget_s"],
            "yes" if row["before_load"] else "n/a (a fault of the load)", "yes" if row["nothing_past_stage"] else "**no**",
            row["runs"]))
        lines.append("- %s: %s" % (row["title"], (row["said"] or "(no error line)").replace("|", "/")[:400]))
    out += ["", "What each run ended with (the last error line, or the repair it named):", ""] + lines
    out += ["", "Beside the hand flow (Ray started by hand, `sleep 10` + `ray status`, then `vllm serve`, the same budget):", "",
            "| fault | ours (s, message) | hand flow (s, message) |", "| --- | --- | --- |"] + hands
    return out


def s_median(row: dict):
    return (row.get("seconds") or {}).get("median")


def render(results: dict) -> str:
    out = ["# gpulab.vllm benchmarks", "", "Written by `make bench` (bench/run.py); method in docs/performance.md.", ""]
    out += machine_lines(results)
    out += ["", "## Results", ""] + results_table(results)
    ready = results.get("ready") or {}
    out += ["", "## Where the time goes"]
    out += profile_section("`deploy_qwen35.yml` from nothing", [r.get("playbook") for r in ready.get("rounds", [])])
    out += floor_section(ready.get("rounds", []))
    out += stages_section(ready.get("rounds", []))
    out += profile_section("no-op re-run of `deploy_qwen35.yml`", results.get("noop") or [])
    for nodes, entry in sorted((results.get("scale") or {}).items(), key=lambda kv: int(kv[0])):
        out += profile_section("Ray-only `deploy.yml`, %s nodes" % nodes, [r.get("playbook") for r in entry["rounds"]], limit=8)
    out += weights_section(results.get("weights") or {})
    out += variants_section(results.get("variants") or {})
    out += faults_section(results.get("faults") or {})
    return "\n".join(out) + "\n"
