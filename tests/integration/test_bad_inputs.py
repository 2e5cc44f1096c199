"""Every bad input fails before any node is changed, with one line: what, where, how to fix.

Runs the real deploy playbook against the lab (make lab-up) with nothing deployed, one bad
input at a time, and compares each node's containers, firewall and token file before and after.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY, ROOT, lab_hosts as _lab_hosts, node_docker, playbook_env as _env, single_file_image


NODE_DATA = ROOT / "build" / "lab" / "node-data"


def _node_docker(node: str, *args: str) -> str:
    return node_docker(node, *args).stdout


def _in_node(node: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", f"gpl-node{node[4:]}", *args], capture_output=True, text=True, check=False)


def snapshot(nodes: list[str]) -> dict:
    """What a deployment would change on the nodes: containers, volumes, firewall, token file."""
    state = {}
    for node in nodes:
        state[node] = {
            "containers": _node_docker(node, "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}} {{.State}}"),
            "volumes": _node_docker(node, "volume", "ls", "-q"),
            "iptables": _in_node(node, "iptables", "-S").stdout,
            # The node's own disk: the model folders the weights role fills.
            "models": sorted(str(p.relative_to(NODE_DATA)) for p in (NODE_DATA / node).rglob("*")),
        }
    secrets_dir = Path(_lab_hosts()["all"]["vars"]["gpulab_secrets_dir"])
    state["token_file"] = (secrets_dir / "ray_token").exists()
    return state


@pytest.fixture(scope="module")
def lab():
    hosts = _lab_hosts()
    nodes = sorted(hosts["all"]["children"]["ray_head"]["hosts"]) + sorted(hosts["all"]["children"]["ray_workers"]["hosts"])
    if len(nodes) < 2:
        pytest.fail(f"the bad-input suite needs a lab of 2 nodes or more; it has {nodes}")
    teardown = subprocess.run([BIN / "ansible-playbook", "-i", LAB_INVENTORY, ROOT / "playbooks" / "teardown.yml"],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    assert teardown.returncode == 0, teardown.stdout[-3000:]
    return {"hosts": hosts, "nodes": nodes}


def write_inventory(tmp_path: Path, hosts: dict) -> Path:
    inv = tmp_path / "inventory"
    inv.mkdir()
    shutil.copytree(LAB_INVENTORY / "group_vars", inv / "group_vars")
    (inv / "hosts.yml").write_text(json.dumps(hosts))
    os.chmod(inv / "hosts.yml", 0o600)
    return inv


def deploy(inventory: Path, *extra: str, playbook: str = "deploy_qwen35.yml") -> subprocess.CompletedProcess:
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / playbook), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[ERROR]: Task failed")]


def _hosts_with(lab, change) -> dict:
    hosts = json.loads(json.dumps(lab["hosts"]))
    change(hosts["all"]["children"], hosts["all"]["vars"])
    return hosts


def _move_all_to_head(children, _vars):
    children["ray_head"]["hosts"].update(children["ray_workers"]["hosts"])
    children["ray_workers"]["hosts"] = {}


def _no_head(children, _vars):
    children["ray_workers"]["hosts"].update(children["ray_head"]["hosts"])
    children["ray_head"]["hosts"] = {}


def _head_also_worker(children, _vars):
    children["ray_workers"]["hosts"].update(children["ray_head"]["hosts"])


def _only_head(children, _vars):
    children["ray_workers"]["hosts"] = {}


def _pin(node: str, address: str):
    def change(children, _vars):
        for group in children.values():
            if node in group["hosts"]:
                group["hosts"][node]["fabric_address"] = address
    return change


def _pin_both(address: str):
    def change(children, _vars):
        for group in children.values():
            for host in group["hosts"].values():
                host["fabric_address"] = address
    return change


# id, inventory change (or None), extra -e arguments, expected pieces of the one error line.
# The preflight's rules are Python filters (plugins/filter/preflight.py) whose every bad input is a unit test on the
# lab's own values (tests/unit/plugins/filter/test_preflight.py, named after the case ids once here). The lab keeps
# one case for each place the deploy calls a rule filter (deploy.yml's four, each role's preflight), every case the
# node read, the fabric role or the image stage decides, and the memory rule on the nodes' real MemAvailable: each
# proves that such a refusal stops the real playbook before any node changes. tests/MANIFEST.md says where each went.
CASES = [
    ("tp-times-pp-exceeds-gpus", None, {"vllm_server_tensor_parallel_size": 4, "gate_expected_gpus": 4},
     ["tensor parallel 4 x pipeline parallel 1 = 4 GPUs", "the inventory offers 2", "make tensor x pipeline"]),
    ("no-head", _no_head, {}, ["group ray_head must hold exactly one host", "it holds 0", "put one host in [ray_head]"]),
    ("two-heads", _move_all_to_head, {}, ["group ray_head must hold exactly one host", "it holds 2"]),
    ("head-also-worker", _head_also_worker, {}, ["node1 is in both ray_head and ray_workers"]),
    ("fabric-address-outside-subnet", _pin("node2", "10.230.0.12"), {},
     ["fabric_address outside 10.220.0.0/24: node2=10.230.0.12", "correct fabric_address or fabric_subnet"]),
    ("fabric-address-not-on-node", _pin("node2", "10.220.0.99"), {},
     ["node2 has no interface with its fabric_address 10.220.0.99", "enP2p1s0f1np1=10.220.0.12"]),
    ("duplicate-fabric-addresses", _pin_both("10.220.0.11"), {},
     ["duplicate fabric_address: node1=10.220.0.11, node2=10.220.0.11", "give every node its own address"]),
    ("fabric-subnet-malformed", None, {"fabric_subnet": "10.220.0.0/33"}, ["fabric_subnet on node", "set it in the inventory"]),
    ("fabric-subnet-without-nodes", None, {"fabric_subnet": "10.99.0.0/24"},
     ["has no address on the fabric subnet 10.99.0.0/24", "eth0=10.210.0.1", "correct the fabric subnet"]),
    ("image-tag-missing", None, {"image_ref": "{{ lab_registry }}/gpulab/vllm-cpu:no-such-tag", "image_allow_tag": True},
     ["cannot pull", "gpulab/vllm-cpu:no-such-tag", "check that the registry has this tag"]),
    # A model folder the image must hold (the weights role not in use).
    ("model-path-missing", None, {"qwen35_model": "/models/no-such-model", "weights_source": ""},
     ["missing on this node: /models/no-such-model", "put the model there"]),
    # The least vLLM the preset asks for, raised past the lab's images (0.32.0 and the seed's 0.17.1): the image role
    # refuses after its contract probe, before Ray starts. The preset's own 0.17 against real versions:
    # tests/unit/plugins/filter/test_vllm_version.py.
    ("image-vllm-older-than-minimum", None, {"qwen35_min_vllm_version": "0.33"},
     ["node1: ", "has vLLM 0.", "older than 0.33, the least this deployment needs", "use an image whose vLLM is 0.33 or later",
      "lower image_min_vllm_version (qwen35_min_vllm_version for deploy_qwen35)"]),
    ("model-not-the-weights-folder", None, {"qwen35_model": "/models/tiny-llama"},
     ["vllm_server_model is \"/models/tiny-llama\", but weights_source=controller puts the model in /srv/gpulab-lab/models/tiny-llama",
      "set vllm_server_model (qwen35_model for deploy_qwen35) to /srv/gpulab-lab/models/tiny-llama"]),
    ("weights-source-missing", None, {"weights_source_path": "/no/such/model"},
     ["weights_source_path /no/such/model is not a folder on the controller", "point weights_source_path at the folder"]),
    ("gate-timeout-zero", None, {"gate_timeout": 0}, ["gate_timeout=0", "must be greater than 0"]),
    # A setting of the deploy's own, handed to the roles: checked in the preflight as they get it.
    ("progress-interval-not-a-number", None, {"gpulab_progress_interval": "often"},
     ["gpulab_progress_interval is \"often\"", "as a number (0 for none)"]),
    ("ray-token-missing", None, {"ray_cluster_auth_token": ""},
     ["ray_cluster_auth_token on node", "is empty", "ansible-vault encrypt_string", "ray_cluster_auth: false"]),
    ("api-key-too-short", None, {"vllm_server_api_key": "short"},
     ["vllm_server_api_key on node1 is shorter than 16 characters", "vllm_server_auth: false"]),
    ("image-tag-only", None, {"image_ref": "{{ lab_registry }}/gpulab/vllm-cpu:0.32.0"},
     ["names a tag, which the registry can move to another build", "pin it by digest", "image_allow_tag: true"]),
    ("vllm-port-on-a-ray-port", None, {"vllm_server_port": 6379},
     ["vllm_server_port=6379 is also ray_cluster_port", "choose another vllm_server_port"]),
    # The lab's nodes are not unified memory: node_unified_memory says they are, and 0.99 of MemTotal with the head's
    # other processes exceeds MemAvailable on any machine, so the preflight refuses before anything starts.
    ("unified-memory-too-small", None, {"node_unified_memory": "true", "qwen35_gpu_memory_utilization": 0.99},
     ["node1: unified memory (the GPU's memory is the host's)", "GiB available (MemAvailable)",
      "vllm_server_gpu_memory_utilization (qwen35_gpu_memory_utilization for deploy_qwen35)"]),
]


# The cases change nothing on a node (that is what each proves), so they run side by side, a few at a time, each its
# own playbook run between its own two snapshots of every node: a case that changed a node fails its comparison (and
# those of the cases beside it, which then name it too). The cases that reach the image stage run alone, after the
# others: the image's probe starts a container for a moment, which a snapshot beside it would see.
SIDE_BY_SIDE = 3
ALONE = {"model-path-missing", "image-tag-missing", "image-vllm-older-than-minimum"}


def _run_case(lab, folder: Path, case: tuple) -> dict:
    case_id, change, extra, _expected = case
    inventory = write_inventory(folder, _hosts_with(lab, change) if change else lab["hosts"])
    before = snapshot(lab["nodes"])
    result = deploy(inventory, *(["-e", json.dumps(extra)] if extra else []))
    return {"result": result, "before": before, "after": snapshot(lab["nodes"])}


@pytest.fixture(scope="module")
def case_runs(request, lab, tmp_path_factory):
    """Every selected case's run, made the first time one is asked for."""
    selected = [item.callspec.params["case_id"] for item in request.session.items
                if item.originalname == "test_bad_input_fails_before_any_change" and hasattr(item, "callspec")]
    cases = [case for case in CASES if case[0] in selected]
    runs = {}
    with concurrent.futures.ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        futures = {case[0]: pool.submit(_run_case, lab, tmp_path_factory.mktemp(case[0]), case)
                   for case in cases if case[0] not in ALONE}
        runs.update({case_id: future.result() for case_id, future in futures.items()})
    for case in cases:
        if case[0] in ALONE:
            runs[case[0]] = _run_case(lab, tmp_path_factory.mktemp(case[0]), case)
    return runs


@pytest.mark.parametrize("case_id, change, extra, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_before_any_change(case_runs, case_id, change, extra, expected):  # pylint: disable=unused-argument
    run = case_runs[case_id]
    result, before, after = run["result"], run["before"], run["after"]
    assert result.returncode != 0, f"{case_id}: the playbook succeeded:\n{result.stdout[-2000:]}"
    errors = error_lines(result.stdout + result.stderr)
    assert errors, f"{case_id}: no [ERROR] line:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
    text = " ".join(errors)
    for piece in expected:
        assert piece in text, f"{case_id}: {piece!r} not in the error:\n" + "\n".join(errors)
    assert "Traceback" not in result.stdout + result.stderr
    assert after == before, f"{case_id}: a node was changed"


def _listen_in_node(node: str, address: str, port: int) -> subprocess.Popen:
    code = (
        "import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        f"s.bind(('{address}',{port}));s.listen();time.sleep(120)"
    )
    proc = subprocess.Popen(["ip", "netns", "exec", f"gpl-node{node[4:]}", sys.executable, "-c", code])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if f":{port} " in _in_node(node, "ss", "-Htln").stdout:
            return proc
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"could not hold port {port} in {node}")


@pytest.mark.parametrize("port, expected", [
    (8000, ["port 8000 on node1 is already in use", "set vllm_server_port to a free port"]),
    (6379, ["port(s) 6379 on node1 are already in use", "choose other ports"]),
])
def test_port_in_use_fails_before_any_change(lab, port, expected):
    holder = _listen_in_node("node1", "0.0.0.0", port)
    try:
        before = snapshot(lab["nodes"])
        result = deploy(LAB_INVENTORY)
        after = snapshot(lab["nodes"])
    finally:
        holder.kill()
        holder.wait()
    text = " ".join(error_lines(result.stdout))
    assert result.returncode != 0
    for piece in expected:
        assert piece in text, f"{piece!r} not in: {text}"
    assert after == before


def test_fabric_interface_down_fails_before_any_change(lab):
    _in_node("node2", "ip", "link", "set", "enP2p1s0f1np1", "down")
    try:
        before = snapshot(lab["nodes"])
        result = deploy(LAB_INVENTORY)
        after = snapshot(lab["nodes"])
    finally:
        _in_node("node2", "ip", "link", "set", "enP2p1s0f1np1", "up")
    text = " ".join(error_lines(result.stdout))
    assert result.returncode != 0
    assert "node2: the fabric interface enP2p1s0f1np1 (10.220.0.12) is down" in text, text
    assert after == before


@pytest.mark.seed
def test_ray_versions_differ_fails_before_ray_starts(lab, tmp_path):
    """node2 gets the seed's image (Ray 2.53.0), node1 the Ray image (Ray 2.60.0): the image stage stops the run."""
    ray_image = lab["hosts"]["all"]["vars"]["lab_ray_image"]
    other = lab["hosts"]["all"]["vars"]["lab_vllm_seed_image"]

    def change(children, _vars):
        children["ray_head"]["hosts"]["node1"]["image_ref"] = ray_image
        children["ray_workers"]["hosts"]["node2"]["image_ref"] = other

    inventory = write_inventory(tmp_path, _hosts_with(lab, change))
    before = snapshot(lab["nodes"])
    overrides = {"image_require_vllm": False, "gpulab_vllm_serve": False, "gate_expected_gpus": 2}
    result = deploy(inventory, "-e", json.dumps(overrides), playbook="deploy.yml")
    after = snapshot(lab["nodes"])
    text = " ".join(error_lines(result.stdout))
    assert result.returncode != 0
    assert "Ray versions differ between nodes (node1=2.60.0, node2=2.53.0)" in text, text
    assert "give every node the same image" in text
    assert after == before


@pytest.fixture()
def arm64_only_image(lab, tmp_path):
    """An image built for linux/arm64 only (as a DGX Spark build), pushed to the lab registry through this machine's
    Docker and on no node; the lab's nodes are amd64. Yields its reference as the nodes reach the registry."""
    registry = lab["hosts"]["all"]["vars"]["lab_registry"]
    local = f"127.0.0.1:{registry.rsplit(':', 1)[1]}/gpulab/arm64-only:test"
    single_file_image(local, "arm64", tmp_path / "arm64-only")
    try:
        subprocess.run(["docker", "push", "-q", local], check=True, capture_output=True, timeout=120)
        yield f"{registry}/gpulab/arm64-only:test"
    finally:
        subprocess.run(["docker", "image", "rm", local], capture_output=True, check=False, timeout=60)


def test_image_for_another_architecture_fails_before_any_pull(lab, arm64_only_image):
    """Preflight asks each node's Docker daemon what the registry has for the image: arm64 only, on amd64 nodes.
    Every node is refused in one line, and nothing is pulled or started."""
    before = snapshot(lab["nodes"])
    result = deploy(LAB_INVENTORY, "-e", json.dumps({"image_ref": arm64_only_image, "image_allow_tag": True}))
    after = snapshot(lab["nodes"])
    errors = error_lines(result.stdout)
    assert result.returncode != 0, result.stdout[-2000:]
    for node in lab["nodes"]:
        line = (f"{node} (linux/amd64) cannot run {arm64_only_image}: the registry has it for linux/arm64/v8 only; "
                "use a multi-arch tag (one whose image index lists linux/amd64) or the image's amd64 build")
        assert any(line in error for error in errors), "\n".join(errors)
        assert node_docker(node, "image", "inspect", arm64_only_image, check=False).returncode != 0, f"{node} pulled it"
    assert "Traceback" not in result.stdout + result.stderr
    assert after == before


def test_ray_without_token_authentication_is_refused_unless_auth_is_off(lab, tmp_path):
    """An image whose Ray reports 2.51.0 (the Ray image with its version changed) cannot take a token:
    refused before Ray starts; with ray_cluster_auth false that check stands aside."""
    registry = lab["hosts"]["all"]["vars"]["lab_registry"]
    ray_image = lab["hosts"]["all"]["vars"]["lab_ray_image"]
    old = f"{registry}/gpulab/ray:2.51.0-test"
    # Built on node1's daemon, which holds the Ray image already (the machine's own copy went after its push), and
    # pushed from there: only the new layer moves.
    dockerfile = (f"FROM {ray_image}\n"
                  "RUN sed -i 's/^Version: 2.60.0$/Version: 2.51.0/' /opt/venv/lib/python3.11/site-packages/ray-2.60.0.dist-info/METADATA\n")
    node_docker("node1", "build", "-q", "--network=none", "-t", old, "-", stdin=dockerfile)
    node_docker("node1", "push", "-q", old)
    inventory = write_inventory(tmp_path, lab["hosts"])
    overrides = {"image_ref": old, "image_allow_tag": True, "image_require_vllm": False, "gpulab_vllm_serve": False,
                 "gate_expected_gpus": 2}
    before = snapshot(lab["nodes"])
    result = deploy(inventory, "-e", json.dumps(overrides), playbook="deploy.yml")
    after = snapshot(lab["nodes"])
    text = " ".join(error_lines(result.stdout))
    assert result.returncode != 0
    assert "the image's Ray 2.51.0 is older than 2.52.0 and cannot authenticate with a token" in text, text
    assert "set ray_cluster_auth: false" in text
    assert after == before
    checked = deploy(inventory, "--check", "-e", json.dumps(dict(overrides, ray_cluster_auth=False)), playbook="deploy.yml")
    assert "older than 2.52.0" not in checked.stdout


def _fabric_mtu(mtus: dict) -> None:
    """Set the MTU of lab nodes' fabric interfaces, inside their namespaces; the bridge's side stays at 1500."""
    interfaces = {"node1": "enp1s0f0np0", "node2": "enP2p1s0f1np1"}
    for node, mtu in mtus.items():
        _in_node(node, "ip", "link", "set", "dev", interfaces[node], "mtu", str(mtu)).check_returncode()


def test_fabric_interfaces_that_differ_in_mtu_fail_before_any_change(lab):
    _fabric_mtu({"node2": 9000})
    try:
        before = snapshot(lab["nodes"])
        result = deploy(LAB_INVENTORY)
        after = snapshot(lab["nodes"])
    finally:
        _fabric_mtu({"node2": 1500})
    text = " ".join(error_lines(result.stdout))
    assert result.returncode != 0
    assert "the fabric interfaces differ in MTU (node1 enp1s0f0np0 1500, node2 enP2p1s0f1np1 9000)" in text, text
    assert after == before


def test_a_path_narrower_than_the_fabric_mtu_is_named_before_ray_starts(lab):
    """Both nodes at 9000, the bridge between them at 1500 (a switch port left at its default): the nodes agree, so
    only the don't-fragment ping at admission shows it, after the firewall and before any container."""
    _fabric_mtu({"node1": 9000, "node2": 9000})
    try:
        before = snapshot(lab["nodes"])
        result = deploy(LAB_INVENTORY)
        after = snapshot(lab["nodes"])
    finally:
        _fabric_mtu({"node1": 1500, "node2": 1500})
    text = " ".join(error_lines(result.stdout))
    assert result.returncode != 0
    assert ("node2 (enP2p1s0f1np1 10.220.0.12) reaches the Ray head node1 at 10.220.0.11 over the fabric, but not with "
            "a packet of its MTU (9000 bytes, not fragmented)") in text, text
    assert {node: after[node]["containers"] for node in lab["nodes"]} == \
        {node: before[node]["containers"] for node in lab["nodes"]}
