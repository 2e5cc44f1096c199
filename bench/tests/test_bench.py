# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks of the benchmark code that need no lab: python -m pytest bench/tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from xml.etree import ElementTree

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402
import faults  # noqa: E402
import pictures  # noqa: E402
import floor  # noqa: E402
import report  # noqa: E402
import timeline  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SECRETS = {"ray_cluster_auth_token": "t" * 64, "vllm_server_api_key": "k" * 64}


def test_timeline_of_a_real_playbook_run(tmp_path):
    """The callback plugin, loaded by ansible-playbook as bench/run.py loads it, writes a timeline parse() reads."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: First\n      ansible.builtin.command: 'true'\n      changed_when: false\n"
        "    - name: Second, changed\n      ansible.builtin.command: 'true'\n"
        "    - name: Skipped\n      ansible.builtin.debug: {msg: x}\n      when: false\n")
    out = tmp_path / "timeline.jsonl"
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=str(BENCH / "callback_plugins"), ANSIBLE_CALLBACKS_ENABLED="bench_timeline",
               BENCH_TIMELINE=str(out))
    env.pop("ANSIBLE_CONFIG", None)
    ansible = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(ansible), "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)]
    subprocess.run(argv, env=env, check=True, capture_output=True, cwd=tmp_path)
    parsed = timeline.read(out)
    assert [t["task"] for t in parsed["tasks"]] == ["First", "Second, changed", "Skipped"]
    assert parsed["changed"] == 1 and parsed["failed"] == 0
    assert parsed["tasks"][2]["hosts"]["localhost"]["status"] == "skipped"
    assert all(t["duration"] >= 0 for t in parsed["tasks"])
    at, host = timeline.result_time(parsed, "ansible.builtin.command")
    assert at == parsed["tasks"][1]["hosts"]["localhost"]["end"] and host["changed"]
    # Counted, not timed: three tasks, two that ran, both module runs (the skipped debug would be the controller's).
    assert timeline.work(parsed) == {"tasks": 3, "host_results": 2, "module_runs": 2,
                                     "skipped_tasks": 1, "controller_tasks": 0, "module_tasks": 2}


def test_work_counts_on_a_recorded_deploy():
    parsed = timeline.read(FIXTURES / "deploy_timeline.jsonl")
    counted = timeline.work(parsed)
    runs = [t["action"] for t in parsed["tasks"] for h in t["hosts"].values()
            if h.get("status") != "skipped" and t["action"] not in timeline.CONTROLLER_ACTIONS]
    assert counted["module_runs"] == len(runs) and counted["tasks"] == len(parsed["tasks"])
    # The node read on both nodes, the gate's reader, and no set_fact or assert among the module runs.
    assert runs.count("gpulab.vllm.node_facts") == 2 and "gpulab.vllm.ray_cluster_facts" in runs
    assert not {"ansible.builtin.set_fact", "ansible.builtin.assert"} & set(runs)
    assert counted["module_runs"] < counted["host_results"] < 2 * counted["tasks"]


def test_container_spec_round_trip():
    inspect = json.loads((FIXTURES / "inspect_vllm_server.json").read_text())
    files = {"/etc/gpulab-vllm/secrets/ray_token": "ray_cluster_auth_token",
             "/etc/gpulab-vllm/secrets/vllm_api_key": "vllm_server_api_key"}
    spec = benchlib.container_spec(inspect, SECRETS, files)
    # The key reaches the server as a file, never through its environment.
    assert not any(key == "VLLM_API_KEY" for key, unused in spec["env"])
    assert "k" * 64 not in json.dumps(spec)
    assert sorted(spec["secret_files"], key=lambda item: item["path"]) == [
        {"path": path, "secret": secret} for path, secret in sorted(files.items())]
    argv = benchlib.run_argv(spec, SECRETS)
    assert argv[:4] == ["run", "-d", "--name", "gpulab-vllm"]
    assert not any("k" * 64 in arg for arg in argv)
    assert "--middleware" in argv
    tail = argv[argv.index("--entrypoint"):]
    assert tail[:3] == ["--entrypoint", "vllm", inspect["Config"]["Image"]]
    assert tail[3:] == inspect["Config"]["Cmd"]
    assert benchlib.vllm_endpoint(spec) == {"port": 8000, "model": "tiny-llama"}


def test_namespaces_shared_with_another_container_are_named():
    inspect = json.loads((FIXTURES / "inspect_vllm_server.json").read_text())
    inspect["HostConfig"].update(IpcMode="container:abc123", PidMode="container:abc123")
    spec = benchlib.container_spec(inspect, SECRETS, {}, {"abc123": "gpulab-ray-head"})
    assert spec["ipc"] == spec["pid"] == "container:gpulab-ray-head"
    argv = benchlib.run_argv(spec, SECRETS)
    assert argv[argv.index("--pid") + 1] == "container:gpulab-ray-head"


def test_expected_cluster_from_ray_commands():
    head = {"role": "ray-head", "command": ["start", "--block", "--head", "--port=6379", "--node-ip-address=10.220.0.11", "--num-gpus=1"]}
    worker = {"role": "ray-worker", "command": ["start", "--block", "--address=10.220.0.11:6379", "--node-ip-address=10.220.0.12", "--num-gpus=1"]}
    assert benchlib.expected_cluster([head, worker, {"role": "vllm-server", "command": []}]) == {
        "nodes": 2, "gpus": 2.0, "gcs_address": "10.220.0.11:6379"}


def test_firewall_rules_from_iptables_save():
    rules = benchlib.firewall_rules((FIXTURES / "iptables_S.txt").read_text())
    assert rules[0] == ["-N", "GPULAB-INPUT"]
    assert rules[-1][0] == "-I" and rules[-1][1] == "INPUT" and rules[-1][-2:] == ["-j", "GPULAB-INPUT"]
    assert any("gpulab: the fabric subnet" in rule for rule in rules)


def test_port_wait_polls_until_the_port_answers():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        proc = subprocess.run([sys.executable, "-c", floor.PORT_WAIT, "127.0.0.1", str(port), "0.2", "5"], timeout=30, check=False)
    assert proc.returncode == 0
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    assert subprocess.run([sys.executable, "-c", floor.PORT_WAIT, "127.0.0.1", str(free), "0.2", "0.5"], timeout=30, check=False).returncode == 1


def test_the_floor_waits_with_the_collections_own_reader():
    """No readiness rule of the bench's own: it runs the collection's reader file, whose wait uses its rule."""
    collection = Path(__file__).resolve().parents[2]
    source = benchlib.gcs_reader_source(collection)
    assert source == (collection / "plugins" / "module_utils" / "_gcs_reader.py").read_text()
    assert "def shortfalls(" in source and not hasattr(floor, "GATE_LOOP")
    recorded = json.loads((collection / "tests" / "unit" / "fixtures" / "ray" / "ray_2node_alive.json").read_text())
    nodes = benchlib.reader_nodes(recorded["reader_run"]["stdout"])
    assert sorted(n["node_ip"] for n in nodes) == ["10.220.0.11", "10.220.0.12"]
    unreachable = json.loads((collection / "tests" / "unit" / "fixtures" / "ray" / "ray_gcs_unreachable.json").read_text())
    with pytest.raises(RuntimeError, match="gcs_unreachable"):
        benchlib.reader_nodes(unreachable["reader_run"]["stdout"])


def test_wait_completion_retries_until_a_choice_comes_back():
    answers = [503, 503, 200]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            assert self.headers["Authorization"] == "Bearer secret"
            status = answers.pop(0)
            self.send_response(status)
            self.end_headers()
            if status == 200:
                self.wfile.write(json.dumps({"choices": [{"text": " hi"}]}).encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/v1/completions" % server.server_address[1]
        assert floor.wait_completion(url, "m", "secret", 0.05, 10) == {"attempts": 3, "text": " hi"}
    finally:
        server.shutdown()
        server.server_close()


def test_summary_and_report_render():
    assert benchlib.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert benchlib.summary([None])["median"] is None
    profile = [{"role": "gate", "task": "Wait", "action": "gpulab.vllm.ray_cluster_facts", "duration": 2.0, "host_max": 1.9}]
    playbook = {"rc": 0, "wall_s": 90.0, "startup_s": 2.0, "gate_reaction_s": 1.5, "profile": profile, "cpu_busy": 0.9}
    floor_run = {"rc": 0, "wall_s": 80.0, "gate_reaction_s": 0.4, "marks": {"head_started": 1.0, "gate": 5.0}, "parity_diffs": []}
    results = {
        "runs": 3, "machine": {"nproc": 2}, "tree": {"sha256": "abc", "uncommitted": []},
        "ready": {"rounds": [{"playbook": playbook, "floor": floor_run}] * 3},
        "noop": [dict(playbook, wall_s=8.0, changed=0)] * 3,
        "scale": {"2": {"rounds": [{"playbook": dict(playbook, wall_s=20.0), "floor": floor_run}]},
                  "8": {"rounds": [{"playbook": dict(playbook, wall_s=40.0), "floor": floor_run}]}},
        "facts": {"module_adhoc_s": [3.0], "module_read_s": [0.5], "reader_exec_s": [0.4], "ray_status_s": [2.5]},
        "variants": {"snapshot": {"deploy": [playbook], "noop": [dict(playbook, wall_s=8.0, changed=0)]}},
    }
    text = report.render(results)
    assert "| 1 | ratio playbook / floor, per round | 1.12 | 1.12 | 1.12 | 3 | <= 1.10 | **no** |" in text
    assert "| 4 | T(8)/T(2), ratio of medians | 2.00 |" in text and "**no**" in text
    assert "| gate | 2.0 | 2% |" in text
    assert "identical" in text
    assert "| snapshot | 90.00 (90.00-90.00) | 1.50 (1.50-1.50) | 8.00 (8.00-8.00) | 0 |" in text


def test_every_fault_row_names_a_test_that_exists():
    """Each row of the fault matrix is asserted in CI, by the test it names (tests/integration/test_faults.py or another)."""
    root = BENCH.parent
    rows = [fault.key for fault in faults.FAULTS]
    assert len(rows) == len(set(rows)) == 15
    for fault in faults.FAULTS:
        path, unused_separator, name = fault.test.partition("::")
        assert (root / path).exists(), fault.key
        function = name.split("[", 1)[0]
        assert function and "def %s(" % function in (root / path).read_text(), (fault.key, fault.test)
        parameter = name.partition("[")[2].rstrip("]")
        # The rows test_fault_is_named runs are its parameters; a repaired row has a test of its own there.
        if function == "test_fault_is_named":
            assert parameter == fault.key
        assert fault.stage in faults.STAGES


def _fault_records() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((FIXTURES / "faults").glob("*.json"))]


@pytest.mark.parametrize("record", _fault_records(), ids=lambda record: record["key"])
def test_the_verdict_on_a_recorded_fault_run(record):
    """Each row's patterns read a real run's output as the benchmark read it (bench/tests/record_fault_fixtures.py)."""
    verdict = faults.judge(faults.BY_KEY[record["key"]], record["output"], [])
    assert verdict["said"] == record["said"]
    assert verdict["named"] == record["named"]


def test_the_deploy_timeline_picture_shows_each_nodes_stages_in_order():
    parsed = timeline.read(FIXTURES / "deploy_timeline.jsonl")
    spans = pictures.stage_spans(parsed)
    assert sorted(spans) == ["node1", "node2"]
    # Each stage's preflight runs in the first play: the order is where each stage last ran.
    order = [stage for stage, unused_start, unused_end in spans["node1"]]
    last = {stage: index for index, stage in enumerate(order)}
    for earlier, later in (("fabric", "ray_cluster"), ("ray_cluster", "gate"), ("gate", "vllm_server")):
        assert last[earlier] < last[later], order
    # The collective check runs from the head alone.
    assert "collective" in order
    assert "collective" not in [stage for stage, unused_start, unused_end in spans["node2"]]
    svg = pictures.timeline_svg(parsed, "a deploy & its stages")
    root = ElementTree.fromstring(svg)
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    # One background, one bar per span, one legend square per stage that ran.
    stages = {stage for mine in spans.values() for stage, unused_start, unused_end in mine}
    assert len(rects) == 1 + sum(len(mine) for mine in spans.values()) + len(stages)


def test_the_fault_matrix_picture_and_table_have_one_row_per_fault():
    records = _fault_records()
    rows = [{"key": r["key"], "title": faults.BY_KEY[r["key"]].title, "stage": faults.BY_KEY[r["key"]].stage,
             "seconds": {"median": 10.0, "min": 9.0, "max": 11.0, "n": 1}, "named": r["named"], "within_budget": True,
             "nothing_past_stage": True, "budget_s": faults.BY_KEY[r["key"]].budget_s, "said": r["said"], "runs": 1,
             "before_load": True, "hand": {"ran": False, "why_not": "not run"}} for r in records]
    root = ElementTree.fromstring(pictures.faults_svg(rows, "faults"))
    bars = [rect for rect in root.findall("{http://www.w3.org/2000/svg}rect") if rect.find("{http://www.w3.org/2000/svg}title") is not None]
    assert len(bars) == len(rows)
    table = report.faults_section({row["key"]: {"row": row} for row in rows})
    assert sum(1 for line in table if line.startswith("| %s |" % rows[0]["title"])) == 2


def test_the_checks_before_the_load_side_by_side_on_recorded_rounds():
    """Each check's seconds from nothing: the playbook's role beside the floor's step doing the same work (three rounds
    recorded by make bench on the two-node lab)."""
    rounds = json.loads((FIXTURES / "ready_rounds.json").read_text())["rounds"]
    lines = report.stages_section(rounds)
    rows = {line.split(" | ", maxsplit=1)[0].lstrip("| "): line for line in lines if line.startswith("| ") and "---" not in line}
    assert set(rows) == {"check", "image's contract probe (GPU smoke)", "model's proof on every node", "collective across every GPU"}
    floors = sorted(r["floor"]["marks"]["collective"] - r["floor"]["marks"]["gate"] for r in rounds)
    assert rows["collective across every GPU"].endswith("| %.1f |" % floors[1])
    # Every check costs the playbook more than the floor: its module runs and tasks around the same work.
    for name in ("image's contract probe (GPU smoke)", "model's proof on every node", "collective across every GPU"):
        playbook, floor = (float(cell) for cell in rows[name].strip("| ").split(" | ")[1:])
        assert playbook > floor, rows[name]
    assert report.stages_section([{"playbook": r["playbook"], "floor": {"rc": 1}} for r in rounds]) == []


def test_task_kinds_partition_a_recorded_deploy():
    """Every task of a recorded deploy is one kind: skipped on every host, the controller's own, or a module run."""
    counted = timeline.work(timeline.read(FIXTURES / "deploy_timeline.jsonl"))
    assert counted["skipped_tasks"] + counted["controller_tasks"] + counted["module_tasks"] == counted["tasks"]
    # Two nodes: a module task ran on one of them or both.
    assert counted["module_tasks"] <= counted["module_runs"] <= 2 * counted["module_tasks"]
    assert counted["skipped_tasks"] > 0 and counted["controller_tasks"] > counted["module_tasks"] > 0


def test_what_the_playbooks_counts_allow_on_a_recorded_run():
    """The unit-cost plays' wall times and the ready step's rounds of one bench run on the lab (unit_costs.json)."""
    recorded = json.loads((FIXTURES / "unit_costs.json").read_text())
    units = recorded["unit_costs"]
    costs = timeline.unit_costs(units["samples"])
    # The same costs the run computed; a module run (SSH, Python on the node) costs more than a task in the
    # controller's own process, which costs more than a task skipped on every host.
    assert costs == units["costs"]
    assert costs["module_run_s"] > costs["controller_task_s"] > costs["skipped_task_s"] > 0 and costs["start_s"] > 0
    per_round = timeline.unit_cost_rounds(units["samples"])
    assert [len(values) for values in per_round.values()] == [len(units["samples"]["empty"])] * 4
    # A run's counts at these costs: each task once, at its kind's cost.
    work = recorded["rounds"][0]["playbook"]["work"]
    by_hand = (costs["start_s"] + work["controller_tasks"] * costs["controller_task_s"]
               + work["skipped_tasks"] * costs["skipped_task_s"] + work["module_tasks"] * costs["module_run_s"])
    assert timeline.own_cost(work, costs) == round(by_hand, 2)
    rows = report.own_cost_rows(recorded["rounds"], units)
    assert len(rows) == 7 and all(row.startswith("| 1 | ") for row in rows)
    allowed = [row for row in rows if "ratio the playbook's counts allow" in row][0]
    assert "| %d |" % len(recorded["rounds"]) in allowed
    assert report.own_cost_rows(recorded["rounds"], None) == []
