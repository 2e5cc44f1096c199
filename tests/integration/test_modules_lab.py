"""gpulab.vllm.ray_cluster_facts and gpulab.vllm.vllm_health run for real against the lab.

Needs the 2-node lab (make lab-up). Each test runs a module through `ansible` ad hoc,
as a playbook would, on node1. The session starts its own containers, all named
fixture-it-* (Ray on port 6380, vLLM on 8001, so a deployment on 6379/8000 is left
alone), and removes them at the end. Selected with `-m lab`; without the lab the
tests fail, they do not skip.

    .venv/bin/python -m pytest -m lab tests/integration/test_modules_lab.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
INVENTORY = ROOT / "inventories" / "local_lab"
RUN = Path("/run/gpulab-lab")

RAY_PORT = 6380
HEAD_IP, WORKER_IP = "10.220.0.11", "10.220.0.12"
VLLM_URL = "http://10.210.0.11:8001"
HEAD, WORKER, VLLM = "fixture-it-ray-head", "fixture-it-ray-worker", "fixture-it-vllm"
# Settings for a single vLLM server started by hand on a lab node: shared memory, and a
# resolver that fails at once instead of timing out on an address the node cannot reach.
VLLM_LAB_WORKAROUNDS = [
    # A GPU request, as a vLLM server on a GPU host needs (the lab's Docker daemons serve it, lab/gpu/).
    "--gpus", "all",
    "--shm-size", "1g", "--add-host", "node1:10.210.0.11",
    "-v", str(ROOT / "build" / "fixture-lab" / "resolv.conf") + ":/etc/resolv.conf:ro",
    "-e", "VLLM_NO_USAGE_STATS=1",
]


def docker(node, *args, check=True, timeout=120):
    sock = RUN / node / "run" / "docker.sock"
    done = subprocess.run(["docker", "-H", "unix://%s" % sock] + list(args), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
        pytest.fail("docker %s on %s failed (%d): %s" % (" ".join(args[:2]), node, done.returncode, done.stderr.strip()))
    return done


def run_module(module, args, host="node1", check_mode=False):
    """Run one module ad hoc; return (ok, result dict)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_FORCE_COLOR="0",
               PATH="%s:%s" % (BIN, os.environ["PATH"]))
    argv = [str(BIN / "ansible"), "-i", str(INVENTORY), host, "-m", module, "-a", json.dumps(args)]
    if check_mode:
        argv.append("--check")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False)
    try:
        output = json.loads(done.stdout)
        result = output["plays"][0]["tasks"][0]["hosts"][host]
    except (ValueError, KeyError, IndexError):
        pytest.fail("ansible %s on %s printed no result (rc %d): %s %s"
                    % (module, host, done.returncode, done.stdout[-2000:], done.stderr[-2000:]))
    assert "Traceback" not in json.dumps(result), result
    return not result.get("failed", False), result


def ray_status_counts(node, container):
    """Active nodes as `ray status` prints them; 0 while it has no status yet."""
    text = docker(node, "exec", container, "ray", "status", check=False).stdout
    if "Active:" not in text:
        return 0
    active = text.split("Active:", 1)[1].split("Pending:", 1)[0]
    return sum(1 for line in active.splitlines() if line.strip().startswith("1 node_"))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    pytest.fail("%s within %ss" % (what, timeout))


@pytest.fixture(scope="module")
def lab():
    if not (INVENTORY / "hosts.yml").exists():
        pytest.fail("the lab is not up: inventories/local_lab/hosts.yml is missing (run `make lab-up`)")
    for node in ("node1", "node2"):
        if not (RUN / node / "run" / "docker.sock").exists():
            pytest.fail("the lab is not up: no Docker daemon socket for %s under %s (run `make lab-up`)" % (node, RUN))
        docker(node, "version", "--format", "{{.Server.Version}}")
    hosts = yaml.safe_load((INVENTORY / "hosts.yml").read_text())
    return hosts["all"]["vars"]


# The modules run against both vLLM lab images: today's (vLLM 0.32, with the Ray image's Ray 2.60)
# and the seed's (vLLM 0.17.1 and Ray 2.53 in one image, as our first users run them).
VERSIONS = {
    "current": {"ray_image": "lab_ray_image", "vllm_image": "lab_vllm_image", "ray": "2.60.0", "vllm": "0.32.0"},
    "seed": {"ray_image": "lab_vllm_seed_image", "vllm_image": "lab_vllm_seed_image", "ray": "2.53.0", "vllm": "0.17.1"},
}


@pytest.fixture(scope="module", params=[pytest.param(name, marks=[pytest.mark.seed] if name == "seed" else [])
                                        for name in sorted(VERSIONS)])
def versions(request, lab):
    chosen = dict(VERSIONS[request.param], name=request.param)
    chosen["ray_image"], chosen["vllm_image"] = lab[chosen["ray_image"]], lab[chosen["vllm_image"]]
    # The seed's image is about 9 GB: pull it once, with time for it, before the tests start containers.
    for node in ("node1", "node2"):
        for image in sorted({chosen["ray_image"], chosen["vllm_image"]}):
            docker(node, "pull", "--quiet", image, timeout=1200)
    return chosen


def start_ray_worker(image):
    docker("node2", "run", "-d", "--name", WORKER, "--network", "host", "--ipc", "host", "--shm-size", "1g", "--gpus", "all",
           "--entrypoint", "ray", image, "start", "--block", "--address=%s:%d" % (HEAD_IP, RAY_PORT),
           "--node-ip-address=%s" % WORKER_IP, "--num-gpus=1")


@pytest.fixture(scope="module")
def ray_cluster(versions):
    image = versions["ray_image"]
    docker("node1", "rm", "-f", HEAD, check=False)
    docker("node2", "rm", "-f", WORKER, check=False)
    try:
        docker("node1", "run", "-d", "--name", HEAD, "--network", "host", "--ipc", "host", "--shm-size", "1g", "--gpus", "all",
               "--entrypoint", "ray", image, "start", "--block", "--head", "--node-ip-address=%s" % HEAD_IP,
               "--port=%d" % RAY_PORT, "--num-gpus=1", "--include-dashboard=false")
        start_ray_worker(image)
        wait_for(lambda: ray_status_counts("node1", HEAD) == 2, 180, "2 Ray nodes active in %s" % HEAD)
        yield versions
    finally:
        docker("node1", "rm", "-f", HEAD, check=False)
        docker("node2", "rm", "-f", WORKER, check=False)


@pytest.fixture(scope="module")
def vllm_server(versions):
    (ROOT / "build" / "fixture-lab").mkdir(parents=True, exist_ok=True)
    (ROOT / "build" / "fixture-lab" / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    docker("node1", "rm", "-f", VLLM, check=False)
    try:
        docker("node1", "run", "-d", "--name", VLLM, "--network", "host", *VLLM_LAB_WORKAROUNDS,
               versions["vllm_image"], "/models/tiny-llama", "--port", "8001", "--served-model-name", "tiny",
               "--enforce-eager",
               # The tiny model's tokenizer has no chat template of its own.
               "--chat-template", "{% for message in messages %}{{ message['content'] }}\n{% endfor %}")
        yield VLLM_URL
    finally:
        docker("node1", "rm", "-f", VLLM, check=False)


# --- ray_cluster_facts -------------------------------------------------------------------------

def test_facts_of_the_two_node_cluster_match_ray_status(ray_cluster):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {"container": HEAD})
    assert ok, result.get("msg")
    assert result["changed"] is False
    facts = result["ansible_facts"]["ray_cluster"]
    assert facts["alive_nodes"] == ray_status_counts("node1", HEAD) == 2
    assert facts["gcs_address"] == "%s:%d" % (HEAD_IP, RAY_PORT)
    assert facts["ray_version"] == ray_cluster["ray"]
    assert [(n["node_ip"], n["is_head"]) for n in facts["nodes"] if n["alive"]] == [(HEAD_IP, True), (WORKER_IP, False)]
    assert facts["gpus"] == 2.0 and facts["pending_nodes"] == 0
    assert facts["wait"]["polls"] == 1 and facts["wait"]["waited"] is False


def test_check_mode_reads_the_same(ray_cluster):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {"container": HEAD}, check_mode=True)
    assert ok, result.get("msg")
    assert result["ansible_facts"]["ray_cluster"]["alive_nodes"] == 2


def test_gate_passes_for_both_nodes_and_gpus(ray_cluster):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {
        "container": HEAD, "expected_node_ips": [HEAD_IP, WORKER_IP], "expected_gpus": 2, "expected_nodes": 2,
        "wait": True, "wait_timeout": 30})
    assert ok, result.get("msg")
    facts = result["ansible_facts"]["ray_cluster"]
    assert facts["missing_node_ips"] == [] and facts["unexpected_node_ips"] == []
    assert facts["wait"]["waited"] is True


def test_gate_times_out_with_one_clear_message(ray_cluster):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {
        "container": HEAD, "expected_node_ips": [HEAD_IP, WORKER_IP, "10.220.0.13"], "expected_gpus": 3,
        "wait": True, "wait_timeout": 3, "wait_sleep": 0.2})
    assert not ok
    message = result["msg"]
    assert message.startswith("Ray cluster at %s:%d (container %s on host node1) not ready after " % (
        HEAD_IP, RAY_PORT, HEAD)), message
    assert "missing node(s) 10.220.0.13" in message and "GPUs 2 of 3 expected" in message
    assert "alive: 10.220.0.11 (head, GPU 1), 10.220.0.12 (GPU 1)" in message
    assert "\n" not in message
    facts = result["ansible_facts"]["ray_cluster"]
    assert facts["missing_node_ips"] == ["10.220.0.13"]
    assert facts["wait"]["elapsed"] >= 3 and facts["wait"]["polls"] >= 3


def gcs_alive_nodes():
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {"container": HEAD})
    return result["ansible_facts"]["ray_cluster"]["alive_nodes"] if ok else None


def test_gate_waits_for_a_worker_that_joins_late(ray_cluster):
    docker("node2", "rm", "-f", WORKER)
    # The GCS's node table, not `ray status`: with Ray 2.53, `ray status` listed the removed worker as
    # active for more than five minutes after the GCS had marked it dead.
    wait_for(lambda: gcs_alive_nodes() == 1, 60, "the removed worker to leave the cluster")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    gate = subprocess.Popen(
        [str(BIN / "ansible"), "-i", str(INVENTORY), "node1", "-m", "gpulab.vllm.ray_cluster_facts", "-a",
         json.dumps({"container": HEAD, "expected_node_ips": [HEAD_IP, WORKER_IP], "expected_gpus": 2,
                     "wait": True, "wait_timeout": 120})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    # The gate is polling while the worker starts, 4 s later, and joins.
    time.sleep(4)
    start_ray_worker(ray_cluster["ray_image"])
    out, err = gate.communicate(timeout=180)
    result = json.loads(out)["plays"][0]["tasks"][0]["hosts"]["node1"]
    assert not result.get("failed"), result.get("msg") or err
    facts = result["ansible_facts"]["ray_cluster"]
    assert facts["alive_nodes"] == 2 and facts["gpus"] == 2.0
    assert facts["wait"]["elapsed"] > 3 and facts["wait"]["polls"] > 3
    # The old worker's node is remembered as dead; it is not reported as missing.
    assert facts["dead_nodes"] >= 1 and facts["missing_node_ips"] == []


# The module's error paths that read no cluster: the same on every image, so run once (with today's images).

def test_missing_container_is_a_clear_error_not_a_traceback(lab):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {"container": "fixture-it-no-such"})
    assert not ok
    assert result["msg"] == ("Cannot read the Ray cluster (container_missing): container fixture-it-no-such on host "
                             "node1: Error response from daemon: No such container: fixture-it-no-such")


def test_missing_container_with_wait_polls_until_the_timeout(lab):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {
        "container": "fixture-it-no-such", "wait": True, "wait_timeout": 2, "wait_sleep": 0.3})
    assert not ok
    assert "not ready after" in result["msg"] and "No such container: fixture-it-no-such" in result["msg"]
    assert result["ansible_facts"]["ray_cluster"]["wait"]["polls"] >= 3


def test_without_container_the_hosts_python_must_have_ray(lab):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {"gcs_address": "%s:%d" % (HEAD_IP, RAY_PORT)})
    assert not ok
    assert result["msg"].startswith("Cannot read the Ray cluster (ray_missing): host node1: ")
    assert result["msg"].endswith("cannot import ray")


def test_bad_wait_timeout_is_refused(lab):
    ok, result = run_module("gpulab.vllm.ray_cluster_facts", {"container": HEAD, "wait_timeout": 0})
    assert not ok and result["msg"] == "wait_timeout must be greater than 0, got 0"


def test_vllm_wait_reports_how_long_the_server_took(vllm_server):
    ok, result = run_module("gpulab.vllm.vllm_health", {
        "base_url": vllm_server, "model": "tiny", "wait": True, "wait_timeout": 600, "wait_sleep": 2})
    assert ok, result.get("msg")
    assert result["healthy"] is True and result["failed_stage"] is None
    assert result["waited"]["polls"] >= 1


def test_vllm_healthy_server_answers_every_probe(vllm_server, versions):
    ok, result = run_module("gpulab.vllm.vllm_health", {"base_url": vllm_server, "model": "tiny", "metrics": True})
    assert ok, result.get("msg")
    assert result["served_models"] == ["tiny"] and result["vllm_version"].startswith(versions["vllm"])
    assert isinstance(result["generated_text"], str)
    assert result["time_to_first_token_s"] > 0
    assert set(result["probes"]) == {"health", "models", "version", "generation", "metrics"}
    assert all(p["ok"] and p["status"] == 200 for p in result["probes"].values())


def test_vllm_check_mode_and_chat(vllm_server):
    ok, result = run_module("gpulab.vllm.vllm_health", {"base_url": vllm_server, "generation_api": "chat"},
                            check_mode=True)
    assert ok, result.get("msg")
    assert result["probes"]["generation"]["ok"]


def test_vllm_api_key_is_never_shown(vllm_server):
    secret = "it-secret-7f3a9c"
    ok, result = run_module("gpulab.vllm.vllm_health", {"base_url": vllm_server, "api_key": secret})
    assert ok, result.get("msg")
    assert secret not in json.dumps(result)


def test_vllm_model_missing(vllm_server):
    ok, result = run_module("gpulab.vllm.vllm_health", {"base_url": vllm_server, "model": "Qwen/Qwen3.5-27B"})
    assert not ok and result["failed_stage"] == "model_missing"
    assert result["msg"] == ("vLLM at %s: stage model_missing: GET %s/v1/models: expected model 'Qwen/Qwen3.5-27B' "
                             "is not served; served: tiny" % (vllm_server, vllm_server))


def test_vllm_unreachable_with_wait_times_out(lab):
    url = "http://10.210.0.11:8009"
    ok, result = run_module("gpulab.vllm.vllm_health", {
        "base_url": url, "wait": True, "wait_timeout": 3, "wait_sleep": 0.5})
    assert not ok and result["failed_stage"] == "unreachable"
    assert result["msg"].startswith("vLLM at %s not healthy after " % url)
    assert "Connection refused" in result["msg"]
    assert result["waited"]["elapsed"] >= 3 and result["waited"]["polls"] >= 3


def test_vllm_dead_engine_is_reported_with_the_servers_own_error(vllm_server, versions):
    # Last vLLM test: it kills the process that runs the model. vLLM 0.32 runs it in a worker
    # process (VLLM::Worker) and then answers /health 503 and generations 500 for a few seconds
    # before it shuts its API server down. vLLM 0.17 runs it in the engine core itself at TP 1;
    # killed, the server answers /health 200 for a moment, then 503, while generations fail with
    # 500, then shuts down. The probe runs right away; if it comes after the shutdown, that must be clear as well.
    process = "VLLM::Worker" if versions["vllm"] == "0.32.0" else "VLLM::EngineCore"
    docker("node1", "exec", VLLM, "pkill", "-9", "-f", process)
    ok, result = run_module("gpulab.vllm.vllm_health", {"base_url": vllm_server, "model": "tiny"})
    assert not ok, result
    assert "\n" not in result["msg"]
    if result["failed_stage"] == "unreachable":
        assert "/health got no answer: ConnectionRefusedError" in result["msg"]
        return
    assert result["failed_stage"] in ("unhealthy", "generation_failed")
    # vLLM 0.17 answered /health 200 right after the kill (recorded: vllm-0.17.1_engine_killed) and 503
    # once its server had noticed; the generation fails either way.
    assert result["probes"]["health"]["status"] in ((503,) if versions["vllm"] == "0.32.0" else (200, 503))
    if not result["probes"]["models"]["ok"]:
        # vLLM shut its API down between the probes (seen with vLLM 0.17 on a busy machine): the one line above, with
        # the stage it failed at, is all there is to say.
        return
    if result["probes"]["generation"]["status"] is None:
        # vLLM shut its API down after /v1/models answered (seen with vLLM 0.32 once its images were byte-compiled and
        # its shutdown came sooner): the generation got no answer, and the one line says so at the stage it failed.
        assert "got no answer" in result["msg"], result["msg"]
        return
    assert result["probes"]["generation"]["status"] == 500
    assert "answered HTTP 500: EngineCore encountered an issue" in result["msg"]


def test_vllm_wait_ends_when_the_server_container_exits(versions):
    """A server that dies while the module waits ends the wait at once, with the server's own last error line,
    read through the Docker Engine API on the node (not after wait_timeout)."""
    name = "fixture-it-vllm-exits"
    docker("node1", "rm", "-f", name, check=False)
    try:
        docker("node1", "run", "-d", "--name", name, "--network", "host", *VLLM_LAB_WORKAROUNDS,
               versions["vllm_image"], "/models/no-such-model", "--port", "8002")
        ok, result = run_module("gpulab.vllm.vllm_health", {
            "base_url": "http://10.210.0.11:8002", "container": name, "wait": True, "wait_timeout": 600, "wait_sleep": 0.5})
        assert not ok and result["failed_stage"] == "server_exited", result
        assert "container %s exited with code" % name in result["msg"], result["msg"]
        assert "no-such-model" in result["msg"], result["msg"]
        assert result["waited"]["elapsed"] < 300, result["waited"]
    finally:
        docker("node1", "rm", "-f", name, check=False)


def test_vllm_wait_ends_at_once_for_a_container_that_is_not_there(lab):
    ok, result = run_module("gpulab.vllm.vllm_health", {
        "base_url": "http://10.210.0.11:8009", "container": "fixture-it-no-such", "wait": True, "wait_timeout": 600})
    assert not ok and result["failed_stage"] == "server_exited", result
    assert "container fixture-it-no-such is not there" in result["msg"], result["msg"]
    assert result["waited"]["polls"] == 1
