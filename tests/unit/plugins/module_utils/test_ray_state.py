"""_ray_state on GCS reads recorded from the 2- and 3-node lab (tests/fixtures_record.py ray ...)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import fixture_names, load_fixture
from ansible_collections.gpulab.vllm.plugins.module_utils import _gcs_reader, _ray_state

WHERE = "container fixture-ray-head on host node1"
READ_OK = [name for name in fixture_names("ray") if load_fixture("ray", name)["reader_run"]["rc"] == 0
           and json.loads(load_fixture("ray", name)["reader_run"]["stdout"])["error"] is None]


def snapshot_of(name):
    run = load_fixture("ray", name)["reader_run"]
    return _ray_state.interpret_reader_run(run["rc"], run["stdout"], run["stderr"], WHERE)


def facts_of(name, expected_node_ips=None):
    return _ray_state.build_facts(snapshot_of(name), expected_node_ips)


def ray_status_counts(text):
    """Active node count and total GPUs as `ray status` printed them beside the read."""
    active = re.search(r"Active:\n(.*?)\nPending:", text, re.S).group(1)
    alive = len(re.findall(r"^\s*1 node_[0-9a-f]+$", active, re.M))
    gpus = float(re.search(r"[\d.]+/([\d.]+) GPU", text).group(1))
    return alive, gpus


def test_fixtures_cover_the_situations_of_the_issue():
    # 2- and 3-node reads, one with a dead node, and the error cases.
    assert {"ray_2node_alive", "ray_2node_head_only", "ray_3node_alive", "ray_3node_one_dead"} <= set(READ_OK)
    assert {"ray_head_container_missing", "ray_head_starting_no_address", "ray_gcs_unreachable",
            "ray_auth_token_missing"} <= set(fixture_names("ray"))


# `ray status` prints totals from the autoscaler monitor's last report (every few
# seconds), its node list from the GCS. Recorded one second after the stop, this
# one still shows the stopped worker's GPU in the totals; the GCS read does not.
RAY_STATUS_TOTALS_LAG = {"ray_3node_worker_stopped": 3.0}


@pytest.mark.parametrize("name", [n for n in READ_OK if load_fixture("ray", n)["ray_status_run"]])
def test_alive_nodes_and_gpus_agree_with_ray_status(name):
    record = load_fixture("ray", name)
    alive, gpus = ray_status_counts(record["ray_status_run"]["stdout"])
    facts = facts_of(name)
    assert facts["alive_nodes"] == alive, record["situation"]
    assert gpus == RAY_STATUS_TOTALS_LAG.get(name, facts["gpus"]), record["situation"]


def test_two_node_lab_is_ready_for_both_fabric_addresses():
    facts = facts_of("ray_2node_alive", ["10.220.0.11", "10.220.0.12"])
    assert facts["ray_version"] == "2.60.0"
    assert facts["gcs_address"] == "10.220.0.11:6380"
    assert [(n["node_ip"], n["is_head"], n["alive"]) for n in facts["nodes"]] == [
        ("10.220.0.11", True, True), ("10.220.0.12", False, True)]
    assert facts["missing_node_ips"] == [] and facts["unexpected_node_ips"] == []
    assert facts["total_resources"]["CPU"] == 4.0 and facts["gpus"] == 2.0
    assert _ray_state.unmet_conditions(facts, ["10.220.0.11", "10.220.0.12"], 2, 2.0) == []


def test_node_markers_are_not_reported_as_resources():
    raw = snapshot_of("ray_2node_alive")["nodes"]
    assert any(key.startswith("node:") for node in raw for key in node["resources"])
    facts = facts_of("ray_2node_alive")
    for node in facts["nodes"]:
        assert set(node["resources"]) == {"CPU", "GPU", "memory", "object_store_memory"}
    assert not any(key.startswith("node:") for key in facts["total_resources"])


def test_head_only_names_the_missing_worker_and_the_gpu_shortfall():
    expected = ["10.220.0.11", "10.220.0.12"]
    facts = _ray_state.build_facts(snapshot_of("ray_2node_head_only"), expected, waited=True, elapsed=60.04, polls=41)
    unmet = _ray_state.unmet_conditions(facts, expected, None, 2)
    assert unmet == ["missing node(s) 10.220.0.12", "GPUs 1 of 2 expected"]
    message = _ray_state.not_ready_message(facts, unmet, WHERE)
    assert message == (
        "Ray cluster at 10.220.0.11:6380 (container fixture-ray-head on host node1) not ready after 60s (41 polls): "
        "missing node(s) 10.220.0.12; GPUs 1 of 2 expected; alive: 10.220.0.11 (head, GPU 1)")
    assert "\n" not in message


def test_expected_node_count_alone_is_a_condition():
    facts = facts_of("ray_2node_head_only")
    assert _ray_state.unmet_conditions(facts, expected_nodes=2) == ["1 of 2 expected node(s) alive"]
    assert _ray_state.unmet_conditions(facts, expected_nodes=1) == []


def test_unexpected_node_is_reported():
    facts = facts_of("ray_2node_alive", ["10.220.0.11"])
    assert facts["unexpected_node_ips"] == ["10.220.0.12"]
    assert facts_of("ray_2node_alive")["unexpected_node_ips"] == []


def test_killed_worker_is_dead_with_rays_reason():
    expected = ["10.220.0.11", "10.220.0.12", "10.220.0.13"]
    facts = facts_of("ray_3node_one_dead", expected)
    assert (facts["alive_nodes"], facts["dead_nodes"], facts["gpus"]) == (2, 1, 2.0)
    assert facts["missing_node_ips"] == ["10.220.0.13"]
    dead = [n for n in facts["nodes"] if not n["alive"]]
    assert [(n["node_ip"], n["state"]) for n in dead] == [("10.220.0.13", "DEAD")]
    assert facts["failures"] == [{
        "source": "gcs",
        "node_id": dead[0]["node_id"],
        "node_ip": "10.220.0.13",
        "reason": "UNEXPECTED_TERMINATION",
        "message": "health check failed due to missing too many heartbeats",
    }]
    message = _ray_state.not_ready_message(facts, _ray_state.unmet_conditions(facts, expected, None, 3), WHERE)
    assert "missing node(s) 10.220.0.13" in message
    assert "GPUs 2 of 3 expected" in message
    assert message.endswith("dead: 10.220.0.13 (UNEXPECTED_TERMINATION)")


def test_rejoined_worker_counts_as_present_and_its_old_death_is_not_news():
    expected = ["10.220.0.11", "10.220.0.12", "10.220.0.13"]
    facts = facts_of("ray_3node_rejoined", expected)
    assert (facts["alive_nodes"], facts["dead_nodes"]) == (3, 1)
    assert facts["missing_node_ips"] == []
    assert [f["node_ip"] for f in facts["failures"]] == ["10.220.0.13"]
    assert _ray_state.unmet_conditions(facts, expected, 3, 3) == []
    # Alive first: the dead entry of the same address sorts last.
    assert [n["alive"] for n in facts["nodes"]] == [True, True, True, False]
    message = _ray_state.not_ready_message(facts, ["GPUs 3 of 4 expected"], WHERE)
    assert "dead:" not in message


def test_gracefully_stopped_worker_is_dead_too():
    facts = facts_of("ray_3node_worker_stopped", ["10.220.0.11", "10.220.0.12", "10.220.0.13"])
    assert facts["missing_node_ips"] == ["10.220.0.12"]
    reasons = dict((f["node_ip"], f["reason"]) for f in facts["failures"])
    assert reasons["10.220.0.12"] == "AUTOSCALER_DRAIN_PREEMPTED"


def test_no_pending_nodes_in_a_cluster_made_by_ray_start():
    for name in READ_OK:
        assert facts_of(name)["pending_nodes"] == 0, name


def test_pending_nodes_come_from_the_autoscaler_report():
    # The lab has no autoscaler launches, so this one is the recorded report with
    # one launch and one pending node added, in the shape Ray's monitor writes them.
    snapshot = copy.deepcopy(snapshot_of("ray_2node_alive"))
    report = snapshot["autoscaler_status"]["autoscaler_report"]
    assert report["pending_nodes"] == [] and report["pending_launches"] == {}
    report["pending_launches"] = {"gpu_worker": 1}
    report["pending_nodes"] = [["10.220.0.14", "gpu_worker", "setting-up"]]
    report["failed_nodes"] = [["10.220.0.15", "gpu_worker"]]
    facts = _ray_state.build_facts(snapshot)
    assert facts["pending_nodes"] == 2
    assert _ray_state.unmet_conditions(facts) == ["2 node(s) pending"]
    assert facts["failures"][-1]["source"] == "autoscaler"
    assert facts["failures"][-1]["node_ip"] == "10.220.0.15"


@pytest.mark.parametrize("name, kind, words", [
    ("ray_head_container_missing", "container_missing", "No such container: fixture-ray-head"),
    ("ray_head_starting_no_address", "no_address", "/tmp/ray/ray_current_cluster"),
    ("ray_gcs_unreachable", "gcs_unreachable", "10.220.0.11:6399"),
    ("ray_head_container_stopped", "container_not_running", "is not running"),
])
def test_read_errors_are_clear_and_transient(name, kind, words):
    run = load_fixture("ray", name)["reader_run"]
    with pytest.raises(_ray_state.ReaderError) as caught:
        _ray_state.interpret_reader_run(run["rc"], run["stdout"], run["stderr"], WHERE)
    assert caught.value.kind == kind
    assert caught.value.transient
    assert caught.value.message.startswith(WHERE + ": ")
    assert words in caught.value.message


def test_docker_errors_without_a_recording_are_still_classified():
    # Messages of docker 20.10 for situations the lab did not produce.
    cases = {
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?":
            "docker_unreachable",
        'OCI runtime exec failed: exec failed: unable to start container process: exec: "python3": '
        'executable file not found in $PATH: unknown': "python_missing",
    }
    for stderr, kind in cases.items():
        with pytest.raises(_ray_state.ReaderError) as caught:
            _ray_state.interpret_reader_run(1, "", stderr, WHERE)
        assert caught.value.kind == kind, stderr
    with pytest.raises(_ray_state.ReaderError) as caught:
        _ray_state.interpret_reader_run(0, "Traceback (most recent call last):\n", "", WHERE)
    assert caught.value.kind == "reader_failed" and not caught.value.transient


def test_reader_argv_is_a_list_for_docker_exec():
    argv = _ray_state.reader_argv("python3", "auto", 5.0, docker_cli="/usr/bin/docker", container="ray-head")
    assert argv[:6] == ["/usr/bin/docker", "exec", "ray-head", "python3", "-c", _gcs_reader.source()]
    # The program it runs is the reader module's own file, as shipped.
    assert _gcs_reader.source() == Path(_gcs_reader.__file__).read_text()
    assert argv[6:] == ["auto", "5"]
    assert _ray_state.reader_argv("/usr/bin/python3", "10.0.0.1:6379", 0.25)[3:] == ["10.0.0.1:6379", "0.25"]


@pytest.mark.parametrize("how", ["-c", "file"])
def test_reader_script_reports_a_missing_ray_as_json(how):
    # The unit-test interpreter has no ray: the reader must say so, not crash.
    program = ["-c", _gcs_reader.source()] if how == "-c" else [_gcs_reader.__file__]
    done = subprocess.run([sys.executable, *program, "auto", "1"],
                          capture_output=True, text=True, timeout=30, check=False)
    with pytest.raises(_ray_state.ReaderError) as caught:
        _ray_state.interpret_reader_run(done.returncode, done.stdout, done.stderr, "host test")
    assert caught.value.kind == "ray_missing"
    assert "cannot import ray" in caught.value.message


@pytest.mark.parametrize("name, until, phrases", [
    ("ray_2node_alive", {"ips": ["10.220.0.11", "10.220.0.12"], "nodes": 2, "gpus": 2}, []),
    ("ray_2node_head_only", {"ips": ["10.220.0.11", "10.220.0.12"], "nodes": 2, "gpus": 2},
     ["missing node(s) 10.220.0.12", "1 of 2 expected node(s) alive", "GPUs 1 of 2 expected"]),
    ("ray_3node_one_dead", {"nodes": 3}, ["2 of 3 expected node(s) alive"]),
    ("ray-2.53.0_2node_alive", {"ips": ["10.220.0.11", "10.220.0.12"], "nodes": 2, "gpus": 2}, []),
    ("ray-2.53.0_2node_head_only", {"ips": ["10.220.0.11", "10.220.0.12"], "nodes": 2, "gpus": 2},
     ["missing node(s) 10.220.0.12", "1 of 2 expected node(s) alive", "GPUs 1 of 2 expected"]),
    # A worker restarted at once: three alive nodes and three GPUs, but one address twice.
    ("ray_2node_listed_twice", {"ips": ["10.220.0.11", "10.220.0.12"], "nodes": 2, "gpus": 2},
     ["node(s) 10.220.0.12 listed twice (an old Ray node not yet declared dead)"]),
    # A worker about to start again waits for its address to leave the alive nodes.
    ("ray_2node_alive", {"absent": ["10.220.0.12"]},
     ["node(s) 10.220.0.12 still listed alive (an old Ray node not yet declared dead)"]),
    ("ray_3node_one_dead", {"absent": ["10.220.0.13"]}, []),
    ("ray_3node_rejoined", {"absent": ["10.220.0.13"]},
     ["node(s) 10.220.0.13 still listed alive (an old Ray node not yet declared dead)"]),
])
def test_one_readiness_rule_for_the_reader_and_the_facts(name, until, phrases):
    """The reader's wait and the facts module judge a recorded reading by the same rule, in the same words."""
    snapshot = json.loads(load_fixture("ray", name)["reader_run"]["stdout"].splitlines()[-1])
    alive = _gcs_reader.alive_nodes(snapshot["nodes"])
    assert _gcs_reader.shortfalls(alive, _gcs_reader.pending_count(snapshot.get("autoscaler_status")), until) == phrases
    facts = _ray_state.build_facts(snapshot, until.get("ips"))
    assert _ray_state.unmet_conditions(facts, until.get("ips"), until.get("nodes"), until.get("gpus"),
                                       until.get("absent")) == phrases


@pytest.mark.parametrize("situation", ["2node_alive", "2node_head_only"])
def test_ray_2_53_and_2_60_read_alike(situation):
    """The GCS reader loads Ray's own generated protocol modules: the same situation recorded on
    Ray 2.53.0 (the seed's image) and 2.60.0 gives the same facts but for the version, the node IDs and
    the memory each node had free when it started."""
    old, new = facts_of("ray-2.53.0_" + situation), facts_of("ray_" + situation)
    assert (old["ray_version"], new["ray_version"]) == ("2.53.0", "2.60.0")

    def counted(resources):
        return {k: v for k, v in resources.items() if k not in ("memory", "object_store_memory")}

    def comparable(facts):
        nodes = [dict({k: v for k, v in node.items() if k != "node_id"}, resources=counted(node["resources"]))
                 for node in facts["nodes"]]
        return dict({k: v for k, v in facts.items() if k != "ray_version"}, nodes=nodes,
                    total_resources=counted(facts["total_resources"]))

    assert comparable(old) == comparable(new)


def test_empty_facts_have_the_full_shape():
    facts = _ray_state.empty_facts(None, ["10.220.0.11"], waited=True, elapsed=2.0, polls=5)
    assert set(facts) == set(facts_of("ray_2node_alive"))
    assert facts["missing_node_ips"] == ["10.220.0.11"]
    assert facts["wait"] == {"waited": True, "elapsed": 2.0, "polls": 5}


def test_token_authenticated_head_is_read_with_the_containers_token():
    facts = facts_of("ray_auth_token_head", ["10.220.0.11"])
    assert (facts["alive_nodes"], facts["gpus"], facts["missing_node_ips"]) == (1, 1.0, [])


@pytest.mark.parametrize("name", ["ray_auth_token_missing", "ray_auth_token_wrong"])
def test_missing_or_wrong_token_is_a_permanent_auth_error(name):
    run = load_fixture("ray", name)["reader_run"]
    with pytest.raises(_ray_state.ReaderError) as caught:
        _ray_state.interpret_reader_run(run["rc"], run["stdout"], run["stderr"], WHERE)
    assert caught.value.kind == "auth" and not caught.value.transient
    assert caught.value.message == (
        WHERE + ": GCS at 10.220.0.11:6380 answered UNAUTHENTICATED: InvalidAuthToken: "
        "Authentication token is missing or incorrect")


def test_the_head_knocks_on_each_raylet_and_a_refusal_only_waits():
    """knock_raylets on loopback, real sockets: a listening raylet answers; a closed port refuses, which is a raylet
    Ray is about to declare dead, so it is a shortfall but never blocks, however long it lasts."""
    import socket  # noqa: PLC0415

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(4)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        alive = [{"node_id": "a", "node_ip": "127.0.0.1", "node_manager_port": listening.getsockname()[1], "resources": {}},
                 {"node_id": "b", "node_ip": "127.0.0.1", "node_manager_port": closed_port, "resources": {}}]
        silent_since = {}
        # A grace of 0.001 s: a silence that blocks would block at once.
        assert _gcs_reader.knock_raylets(alive, silent_since, 0.001) == []
        assert alive[0]["raylet_error"] is None
        assert alive[1]["raylet_error"] == "Connection refused" and silent_since == {}
        assert _gcs_reader.shortfalls(alive[1:], 0, {}) == [
            "raylet(s) at 127.0.0.1:%d (Connection refused) do not answer from the head" % closed_port]
    finally:
        listening.close()


def test_a_raylet_the_head_cannot_reach_ends_the_wait_naming_it():
    """Recorded on the lab: node2 alive in the GCS, the head's packets to its Ray ports dropped; the reader, waiting as
    the gate does with raylet_grace 3, ended blocked. The facts and the message name the node and its raylet."""
    snapshot = snapshot_of("ray_2node_raylet_blocked")
    assert snapshot["ready"] is False and len(snapshot["blocked"]) == 1
    facts = _ray_state.build_facts(snapshot, ["10.220.0.11", "10.220.0.12"])
    [raylet] = facts["unreachable_raylets"]
    assert raylet["node_ip"] == "10.220.0.12" and raylet["blocked"] and raylet["error"] == "timed out"
    assert raylet["address"] == "10.220.0.12:6381" and raylet["silent_s"] >= 3
    assert _ray_state.unmet_conditions(facts, ["10.220.0.11", "10.220.0.12"], 2, 2) == [
        "raylet(s) at 10.220.0.12:6381 (timed out) do not answer from the head"]
    message = _ray_state.blocked_message(facts, WHERE)
    assert ": 10.220.0.12 joined, but the head cannot reach its raylet (10.220.0.12:6381 timed out for" in message
    named = _ray_state.blocked_message(facts, WHERE, {"10.220.0.12": "node2", "10.220.0.11": "node1"})
    assert ": node2 (10.220.0.12) joined, but the head cannot reach its raylet (10.220.0.12:6381 timed out for" in named
    assert named.endswith("let the head reach each such node's Ray ports on the fabric (its raylet's, and its object "
                          "manager's beside it)")
    # The same document, read without the knock (as every fixture before it): nothing is unreachable.
    plain = _ray_state.build_facts(snapshot_of("ray_2node_alive"), ["10.220.0.11", "10.220.0.12"])
    assert plain["unreachable_raylets"] == [] and not _ray_state.unmet_conditions(plain, ["10.220.0.11", "10.220.0.12"], 2, 2)
