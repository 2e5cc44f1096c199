"""The modules end to end in-process: arguments in, exit or fail JSON out, on recorded lab data."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from ansible.module_utils import basic

try:  # ansible-core 2.19 and later
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core 2.17 and 2.18 read the arguments from basic._ANSIBLE_ARGS
    import contextlib

    @contextlib.contextmanager
    def patch_module_args(args):
        with mock.patch.object(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()):
            yield

from conftest import FIXTURES, load_fixture
from platform_replay import RECORD, REFS, replay
from vllm_replay import ReplayServer, closed_loopback_port
from ansible_collections.gpulab.vllm.plugins.module_utils import _node, _wait
from ansible_collections.gpulab.vllm.plugins.modules import node_facts, ray_cluster_facts, vllm_health


def run_main(module, args, capsys):
    with patch_module_args(args), pytest.raises(SystemExit) as exited:
        module.main()
    result = json.loads(capsys.readouterr().out)
    result["_rc"] = exited.value.code
    return result


def replay_reader(*names):
    """A run_command that answers each call with the next recorded reader run."""
    runs = [load_fixture("ray", name)["reader_run"] for name in names]
    calls = []

    def run_command(self, argv, **kwargs):
        calls.append(argv)
        run = runs[min(len(calls) - 1, len(runs) - 1)]
        return run["rc"], run["stdout"], run["stderr"]

    return run_command, calls


@pytest.fixture()
def docker_found():
    with mock.patch.object(basic.AnsibleModule, "get_bin_path", return_value="/usr/bin/docker"), \
            mock.patch("socket.gethostname", return_value="node1"):
        yield


def test_ray_facts_module_returns_only_facts(capsys, docker_found):
    run_command, calls = replay_reader("ray_2node_alive")
    with mock.patch.object(basic.AnsibleModule, "run_command", run_command):
        result = run_main(ray_cluster_facts, {"container": "fixture-ray-head"}, capsys)
    assert result["_rc"] == 0
    assert set(result) - {"invocation", "_rc"} == {"changed", "ansible_facts"}
    assert result["ansible_facts"]["ray_cluster"]["alive_nodes"] == 2
    assert calls[0][:4] == ["/usr/bin/docker", "exec", "fixture-ray-head", "python3"]


class StoppedTime(object):
    """The wait loop's clock, moving only when the loop sleeps: the polls a wait makes are exact, whatever the
    machine's load (CI runs them at nice 19 beside the lab, where one poll once took 20 s)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.now += seconds


@pytest.fixture
def loop_clock():
    clock = StoppedTime()
    with mock.patch.object(_wait, "time", clock):
        yield clock


def test_ray_gate_keeps_polling_through_a_starting_head(capsys, docker_found):
    # Missing container, then no address yet, then the head alone, then both nodes: all recorded.
    run_command, calls = replay_reader("ray_head_container_missing", "ray_head_starting_no_address",
                                       "ray_2node_head_only", "ray_2node_alive")
    with mock.patch.object(basic.AnsibleModule, "run_command", run_command):
        result = run_main(ray_cluster_facts, {
            "container": "fixture-ray-head", "expected_node_ips": ["10.220.0.11", "10.220.0.12"],
            "expected_gpus": 2, "wait": True, "wait_timeout": 30, "wait_sleep": 0.01}, capsys)
    assert result["_rc"] == 0, result.get("msg")
    assert result["ansible_facts"]["ray_cluster"]["wait"]["polls"] == 4 == len(calls)
    assert result["ansible_facts"]["ray_cluster"]["wait"]["waited"] is True


def test_ray_gate_timeout_fails_with_the_facts(capsys, docker_found, loop_clock):
    run_command, calls = replay_reader("ray_2node_head_only")
    with mock.patch.object(basic.AnsibleModule, "run_command", run_command):
        result = run_main(ray_cluster_facts, {
            "container": "fixture-ray-head", "expected_node_ips": ["10.220.0.11", "10.220.0.12"],
            "expected_gpus": 2, "wait": True, "wait_timeout": 1, "wait_sleep": 0.25}, capsys)
    assert result["_rc"] == 1 and result["failed"]
    assert result["msg"].startswith(
        "Ray cluster at 10.220.0.11:6380 (container fixture-ray-head on host node1) not ready after 1s (5 polls): ")
    assert result["msg"].endswith("missing node(s) 10.220.0.12; GPUs 1 of 2 expected; alive: 10.220.0.11 (head, GPU 1)")
    assert result["ansible_facts"]["ray_cluster"]["missing_node_ips"] == ["10.220.0.12"]
    assert len(calls) == 5 == result["ansible_facts"]["ray_cluster"]["wait"]["polls"]


def test_ray_permanent_error_does_not_wait(capsys, docker_found):
    with mock.patch.object(basic.AnsibleModule, "run_command", return_value=(0, json.dumps({
            "reader": 1, "error": {"kind": "auth", "message": "GCS at 10.220.0.11:6379 answered UNAUTHENTICATED: x"}}),
            "")):
        result = run_main(ray_cluster_facts, {"container": "h", "wait": True, "wait_timeout": 60}, capsys)
    assert result["msg"] == ("Cannot read the Ray cluster (auth): container h on host node1: "
                             "GCS at 10.220.0.11:6379 answered UNAUTHENTICATED: x")
    assert result["ansible_facts"]["ray_cluster"]["wait"]["polls"] == 1


def test_vllm_module_healthy_over_loopback(capsys):
    with ReplayServer(load_fixture("vllm", "vllm_healthy")) as server:
        result = run_main(vllm_health, {"base_url": server.base_url, "model": "tiny", "api_key": "k-123"}, capsys)
    assert result["_rc"] == 0 and result["healthy"] is True
    assert result["served_models"] == ["tiny"] and result["vllm_version"] == "0.32.0"
    assert result["generated_text"] and result["waited"]["polls"] == 1
    assert "k-123" not in json.dumps(result)


def test_vllm_module_adds_a_new_image_to_the_proven_list_once_it_answers(capsys, tmp_path):
    proven = tmp_path / "gpulab-vllm" / "proven_images"
    args = {"base_url": None, "model": "tiny", "image_id": "sha256:new", "proven_images_file": str(proven)}
    with ReplayServer(load_fixture("vllm", "vllm_healthy")) as server:
        args["base_url"] = server.base_url
        first = run_main(vllm_health, args, capsys)
        again = run_main(vllm_health, args, capsys)
    assert (first["first_start"], first["recorded_image"], first["changed"]) == (True, True, True)
    assert (again["first_start"], again["recorded_image"], again["changed"]) == (False, False, False)
    assert oct(proven.stat().st_mode & 0o777) == "0o644"
    assert [line for line in proven.read_text().splitlines() if not line.startswith("#")] == ["sha256:new"]


def test_vllm_module_in_check_mode_or_unhealthy_writes_no_list(capsys, tmp_path):
    proven = tmp_path / "proven_images"
    proven.write_text("sha256:old\n")
    with ReplayServer(load_fixture("vllm", "vllm_healthy")) as server:
        checked = run_main(vllm_health, {"base_url": server.base_url, "model": "tiny", "image_id": "sha256:new",
                                         "proven_images_file": str(proven), "_ansible_check_mode": True}, capsys)
    with ReplayServer(load_fixture("vllm", "vllm_dead_engine")) as server:
        dead = run_main(vllm_health, {"base_url": server.base_url, "model": "tiny", "image_id": "sha256:new",
                                      "proven_images_file": str(proven)}, capsys)
    assert (checked["_rc"], checked["first_start"], checked["changed"]) == (0, True, False)
    assert (dead["_rc"], dead["first_start"], dead["recorded_image"]) == (1, True, False)
    assert proven.read_text() == "sha256:old\n"


def test_vllm_module_without_an_image_knows_no_first_start(capsys, tmp_path):
    with ReplayServer(load_fixture("vllm", "vllm_healthy")) as server:
        result = run_main(vllm_health, {"base_url": server.base_url, "model": "tiny",
                                        "proven_images_file": str(tmp_path / "proven_images")}, capsys)
    assert (result["first_start"], result["changed"]) == (None, False)
    assert not (tmp_path / "proven_images").exists()


def test_vllm_module_dead_engine_fails_in_one_line(capsys):
    with ReplayServer(load_fixture("vllm", "vllm_dead_engine")) as server:
        result = run_main(vllm_health, {"base_url": server.base_url, "model": "tiny"}, capsys)
    assert result["_rc"] == 1 and result["failed_stage"] == "unhealthy"
    assert result["msg"].startswith("vLLM at %s: stage unhealthy: GET %s/health answered HTTP 503; then POST "
                                    % (server.base_url, server.base_url))
    assert result["msg"].endswith("EngineCore encountered an issue. See stack trace (above) for the root cause.")


def test_vllm_module_waits_then_times_out_on_a_closed_port(capsys, loop_clock):
    url = "http://127.0.0.1:%d" % closed_loopback_port()
    result = run_main(vllm_health, {"base_url": url, "wait": True, "wait_timeout": 3, "wait_sleep": 0.25}, capsys)
    assert result["failed_stage"] == "unreachable"
    # A refused connection is polled again every 0.25 s until the deadline: at 0, 0.25, ... 3.0 s.
    assert result["msg"].startswith("vLLM at %s not healthy after 3.0s (13 polls): stage unreachable: GET %s/health "
                                    "got no answer: ConnectionRefusedError" % (url, url))
    assert result["waited"]["polls"] == 13 and result["waited"]["elapsed"] == 3.0


@pytest.mark.parametrize("args, message", [
    ({"base_url": "10.210.0.11:8000"}, "base_url must start with http:// or https://, got '10.210.0.11:8000'"),
    ({"base_url": "http://x", "wait_sleep": 0}, "wait_sleep must be greater than 0, got 0.0"),
    ({"base_url": "http://x", "max_tokens": 0}, "max_tokens must be at least 1, got 0"),
])
def test_vllm_module_refuses_bad_options(capsys, args, message):
    assert run_main(vllm_health, args, capsys)["msg"] == message


@pytest.fixture()
def node_without_deployment(monkeypatch):
    """node_facts on a node: the lab's node1 with nothing deployed (its containers and addresses, recorded), and
    the Docker daemon recorded by tests/fixtures_record_platforms.py for the platform and the images, its
    registry with basic authentication. Yields the requests the module sent to the daemon."""
    lab = load_fixture("node", "node1_nothing_deployed")
    docker_get, calls = replay(auth=RECORD["auth"])
    lab_answers = dict((item["path"], item) for item in [lab["docker"]["listing"]] + list(lab["docker"]["inspect"].values()))

    def answer(docker_host, path, timeout, headers=None):
        if path.startswith("/containers/"):
            return lab_answers[path]["status"], lab_answers[path]["body"]
        return docker_get(RECORD["docker_host"], path, timeout, headers)

    def run_command(self, argv, **kwargs):
        # A credential helper stand-in (docker-credential-archprobe get) for the recorded registry's user.
        if argv[0].endswith("/docker-credential-archprobe"):
            assert argv[1:] == ["get"] and kwargs["data"] == RECORD["registry"]
            return 0, json.dumps({"ServerURL": kwargs["data"], "Username": "archprobe", "Secret": "archprobe-not-a-secret"}), ""
        # A GB10's answer (tests/unit/fixtures/memory/, written by hand from published output), for a test that gives
        # the node an nvidia-smi.
        if argv[0].endswith("/nvidia-smi"):
            assert argv[1:] == ["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
            return 0, (FIXTURES / "memory" / "gb10_query_gpu.csv").read_text(), ""
        assert argv[0].endswith("/ip"), argv
        return 0, lab["ip_address"]["stdout"], ""

    monkeypatch.setattr(_node, "docker_get", answer)
    # The lab's nodes have no nvidia-smi.
    with mock.patch.object(basic.AnsibleModule, "get_bin_path", side_effect=lambda name, *a, **k: None if name == "nvidia-smi" else "/usr/sbin/" + name), \
            mock.patch.object(basic.AnsibleModule, "run_command", run_command):
        yield calls


def test_node_facts_reads_the_platform_and_asks_the_registry_with_the_clients_credentials(
        capsys, tmp_path, monkeypatch, node_without_deployment):
    (tmp_path / "config.json").write_text(json.dumps(RECORD["auth"]["config_json"]))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    result = run_main(node_facts, {"images": [REFS["oci_multi"], REFS["multi"]], "ask_registry": "absent",
                                   "paths": [], "globs": []}, capsys)
    assert result["_rc"] == 0 and result["changed"] is False, result.get("msg")
    node = result["ansible_facts"]["gpulab_node"]
    assert node["platform"] == {"os": "linux", "architecture": "amd64"}
    assert node["images"][REFS["multi"]]["registry"] is None, "the node has it: the registry is not asked"
    assert node["images"][REFS["oci_multi"]]["registry"]["error"] is None
    assert [p["architecture"] for p in node["images"][REFS["oci_multi"]]["registry"]["platforms"]] == ["amd64", "arm64"]
    sent = [headers for path, headers in node_without_deployment if path.startswith("/distribution/")]
    assert len(sent) == 1 and sent[0]["X-Registry-Auth"]
    assert "archprobe-not-a-secret" not in json.dumps(result) and sent[0]["X-Registry-Auth"] not in json.dumps(result)


def test_node_facts_asks_the_credential_helper_the_client_config_names(capsys, tmp_path, monkeypatch, node_without_deployment):
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "archprobe"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    result = run_main(node_facts, {"images": [REFS["oci_multi"]], "ask_registry": "absent", "paths": [], "globs": []}, capsys)
    registry = result["ansible_facts"]["gpulab_node"]["images"][REFS["oci_multi"]]["registry"]
    assert registry["error"] is None and len(registry["platforms"]) == 2
    assert "archprobe-not-a-secret" not in json.dumps(result)


def test_node_facts_without_credentials_reports_the_registrys_words(capsys, tmp_path, monkeypatch, node_without_deployment):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    result = run_main(node_facts, {"images": [REFS["oci_multi"], "not an image!"], "ask_registry": "always",
                                   "paths": [], "globs": []}, capsys)
    assert result["_rc"] == 0, result.get("msg")
    images = result["ansible_facts"]["gpulab_node"]["images"]
    assert "no basic auth credentials" in images[REFS["oci_multi"]]["registry"]["error"]
    assert images["not an image!"]["error"] == "no such image: not an image!: invalid reference format"
    assert images["not an image!"]["registry"] is None


def test_node_facts_asks_no_registry_by_default(capsys, node_without_deployment):
    result = run_main(node_facts, {"images": [REFS["oci_multi"]], "paths": [], "globs": []}, capsys)
    assert result["ansible_facts"]["gpulab_node"]["images"][REFS["oci_multi"]]["registry"] is None
    assert not [path for path, _headers in node_without_deployment if path.startswith("/distribution/")]


def test_node_facts_reads_the_nodes_memory_and_whether_it_is_unified(capsys, node_without_deployment):
    meminfo = str(FIXTURES / "memory" / "gb10_meminfo.txt")
    result = run_main(node_facts, {"paths": [], "globs": [], "meminfo": meminfo}, capsys)
    memory = result["ansible_facts"]["gpulab_node"]["memory"]
    assert (memory["total"], memory["available"]) == (127600748 * 1024, 118566368 * 1024)
    assert (memory["gpus"], memory["unified"], memory["unified_from"]) == (None, False, "no nvidia-smi")
    forced = run_main(node_facts, {"paths": [], "globs": [], "meminfo": meminfo, "unified_memory": "true"}, capsys)
    assert forced["ansible_facts"]["gpulab_node"]["memory"]["unified_from"] == "setting"
    with mock.patch.object(basic.AnsibleModule, "get_bin_path", side_effect=lambda name, *a, **k: "/usr/sbin/" + name):
        spark = run_main(node_facts, {"paths": [], "globs": [], "meminfo": meminfo}, capsys)
    memory = spark["ansible_facts"]["gpulab_node"]["memory"]
    assert memory["gpus"] == [{"name": "NVIDIA GB10", "memory_total_mib": None}]
    assert (memory["unified"], memory["unified_from"], memory["nvidia_smi_error"]) == (True, "nvidia-smi", None)
    missing = run_main(node_facts, {"paths": [], "globs": [], "meminfo": "/proc/no-such-meminfo"}, capsys)
    assert missing["msg"].startswith("cannot read /proc/no-such-meminfo on this node: No such file or directory")
