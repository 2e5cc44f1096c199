"""The serving chain on today's lab images: one deployment from nothing, and in order every check that only reads a
serving cluster or breaks it and repairs it by a re-run (tests/integration/conftest.py: a link that fails names
itself to every link after it).

The links, in order: the chain starts from nothing (teardown.yml, then no container on any node) and its nodes are
hardened as a security-minded site runs them (INPUT policy DROP: loopback, replies and SSH admitted, nothing else)
until its re-run; status says nothing is deployed; the deploy in check mode starts nothing; one deploy at -vvv from
nothing serves, the collective check across both nodes having run before the server, the host firewall first in
INPUT and the fabric subnet admitted on the fabric interface. Secure by default on it: no secret in the -vvv
output, the containers' logs or the files the roles wrote (but the token and key files); Ray refuses a client
without the token; Ray's GCS port answers on the fabric only; vLLM answers 401 without the key, on every route; from
the other node's management side, over IPv4 and IPv6, only SSH answers. Then the endpoint verified (a generation,
TP rank 1 on the second node with its own fabric settings, the GPU contract, check mode on the deployment, the
official openai client), a re-run that changes nothing (the collective stands aside), the site's policy kept
through both (the nodes then back to the lab's ACCEPT), status on a healthy cluster (table, JSON, metrics.yml's
targets), an ACCEPT put ahead of the firewall found and repaired by a re-run, a dead engine behind a live API
restarted by a re-run, the server killed (status DOWN, diagnose.yml's archive), the worker's Ray container killed
(status: lost), the re-run that heals it, the head's Docker daemon restarted and healed by a re-run. Then the links
with settings of their own, each saying what it changes: the supervisors and the watchdog (molecule/reboot's
playbooks), upgrades that roll back and one that cuts over (molecule/upgrade's).

Every deploy of the chain has the same inputs, the lab's inventory's: its extra environment of both roles holds a
stand-in for a Hugging Face token (lab_hf_token), which must not print at any verbosity either. tests/integration/test_serving_chain_seed.py runs the
links that do not depend on the image's version on the seed's image.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, Chain, in_node, lab_hosts, node_docker as _docker, playbook_env as _env

sys.path.insert(0, str(ROOT / "bench"))
import faults  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = pytest.mark.lab

NODES = ("node1", "node2")


def chain_inputs(inventory: Path) -> dict:
    """What every link reads of the chain's inventory: its path and the lab's secrets."""
    group_vars = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())
    lab_vars = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["vars"]
    if not lab_vars.get("lab_hf_token") or "lab_hf_token" not in group_vars["vllm_server_extra_env"]["HF_TOKEN"]:
        pytest.fail("the lab's inventory has no lab_hf_token in both roles' extra environment: run `make lab-up` again")
    return {"inventory": inventory, "hf_token": lab_vars["lab_hf_token"], "token": lab_vars["ray_cluster_auth_token"],
            "api_key": lab_vars["vllm_server_api_key"], "secrets_dir": Path(lab_vars["gpulab_secrets_dir"]),
            "config_dir": Path(lab_vars["vllm_server_config_dir"])}


def play(chain: Chain, name: str, *extra: str, json_output: bool = False, timeout: float = 1200) -> subprocess.CompletedProcess:
    """A playbook of the collection on the chain's inventory."""
    env = _env()
    if json_output:
        env.update(ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return subprocess.run([BIN / "ansible-playbook", "-i", chain["inventory"], ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=timeout)


def deploy(chain: Chain, *extra: str) -> subprocess.CompletedProcess:
    """deploy_qwen35.yml on the chain's inventory: a re-run of the deployment as it was made."""
    return play(chain, "deploy_qwen35.yml", *extra)


def containers() -> dict:
    return {node: _docker(node, "ps", "-a", "--format", "{{.Names}}").stdout.split() for node in NODES}


def recap(output: str) -> dict:
    """changed= of each host in a play's recap."""
    return {host: int(changed) for host, changed in re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)}


def status(chain: Chain, *extra: str) -> tuple[list[str], int, str, int]:
    """The table's lines, the sum of changed over the hosts, the whole output and the exit code."""
    run = play(chain, "status.yml", *extra, json_output=True)
    output = json.loads(run.stdout)
    task = next(t for t in output["plays"][0]["tasks"] if t["task"]["name"] == "Show the table")
    lines = next(result["msg"] for result in task["hosts"].values() if "msg" in result)
    return lines, sum(stats["changed"] for stats in output["stats"].values()), run.stdout + run.stderr, run.returncode


def line(lines: list[str], start: str) -> str:
    return next(item for item in lines if item.startswith(start))


LABCTL = [str(BIN / "python"), str(ROOT / "lab" / "labctl.py")]


def _policy(node: str, policy: str) -> None:
    """The lab node's INPUT policy: drop (a hardened site: loopback, replies and SSH admitted, nothing else) or accept."""
    subprocess.run([*LABCTL, "input", node, policy], check=True, capture_output=True, text=True)


def _input_rules(node: str, chain_name: str = "INPUT") -> list[str]:
    return in_node(node, "iptables", "-S", chain_name).stdout.splitlines()


def _task_at(output: str, name: str) -> int:
    """Where the first task line naming NAME starts in a play's output (-1 when none does)."""
    found = re.search(r"^TASK \[[^\n]*" + re.escape(name), output, re.M)
    return found.start() if found else -1


@pytest.fixture(scope="module")
def chain():
    # Hardened from its start until the re-run: both nodes at INPUT policy DROP, as a security-minded site runs them.
    shared = Chain("serving (today's images)", verbose=True, hardened=True, **chain_inputs(INVENTORY))
    yield shared
    for node in NODES:
        _policy(node, "accept")
    play(shared, "teardown.yml")


# --------------------------------------------------------------------------- from nothing to serving
# Shared with the seed's chain (test_serving_chain_seed.py), which imports these links.

def test_the_chain_starts_from_nothing(link):
    run = play(link, "teardown.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert containers() == {node: [] for node in NODES}, "a container is left on a node after teardown.yml"
    if link.get("hardened"):
        for node in NODES:
            _policy(node, "drop")
            assert "-P INPUT DROP" in _input_rules(node), f"{node} did not take the hardened policy"


def test_status_knows_nothing_deployed(link):
    lines, changed, _output, rc = status(link)
    assert rc != 0 and changed == 0
    for name in NODES:
        row = line(lines, name + " ")
        assert row.split()[2:5] == ["absent", "-", "-"] and row.endswith("absent"), row
    assert line(lines, "Ray: ").startswith("Ray: not readable: ") and "gpulab-ray-head" in line(lines, "Ray: "), lines
    assert line(lines, "vLLM: ") == "vLLM: none (nothing deployed)", lines
    assert "Firewall node1: none" in lines, lines
    assert line(lines, "Verdict: ") == "Verdict: not deployed: no gpulab container on any node", lines


def test_check_mode_from_nothing_starts_nothing(link):
    firewall = {node: in_node(node, "iptables", "-S").stdout for node in NODES}
    run = deploy(link, "--check")
    assert run.returncode == 0, run.stdout[-3000:]
    assert containers() == {node: [] for node in NODES}, run.stdout[-2000:]
    assert {node: in_node(node, "iptables", "-S").stdout for node in NODES} == firewall
    assert not (link["secrets_dir"] / "ray_token").exists()


def test_the_deploy_from_nothing_serves(link):
    run = deploy(link, *(["-vvv"] if link["verbose"] else []))
    link["output"] = run.stdout + run.stderr
    assert run.returncode == 0, run.stdout[-4000:]
    assert re.search(r'it answered ".*" in [\d.]+ s', run.stdout), run.stdout[-3000:]


def test_hardened_nodes_serve_after_the_collective_check(link):
    """On nodes at INPUT policy DROP: the collective ran across both nodes before vLLM started and said what it saw per
    node; the host firewall comes first in INPUT and admits the fabric subnet on the fabric interface."""
    if not link.get("hardened"):
        pytest.fail(f"the {link.name} chain is not hardened; this link belongs to one that is", pytrace=False)
    output = link["output"]
    report = re.search(r"gloo all-reduce of \d+ MiB over 2 ranks: bus bandwidth ([\d.]+) Gbit/s.*?node2 \(10\.220\.0\.12\): "
                       r"TCP on enP2p1s0f1np1, link to the head ([\d.]+) Gbit/s", output, re.S)
    assert report, output[-5000:]
    assert float(report.group(1)) > 0 and float(report.group(2)) > 0
    assert 0 <= _task_at(output, "Run one all-reduce across every GPU") < _task_at(output, "Run the vLLM server"), \
        "the collective did not run before the server started"
    for node, iface in (("node1", "enp1s0f0np0"), ("node2", "enP2p1s0f1np1")):
        rules = _input_rules(node)
        assert "-P INPUT DROP" in rules, f"{node} is no longer hardened"
        assert [rule for rule in rules if rule.startswith("-A")][0] == \
            '-A INPUT -m comment --comment "gpulab: default deny" -j GPULAB-INPUT', rules
        ours = _input_rules(node, "GPULAB-INPUT")
        assert f'-A GPULAB-INPUT -s 10.220.0.0/24 -i {iface} -m comment --comment "gpulab: the fabric subnet" -j ACCEPT' \
            in ours, ours


def test_the_endpoint_verifies(link):
    """tests/integration/playbooks/serving_verify.yml: each of its assertions is a named task; the first that fails
    is named in the output."""
    run = subprocess.run([BIN / "ansible-playbook", "-i", link["inventory"],
                          ROOT / "tests" / "integration" / "playbooks" / "serving_verify.yml"],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, check=False, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:]


def test_a_rerun_changes_nothing(link):
    run = deploy(link)
    assert run.returncode == 0, run.stdout[-3000:]
    assert recap(run.stdout) and set(recap(run.stdout).values()) == {0}, run.stdout[-1500:]
    assert "gpulab-vllm unchanged" in run.stdout, run.stdout[-3000:]
    # Nothing is about to load on a healthy cluster: the collective stands aside (skipped steps are not printed:
    # neither its task nor its report may appear).
    assert "Run one all-reduce across every GPU" not in run.stdout and "bus bandwidth" not in run.stdout, run.stdout[-3000:]


def test_a_hardened_site_keeps_its_policy_through_the_deploy_and_the_rerun(link):
    """Changes, for the links after it: both nodes back to the lab's default INPUT policy (ACCEPT)."""
    if not link.get("hardened"):
        pytest.fail(f"the {link.name} chain is not hardened; this link belongs to one that is", pytrace=False)
    for node in NODES:
        assert "-P INPUT DROP" in _input_rules(node), f"{node}: the deploy or the re-run changed the site's policy"
    for node in NODES:
        _policy(node, "accept")
    link["hardened"] = False


# --------------------------------------------------------------------------- secure by default

def test_no_secret_in_the_verbose_output_the_logs_or_the_files(link):
    secrets = {"Ray token": link["token"], "API key": link["api_key"]}
    assert len(link["output"]) > 10000, "a -vvv deploy prints a lot; this output is suspiciously short"
    places = {"ansible-playbook -vvv": link["output"]}
    # The block the deploy ends with says where the key lives and how to use it, without the key itself.
    assert "(mode 0600) holds it with the endpoint. Call it:" in link["output"]
    assert 'Authorization: Bearer $OPENAI_API_KEY' in link["output"]
    assert link["hf_token"] not in link["output"], "a value of the extra environment is in the -vvv output"
    for node, names in (("node1", ["gpulab-ray-head", "gpulab-vllm"]), ("node2", ["gpulab-ray-worker"])):
        for name in names:
            logs = _docker(node, "logs", name)
            places[f"docker logs {name} on {node}"] = logs.stdout + logs.stderr
    for folder in (link["secrets_dir"], link["config_dir"]):
        for path in folder.rglob("*") if folder.exists() else []:
            if path.is_file() and path.name not in ("ray_token", "vllm_api_key"):
                places[str(path)] = path.read_text(errors="replace")
    for what, secret in secrets.items():
        for place, text in places.items():
            assert secret not in text, f"the {what} appears in {place}"


def test_token_file_is_root_only(link):
    token = link["secrets_dir"] / "ray_token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert token.parent.stat().st_mode & 0o777 == 0o700
    assert token.stat().st_uid == 0


def test_ray_refuses_a_client_without_the_token(link):
    image = lab_hosts()["all"]["vars"]["lab_ray_image"]
    code = "import ray; ray.init(address='10.220.0.11:6379', log_to_driver=False); print('CONNECTED')"
    result = _docker("node2", "run", "--rm", "--network", "host", "--entrypoint", "python3", image, "-c", code,
                     check=False)
    assert result.returncode != 0, result.stdout
    assert "CONNECTED" not in result.stdout
    assert "uthentication" in result.stdout + result.stderr or "Failed to connect" in result.stdout + result.stderr


def _connect_from(node: str, address: str, port: int) -> str:
    code = ("import socket,sys\ns=socket.socket();s.settimeout(3)\n"
            f"try:\n s.connect(('{address}',{port}));print('open')\nexcept ConnectionRefusedError:\n print('refused')\n"
            "except OSError as e:\n print('error', e)")
    return subprocess.run(["ip", "netns", "exec", f"gpl-node{node[4:]}", "python3", "-c", code],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_gcs_port_answers_on_the_fabric_only(link):
    assert _connect_from("node2", "10.220.0.11", 6379) == "open"
    assert _connect_from("node2", "10.210.0.11", 6379) == "refused"


def test_vllm_without_the_key_gets_401(link):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen("http://10.210.0.11:8000/v1/models", timeout=10)
    assert err.value.code == 401
    request = urllib.request.Request("http://10.210.0.11:8000/v1/models",
                                     headers={"Authorization": f"Bearer {link['api_key']}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def test_no_recorded_fixture_holds_this_labs_secrets():
    """The unit tests' fixtures are recorded from a lab; none may carry the lab's token or key (the
    recorder redacts them). Checked here, where the lab and its secrets exist."""
    lab_vars = lab_hosts()["all"]["vars"]
    secrets = [lab_vars["ray_cluster_auth_token"], lab_vars["vllm_server_api_key"], lab_vars["lab_hf_token"]]
    fixtures = [path for folder in (ROOT / "tests" / "unit" / "fixtures", ROOT / "bench" / "tests" / "fixtures")
                for path in sorted(folder.rglob("*")) if path.is_file()]
    assert len(fixtures) > 10
    for path in fixtures:
        text = path.read_text(errors="replace")
        assert not any(secret in text for secret in secrets), path.relative_to(ROOT)


# The attacker on the office network: node2's management side, over IPv4 and IPv6.

def _sweep_from(node: str, targets: list) -> dict:
    """Connect from node's network namespace to every (address, port); 'open', 'refused' or 'error ...' each."""
    code = ("import json,socket,sys\nout={}\nfor host,port in json.loads(sys.argv[1]):\n"
            " family=socket.AF_INET6 if ':' in host else socket.AF_INET\n"
            " info=socket.getaddrinfo(host,port,family,socket.SOCK_STREAM)[0]\n"
            " s=socket.socket(family,socket.SOCK_STREAM);s.settimeout(3)\n"
            " try:\n  s.connect(info[4]);out[f'{host} {port}']='open'\n"
            " except ConnectionRefusedError:\n  out[f'{host} {port}']='refused'\n"
            " except OSError as e:\n  out[f'{host} {port}']='error '+str(e)\n"
            " finally:\n  s.close()\nprint(json.dumps(out))")
    result = subprocess.run(["ip", "netns", "exec", f"gpl-node{node[4:]}", "python3", "-c", code, json.dumps(targets)],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def _in_node(node: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", f"gpl-node{node[4:]}", *cmd], capture_output=True, text=True,
                          check=True).stdout


def _listening(node: str) -> list:
    ports = set()
    for line in _in_node(node, "ss", "-ltnH").splitlines():
        ports.add(int(line.split()[3].rsplit(":", 1)[1]))
    return sorted(ports)


def _link_local(node: str) -> str:
    for line in _in_node(node, "ip", "-6", "-o", "address", "show", "dev", "eth0", "scope", "link").splitlines():
        return line.split()[3].split("/")[0]
    raise AssertionError(f"{node} has no IPv6 link-local address on eth0")


def test_every_listener_of_the_head_is_refused_from_the_office_side_but_ssh(link):
    ports = _listening("node1")
    assert {22, 6379, 8000} <= set(ports) and len(ports) > 8, ports
    v4 = _sweep_from("node2", [["10.210.0.11", port] for port in ports])
    assert {target: state for target, state in v4.items() if state != "refused"} == {"10.210.0.11 22": "open"}
    # IPv6 link-local on the management interface: no rule of an IPv4-only firewall would see it.
    v6 = _sweep_from("node2", [[f"{_link_local('node1')}%eth0", port] for port in ports])
    assert set(v6.values()) == {"refused"}, v6
    # The fabric still carries Ray.
    assert _sweep_from("node2", [["10.220.0.11", 6379]]) == {"10.220.0.11 6379": "open"}


def test_a_new_listener_is_refused_from_the_office_side_and_open_on_the_fabric(link):
    listener = subprocess.Popen(["ip", "netns", "exec", "gpl-node1", "python3", "-c",
                                 "import socket,time\ns=socket.socket();s.bind(('0.0.0.0',0));s.listen()\n"
                                 "print(s.getsockname()[1],flush=True)\ntime.sleep(120)"],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = int(listener.stdout.readline())
        assert _sweep_from("node2", [["10.210.0.11", port], ["10.220.0.11", port]]) == {
            f"10.210.0.11 {port}": "refused", f"10.220.0.11 {port}": "open"}
    finally:
        listener.kill()


def test_every_route_needs_the_key(link):
    """vLLM's own --api-key guards /v1 only; the collection's key check guards every route but liveness."""
    base = "http://10.210.0.11:8000"
    key = {"Authorization": f"Bearer {link['api_key']}", "Content-Type": "application/json"}
    routes = [("POST", "/invocations", {"prompt": "hi", "max_tokens": 2}), ("POST", "/tokenize", {"prompt": "hi"}),
              ("POST", "/detokenize", {"tokens": [1]}), ("GET", "/metrics", None),
              ("POST", "/scale_elastic_ep", {}), ("GET", "/v1/models", None),
              ("POST", "/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2})]
    for method, path, body in routes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 401, (method, path)
    request = urllib.request.Request(base + "/tokenize", data=b'{"prompt": "hi"}', method="POST", headers=key)
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    with urllib.request.urlopen(base + "/health", timeout=10) as answer:
        assert answer.status == 200


def test_the_key_is_in_no_environment_and_not_in_docker_inspect(link):
    key = link["api_key"]
    assert key not in _docker("node1", "inspect", "gpulab-vllm").stdout
    # Every process of the machine: the lab's nodes share its /proc (the server, the Ray head and workers, their
    # children on both nodes).
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if key.encode() in environ.read_bytes():
                found.append(environ.parent.name)
        except OSError:
            continue
    assert not found, f"the API key is in the environment of process(es) {found}"
    key_file = link["secrets_dir"] / "vllm_api_key"
    assert key_file.read_text() == key and key_file.stat().st_mode & 0o777 == 0o600


# --------------------------------------------------------------------------- status, repairs, heals
def test_status_of_a_healthy_cluster(link, tmp_path):
    lines, changed, output, rc = status(link)
    assert rc == 0 and changed == 0, output[-3000:]
    assert lines[0].split() == ["NODE", "ROLE", "RAY", "RAY", "NODE", "GPUS", "IMAGE", "CONTAINERS"]
    node1, node2 = line(lines, "node1 "), line(lines, "node2 ")
    assert node1.split()[1:5] == ["head", "alive", "10.220.0.11", "1.0"], node1
    assert "gpulab-ray-head:running" in node1 and "gpulab-vllm:running" in node1, node1
    assert node2.split()[1:5] == ["worker", "alive", "10.220.0.12", "1.0"], node2
    assert "gpulab-ray-worker:running" in node2 and "gpulab-vllm" not in node2, node2
    # The image column is the short image ID the node has, the same on both nodes.
    assert node1.split()[5] == node2.split()[5] and re.fullmatch(r"[0-9a-f]{12}", node1.split()[5])
    assert line(lines, "Ray: ").startswith("Ray: 2 alive, 0 dead, 0 pending, 2.0 GPU(s), Ray 2.60.0"), lines
    assert line(lines, "vLLM: ").startswith("vLLM: answers (vLLM 0.32.0, model tiny-llama)"), lines
    assert "Endpoint: http://10.210.0.11:8000/v1" in lines
    assert "Firewall node1: in place" in lines and "Firewall node2: in place" in lines, lines
    assert line(lines, "Verdict: ") == "Verdict: serving: vLLM answers at http://10.210.0.11:8000/v1"

    # The same verdict as one JSON document, for a monitor: printed and written to a file.
    written = tmp_path / "status.json"
    run = play(link, "status.yml", "-e", "status_format=json", "-e", f"status_file={written}")
    assert run.returncode == 0, run.stdout[-3000:]
    document = json.loads(written.read_text())
    assert document["verdict"] == "serving" and document["ok"] and document["problems"] == []
    assert [node["ray"]["state"] for node in document["nodes"]] == ["alive", "alive"]
    assert '"verdict": "serving"' in run.stdout and "Verdict: " not in run.stdout


def test_metrics_targets_answer_on_a_healthy_cluster(link, tmp_path):
    """metrics.yml: file_sd targets that answer, vLLM's with the key (this scraper is not in vllm_server_metrics_cidrs),
    Ray's on every node, and closed to the controller until fabric_firewall_allow opens it, as the play says."""
    key_file = tmp_path / "scraper.key"
    key_file.write_text(link["api_key"])
    run = play(link, "metrics.yml", "-e", f"metrics_dir={tmp_path / 'prometheus'}", "-e", f"metrics_key_file={key_file}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Ray's port is reachable only where fabric_firewall_allow opens it (not open yet)" in " ".join(run.stdout.split())
    scrape = yaml.safe_load((tmp_path / "prometheus" / "scrape.yml").read_text())["scrape_configs"]
    assert scrape[0]["authorization"] == {"type": "Bearer", "credentials_file": str(key_file)}
    vllm_targets = json.loads((tmp_path / "prometheus" / "vllm.json").read_text())
    ray_targets = json.loads((tmp_path / "prometheus" / "ray.json").read_text())
    assert [group["targets"] for group in vllm_targets] == [["10.210.0.11:8000"]]
    assert [group["labels"]["node"] for group in ray_targets] == ["node1", "node2"]
    request = urllib.request.Request(f"http://{vllm_targets[0]['targets'][0]}/metrics",
                                     headers={"Authorization": f"Bearer {link['api_key']}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200 and b"\nvllm:" in answer.read()
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    for group in ray_targets:
        node, target = group["labels"]["node"], group["targets"][0]
        assert "\nray_" in in_node(node, sys.executable, "-c", fetch, f"http://{target}/metrics").stdout, target
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{target}/metrics", timeout=3)


def test_an_accept_put_ahead_of_the_firewall_is_repaired_by_a_rerun(link):
    _in_node("node1", "iptables", "-I", "INPUT", "1", "-i", "eth0", "-j", "ACCEPT")
    assert _sweep_from("node2", [["10.210.0.11", 6379]]) == {"10.210.0.11 6379": "open"}
    status = play(link, "status.yml")
    # Drift is not the cluster as deployed: status says so and exits non-zero. The callback folds long lines.
    assert status.returncode != 0
    assert "Firewall node1: DRIFT: IPv4 the jump to GPULAB-INPUT is not the first rule of INPUT" in " ".join(status.stdout.split())
    assert "Verdict: degraded: node1: firewall drift" in " ".join(status.stdout.split()), status.stdout[-2000:]
    # The same inputs as the deploy: only the firewall differs.
    rerun = deploy(link)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert "node1: firewall drift repaired: IPv4 the jump to GPULAB-INPUT is not the first rule of INPUT" in \
        " ".join(rerun.stdout.split())
    assert re.search(r"^node1\s+:.*changed=[1-9]", rerun.stdout, re.M), rerun.stdout[-1500:]
    assert re.search(r"^node2\s+:.*changed=0", rerun.stdout, re.M), rerun.stdout[-1500:]
    assert _sweep_from("node2", [["10.210.0.11", 6379]]) == {"10.210.0.11 6379": "refused"}
    # The server was not restarted for it.
    assert "gpulab-vllm unchanged" in rerun.stdout


def test_a_dead_engine_is_named_and_the_server_started_again(link):
    """The dead-engine row: the engine core killed behind the live API of a serving cluster, the deploy run at once.
    Whether the deploy's node read still saw the server running (it exits by the proof, and is started again) or
    already stopped (started as any stopped server), the deploy says it started the server and proves a completion."""
    fault = faults.BY_KEY["dead-engine"]
    fault.seed()
    run = deploy(link)
    verdict = faults.judge(fault, run.stdout, faults.containers_now())
    assert run.returncode == 0, run.stdout[-3000:]
    assert verdict["named"], run.stdout[-3000:]
    # The endpoint block: the server answered a real completion after it was started again.
    assert re.search(r'it answered ".*" in [\d.]+ s', run.stdout), run.stdout[-3000:]


def test_a_killed_server_is_down_in_status_and_diagnosed(link, tmp_path):
    # The server killed: DOWN, with Docker's own reason, and the exit code says so.
    _docker("node1", "kill", "gpulab-vllm")
    lines, changed, output, rc = status(link)
    assert rc != 0 and changed == 0
    vllm = line(lines, "vLLM: ")
    assert vllm.startswith("vLLM: DOWN (") and "ended by SIGKILL (exit 137)" in vllm, vllm
    assert any(item.startswith("  node1 gpulab-vllm: ended by SIGKILL (exit 137)") for item in lines), lines
    assert line(lines, "Verdict: ").startswith("Verdict: down: "), lines
    assert "gpulab-vllm:exited" in line(lines, "node1 ")

    # diagnose.yml on the same failure: the first failing stage named, one archive, no secret in it, though a
    # gpulab container printed both secrets into its log and holds them in its environment.
    token, key = link["token"], link["api_key"]
    _docker("node1", "run", "--name", "gpulab-leak", "--label", "org.gpulab.vllm.role=leak", "-e", f"LEAKED={token}",
            "--entrypoint", "sh", lab_hosts()["all"]["vars"]["lab_ray_image"], "-c", f"echo ray token {token}; echo api key={key}")
    try:
        run = play(link, "diagnose.yml", "-e", f"diagnose_dir={tmp_path}")
    finally:
        _docker("node1", "rm", "-f", "gpulab-leak", check=False)
    assert run.returncode == 0, run.stdout[-3000:]
    said = " ".join(run.stdout.split())
    assert "first failing stage: vllm_server on node1: ended by SIGKILL (exit 137)" in said, run.stdout[-3000:]
    archives = list(tmp_path.glob("gpulab-diagnose-local_lab-*.tar.gz"))
    assert len(archives) == 1 and f"archive {archives[0]} (secrets redacted)" in said
    with tarfile.open(archives[0]) as tar:
        names = sorted(member.name.split("/", 1)[1] for member in tar.getmembers() if member.isfile())
        text = "".join(tar.extractfile(member).read().decode() for member in tar.getmembers() if member.isfile())
    assert {"node1/node.json", "node1/gpulab-ray-head.txt", "node1/gpulab-vllm.txt", "node1/gpulab-leak.txt",
            "node2/node.json", "node2/gpulab-ray-worker.txt", "cluster/ray.json", "cluster/vllm.json",
            "cluster/status.json", "cluster/first_failure.json"} <= set(names), names
    assert token not in text and key not in text
    assert "ray token <redacted ray_cluster_auth_token>" in text and "LEAKED=<redacted ray_cluster_auth_token>" in text
    # What a diagnosis needs is there: the fabric settings the Ray containers run with, the firewall, the log's cause.
    assert "NCCL_SOCKET_IFNAME=enP2p1s0f1np1" in text and "GPULAB-INPUT" in text


def test_a_killed_worker_is_lost_in_status_at_once(link):
    # The worker's Ray container killed: node2 is lost at once, though Ray has not noticed yet.
    _docker("node2", "kill", "gpulab-ray-worker")
    lines, _changed, output, rc = status(link)
    assert rc != 0
    node2 = line(lines, "node2 ")
    assert node2.split()[1:3] == ["worker", "lost"] and "gpulab-ray-worker:exited" in node2, node2
    assert any(item.startswith("  node2 gpulab-ray-worker: ended by SIGKILL (exit 137)") for item in lines), lines
    assert "node2: lost" in line(lines, "Verdict: ") or "node2: gpulab-ray-worker" in line(lines, "Verdict: "), lines
    for secret in (link["token"], link["api_key"]):
        assert secret not in output


def test_a_rerun_heals_the_lost_worker(link):
    """After the worker's Ray container was killed (and the server before it), the re-run restarted it and vLLM
    answered; the killed worker started again only after the head's GCS declared its old Ray node dead."""
    run = deploy(link)
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.search(r"node2\s+:\s+ok=\d+\s+changed=[1-9]", run.stdout), run.stdout[-1500:]
    assert "it answered" in run.stdout, run.stdout[-3000:]
    assert re.search(r"Wait until the head.s GCS has declared this worker.s old Ray node dead\][^\n]*\n((?!TASK \[).*\n)*?ok:\s\[node2",
                     run.stdout), run.stdout[-3000:]


def test_a_rerun_heals_the_head_after_its_docker_daemon_restarted(link):
    for verb in ("stop", "start"):
        subprocess.run([sys.executable, ROOT / "lab" / "labctl.py", "docker", "node1", verb], check=True,
                       capture_output=True, timeout=300)
    run = deploy(link)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "it answered" in run.stdout, run.stdout[-3000:]
    # The endpoint answers a real completion after both heals.
    request = urllib.request.Request("http://10.210.0.11:8000/v1/completions", method="POST",
                                     data=json.dumps({"model": "tiny-llama", "prompt": "hello", "max_tokens": 4}).encode(),
                                     headers={"Authorization": f"Bearer {link['api_key']}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert json.loads(answer.read())["choices"][0]["text"] is not None


# --------------------------------------------------------------------------- links with settings of their own
# After the shared links, in order, on the same deployment; each says what it changes. Their playbooks are the
# molecule scenarios' own (molecule/reboot, molecule/upgrade: each assertion a named task of verify.yml), which also
# run on their own with `molecule test -s NAME`.

def _scenario(name: str, folder: Path) -> None:
    env = dict(_env(), MOLECULE_PROJECT_DIRECTORY=str(ROOT), MOLECULE_EPHEMERAL_DIRECTORY=str(folder), ANSIBLE_NOCOLOR="1")
    for step in ("converge", "verify"):
        run = subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "molecule" / name / f"{step}.yml"],
                             cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1800)
        assert run.returncode == 0, f"molecule/{name}/{step}.yml failed:\n{run.stdout[-6000:]}"


def test_the_supervisors_bring_the_cluster_back_without_a_play(link, tmp_path):  # pylint: disable=unused-argument
    """Changes: the supervisor on, then its watchdog at a lab's pace (a probe every 5 s, two failures in a row).
    molecule/reboot: a crashed worker, the head's and the worker's Docker daemons restarted (a reboot, the firewall
    flushed), a firewall reload, a hung engine; each put back in order by the supervisors, with no play."""
    _scenario("reboot", tmp_path)


def test_upgrades_roll_back_twice_and_cut_over_once(link, tmp_path):  # pylint: disable=unused-argument
    """Changes: the supervisor off again (the inventory's default), then the image and vLLM's arguments.
    molecule/upgrade: an image whose vLLM cannot serve and arguments the model refuses each go back to the cluster that
    served; a good image cuts over, leaves nothing kept behind, and a re-run changes nothing."""
    _scenario("upgrade", tmp_path)
