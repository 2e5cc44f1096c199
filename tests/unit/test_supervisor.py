"""The gang supervisor's decisions (roles/supervisor/files/gpulab_supervisor.py), on `docker inspect` documents recorded
from a lab node (tests/fixtures_record_docker.py) and GCS reads recorded from the 2- and 3-node lab."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import load_fixture

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("gpulab_supervisor", REPO / "roles" / "supervisor" / "files" / "gpulab_supervisor.py")
supervisor = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(supervisor)
# As on a node: the gate's rule from the collection's GCS reader, the file the role copies beside the program.
supervisor.load_reader((REPO / "plugins" / "module_utils" / "_gcs_reader.py").read_text())


def container(state: str) -> dict:
    return supervisor.container_state(load_fixture("docker", state)["inspect"])


def read(name: str) -> dict:
    return json.loads(load_fixture("ray", name)["reader_run"]["stdout"].strip().splitlines()[-1])


THREE = {"ips": ["10.220.0.11", "10.220.0.12", "10.220.0.13"], "nodes": 3, "gpus": 3.0}


@pytest.mark.parametrize("state, phrase", [
    ("killed", "killed (exit 137)"),
    ("stopped", "stopped (exit 143, SIGTERM)"),
    ("oom", "killed for memory (OOM)"),
    ("exited_1", "exited with code 1"),
    ("created", "created but never started"),
])
def test_why_a_container_stopped_is_named(state, phrase):
    found = container(state)
    assert not found["running"]
    assert supervisor.why_stopped(found).startswith(phrase)


def test_a_stopped_container_says_when():
    assert " at 20" in supervisor.why_stopped(container("killed"))
    assert supervisor.why_stopped(None) == "missing"
    assert container("running")["running"]


def test_the_gate_is_the_nodes_addresses_and_gpus_the_deploy_saw():
    assert supervisor.shortfalls(read("ray_3node_alive"), THREE) == []
    assert supervisor.shortfalls(read("ray_3node_one_dead"), THREE) == ["missing node(s) 10.220.0.13",
                                                                        "2 of 3 expected node(s) alive",
                                                                        "GPUs 2 of 3 expected"]
    assert supervisor.shortfalls(read("ray_3node_rejoined"), THREE) == []
    unread = supervisor.shortfalls(read("ray_gcs_unreachable"), THREE)
    assert len(unread) == 1 and "UNAVAILABLE" in unread[0]


def test_a_worker_listed_twice_keeps_the_server_waiting():
    # Its Ray restarted at once: the GCS lists the new node and the old one it has not declared dead yet.
    two = {"ips": ["10.220.0.11", "10.220.0.12"], "nodes": 2, "gpus": 2.0}
    document = read("ray_2node_listed_twice")
    assert supervisor.shortfalls(document, two) == ["node(s) 10.220.0.12 listed twice (an old Ray node not yet declared dead)"]
    actions, gang = supervisor.decide_head(container("running"), container("killed"), True, document, two, None)
    assert actions[0][:2] == ("wait", "gate") and gang is None


def test_a_node_that_left_or_rejoined_breaks_the_gang_the_server_started_with():
    gang = supervisor.members(read("ray_3node_alive"))
    assert sorted(gang) == THREE["ips"]
    assert supervisor.gang_broken(gang, read("ray_3node_alive")) == []
    assert supervisor.gang_broken(gang, read("ray_3node_one_dead")) == ["node 10.220.0.13 left the cluster"]
    # Back at the same address, but a new Ray node: the server's actors on the old one are gone.
    assert supervisor.gang_broken(gang, read("ray_3node_rejoined")) == [
        "node 10.220.0.13 rejoined as a new Ray node (its Ray restarted)"]
    # A cluster that could not be read is no evidence either way.
    assert supervisor.gang_broken(gang, read("ray_gcs_unreachable")) == []


def test_a_stopped_head_is_started_first_and_a_server_on_it_stopped():
    actions, gang = supervisor.decide_head(container("killed"), container("running"), True, None, THREE, None)
    assert [a[:2] for a in actions] == [("stop", "server"), ("start", "head")]
    assert actions[1][2].startswith("killed (exit 137)")
    assert gang is None


def test_the_server_starts_only_once_the_gate_passes():
    waiting, gang = supervisor.decide_head(container("running"), container("killed"), True, read("ray_3node_one_dead"), THREE, None)
    assert waiting == [("wait", "gate", "missing node(s) 10.220.0.13; 2 of 3 expected node(s) alive; GPUs 2 of 3 expected")] and gang is None
    starting, gang = supervisor.decide_head(container("running"), container("killed"), True, read("ray_3node_rejoined"), THREE, None)
    assert [a[:2] for a in starting] == [("start", "server")]
    assert "killed (exit 137)" in starting[0][2]
    assert gang == supervisor.members(read("ray_3node_rejoined"))


def test_a_running_server_is_adopted_on_a_whole_cluster_and_stopped_when_a_node_rejoins():
    actions, gang = supervisor.decide_head(container("running"), container("running"), True, read("ray_3node_alive"), THREE, None)
    assert [a[0] for a in actions] == ["adopt"]
    actions, kept = supervisor.decide_head(container("running"), container("running"), True, read("ray_3node_alive"), THREE, gang)
    assert actions == [] and kept == gang
    actions, gang = supervisor.decide_head(container("running"), container("running"), True, read("ray_3node_rejoined"), THREE, gang)
    assert actions == [("stop", "server", "node 10.220.0.13 rejoined as a new Ray node (its Ray restarted)")] and gang is None


def test_a_server_found_on_a_broken_cluster_is_stopped():
    actions, _gang = supervisor.decide_head(container("running"), container("running"), True, read("ray_3node_one_dead"), THREE, None)
    assert [a[:2] for a in actions] == [("stop", "server")]


def test_a_ray_only_head_only_keeps_the_head():
    assert supervisor.decide_head(container("running"), None, False, None, THREE, None) == ([], None)
    actions, _gang = supervisor.decide_head(container("oom"), None, False, None, THREE, None)
    assert actions == [("start", "head", supervisor.why_stopped(container("oom")))]


def test_a_worker_waits_for_the_head_then_starts():
    assert supervisor.decide_worker(container("killed"), False, None, "10.220.0.12", None, 30)[0][:2] == ("wait", "head")
    assert supervisor.decide_worker(container("killed"), True, None, "10.220.0.12", None, 30)[0][:2] == ("start", "worker")


def test_a_stopped_worker_starts_only_once_the_head_no_longer_lists_its_old_node():
    killed = container("killed")
    # Read right after the kill: the GCS still lists node2 alive (Ray has not declared it dead yet).
    still_listed = supervisor.decide_worker(killed, True, read("ray_2node_alive"), "10.220.0.12", None, 30, 3)
    assert still_listed[0][:2] == ("wait", "worker") and "10.220.0.12" in still_listed[0][2]
    # The same, read 6 s after a kill and a start: the old node and the new one, both listed.
    assert supervisor.decide_worker(killed, True, read("ray_2node_listed_twice"), "10.220.0.12", None, 30, 6)[0][:2] == \
        ("wait", "worker")
    # Declared dead (the head alone is alive): start.
    assert supervisor.decide_worker(killed, True, read("ray-2.53.0_2node_head_only"), "10.220.0.12", None, 30, 20)[0][:2] == \
        ("start", "worker")
    # Another node's old entry does not hold this one back.
    assert supervisor.decide_worker(killed, True, read("ray_2node_alive"), "10.220.0.13", None, 30, 3)[0][:2] == ("start", "worker")


def test_a_stopped_worker_that_cannot_read_the_gcs_waits_out_rays_health_checks():
    killed = container("killed")
    unreadable = read("ray_gcs_unreachable")
    assert unreadable.get("error")
    early = supervisor.decide_worker(killed, True, unreadable, "10.220.0.12", None, 30, 5)
    assert early[0][:2] == ("wait", "worker") and "could not be read" in early[0][2]
    assert supervisor.decide_worker(killed, True, None, "10.220.0.12", None, 30, 5)[0][:2] == ("wait", "worker")
    late = supervisor.OLD_NODE_GRACE + 1
    assert supervisor.decide_worker(killed, True, unreadable, "10.220.0.12", None, 30, late)[0][:2] == ("start", "worker")
    assert supervisor.decide_worker(killed, True, None, "10.220.0.12", None, 30, late)[0][:2] == ("start", "worker")


def test_a_worker_the_heads_cluster_does_not_list_is_restarted_after_its_grace():
    head_only = read("ray-2.53.0_2node_head_only")
    assert supervisor.decide_worker(container("running"), True, head_only, "10.220.0.12", 10, 30) == []
    assert supervisor.decide_worker(container("running"), True, head_only, "10.220.0.12", 31, 30)[0][:2] == ("restart", "worker")
    assert supervisor.decide_worker(container("running"), True, read("ray_2node_alive"), "10.220.0.12", 31, 30) == []
    assert supervisor.decide_worker(container("running"), True, read("ray_gcs_unreachable"), "10.220.0.12", 31, 30) == []


def test_a_container_that_keeps_stopping_waits_longer_each_time():
    now = 10_000.0
    assert supervisor.backoff_left([], now, 5, 300) == 0
    assert supervisor.backoff_left([now - 4], now, 5, 300) == pytest.approx(6)
    assert supervisor.backoff_left([now - 30, now - 4], now, 5, 300) == pytest.approx(16)
    assert supervisor.backoff_left([now - 60 * i for i in range(1, 10)], now, 5, 300) == pytest.approx(240)
    assert supervisor.backoff_left([now - supervisor.BACKOFF_WINDOW - 1], now, 5, 300) == 0


def test_a_hold_lasts_until_its_end():
    assert supervisor.hold_active("1000\n", 999.0)
    assert not supervisor.hold_active("1000\n", 1001.0)
    assert not supervisor.hold_active("", 1.0)
    assert not supervisor.hold_active("tomorrow", 1.0)


def completion_exchange(name: str) -> dict:
    """The recorded POST /v1/completions of a vLLM fixture (tests/fixtures_record.py vllm ...)."""
    return next(x for x in load_fixture("vllm", name)["exchanges"] if x["url"].endswith("/v1/completions"))


@pytest.mark.parametrize("name, ok, reason", [
    ("vllm_healthy", True, "answered"),
    # A dead engine behind a live API process: /health may still say 200 (0.17.1) or 503 (0.32), the generation fails.
    ("vllm_dead_engine", False, "HTTP 500: EngineCore encountered an issue. See stack trace (above) for the root cause."),
    ("vllm-0.17.1_engine_killed", False, "HTTP 500: EngineCore encountered an issue. See stack trace (above) for the root cause."),
    ("vllm_starting_unreachable", False, "no answer: ConnectionRefusedError: [Errno 111] Connection refused"),
])
def test_the_watchdog_judges_a_real_generation(name, ok, reason):
    exchange = completion_exchange(name)
    assert supervisor.judge_generation(exchange["status"], exchange["body"], exchange["error"]) == (ok, reason)


def test_the_watchdog_restarts_after_failures_in_a_row_once_the_server_answered_or_had_its_grace():
    assert not supervisor.watchdog_due(2, 3, True, 5000, 1800)
    assert supervisor.watchdog_due(3, 3, True, 10, 1800)
    # A model still loading is not restarted: it never answered and its grace is not over.
    assert not supervisor.watchdog_due(5, 3, False, 600, 1800)
    assert supervisor.watchdog_due(5, 3, False, 1801, 1800)


def test_a_serving_server_is_never_stopped_on_a_read_that_failed():
    gang = supervisor.members(read("ray_3node_alive"))
    for document in (None, read("ray_gcs_unreachable")):
        assert supervisor.decide_head(container("running"), container("running"), True, document, THREE, gang) == ([], gang)
        assert supervisor.decide_head(container("running"), container("running"), True, document, THREE, None) == ([], None)


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_the_firewall_is_in_place_only_as_the_fabric_role_wrote_it(family):
    recorded = load_fixture("firewall", family)["listings"]
    wanted = [line for line in recorded["applied"].splitlines() if line.startswith("-A GPULAB-INPUT ")]
    assert supervisor.firewall_in_place(recorded["applied"], wanted)
    # An ACCEPT put ahead of the jump, a rule missing from the chain, or nothing at all (after a reboot).
    assert not supervisor.firewall_in_place(recorded["drifted"], wanted)
    assert not supervisor.firewall_in_place(recorded["applied"], wanted[:-1])
    assert not supervisor.firewall_in_place("-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n", wanted)


def test_the_restore_writes_the_chain_whole_and_one_jump_first():
    recorded = load_fixture("firewall", "ipv4")["listings"]
    wanted = [line for line in recorded["applied"].splitlines() if line.startswith("-A GPULAB-INPUT ")]
    text = supervisor.firewall_restore_text(wanted, recorded["drifted"]).splitlines()
    assert text[:3] == ["*filter", ":GPULAB-INPUT - [0:0]", '-D INPUT -m comment --comment "gpulab: default deny" -j GPULAB-INPUT']
    assert text[3:-2] == wanted
    assert text[-2:] == ['-I INPUT 1 -m comment --comment "gpulab: default deny" -j GPULAB-INPUT', "COMMIT"]
    # The operator's own rule ahead of the jump stays; only the jump moves first.
    assert not any("-i eth0" in line for line in text)


def test_the_gate_waits_for_a_raylet_that_no_longer_answers():
    document = read("ray_3node_alive")
    # What the supervisor's TCP check found: node3's raylet gone while the GCS still lists it alive.
    silent = ["10.220.0.13:6382"]
    assert supervisor.shortfalls(document, THREE, silent) == [
        "raylet(s) at 10.220.0.13:6382 do not answer (gone; Ray has not declared them dead yet)"]
    actions, gang = supervisor.decide_head(container("running"), container("killed"), True, document, THREE, None, silent)
    assert actions[0][:2] == ("wait", "gate") and gang is None


def test_the_server_waits_for_a_whole_cluster_to_hold_steady():
    actions, gang = supervisor.decide_head(container("running"), container("killed"), True, read("ray_3node_rejoined"), THREE,
                                           None, (), False)
    assert actions == [("wait", "gate", "the cluster looks whole; waiting for it to hold steady")] and gang is None


def test_the_firewall_is_checked_on_its_own_at_its_interval():
    """While everything runs, the rules are looked at every firewall_interval seconds (a reload puts nothing back
    by itself); 0 leaves it to the check before each start."""
    assert supervisor.firewall_due(None, 1000.0, 30)
    assert not supervisor.firewall_due(990.0, 1000.0, 30)
    assert supervisor.firewall_due(970.0, 1000.0, 30)
    assert not supervisor.firewall_due(None, 1000.0, 0)
