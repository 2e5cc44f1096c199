"""Secure by default, shown on a real deployment in the lab.

One deploy at -vvv from nothing; then: no secret in its output, in the containers' logs or in
the files the roles wrote (but the token and key files); Ray refuses a client without the token; Ray's
GCS port answers on the fabric and not on the management network; vLLM answers 401 without
the API key, on every route; from the other node's management side, over IPv4 and IPv6, only SSH
answers; an ACCEPT put ahead of the firewall is found and repaired.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, lab_hosts, node_docker as _docker, playbook_env as _env


EXTRA_SECRET = "hf_" + "e" * 37


@pytest.fixture(scope="module")
def deployed():
    lab_vars = lab_hosts()["all"]["vars"]
    subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / "teardown.yml"],
                   cwd=ROOT, env=_env(), capture_output=True, check=True)
    # A token in the extra environment of both roles (as HF_TOKEN would be) must not print at any verbosity either.
    group_vars = yaml.safe_load((INVENTORY / "group_vars" / "all.yml").read_text())
    extra = {"vllm_server_extra_env": dict(group_vars.get("vllm_server_extra_env") or {}, HF_TOKEN=EXTRA_SECRET),
             "ray_cluster_extra_env": {"HF_TOKEN": EXTRA_SECRET}}
    run = subprocess.run([BIN / "ansible-playbook", "-vvv", "-i", INVENTORY, ROOT / "playbooks" / "deploy_qwen35.yml",
                          "-e", json.dumps(extra)],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, check=False, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:]
    yield {"output": run.stdout + run.stderr, "extra": extra, "token": lab_vars["ray_cluster_auth_token"],
           "api_key": lab_vars["vllm_server_api_key"], "secrets_dir": Path(lab_vars["gpulab_secrets_dir"]),
           "config_dir": Path(lab_vars["vllm_server_config_dir"])}
    subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / "teardown.yml"],
                   cwd=ROOT, env=_env(), capture_output=True, check=False)


def test_no_secret_in_the_verbose_output_the_logs_or_the_files(deployed):
    secrets = {"Ray token": deployed["token"], "API key": deployed["api_key"]}
    assert len(deployed["output"]) > 10000, "a -vvv deploy prints a lot; this output is suspiciously short"
    places = {"ansible-playbook -vvv": deployed["output"]}
    # The block the deploy ends with says where the key lives and how to use it, without the key itself.
    assert "(mode 0600) holds it with the endpoint. Call it:" in deployed["output"]
    assert 'Authorization: Bearer $OPENAI_API_KEY' in deployed["output"]
    assert EXTRA_SECRET not in deployed["output"], "a value of the extra environment is in the -vvv output"
    for node, names in (("node1", ["gpulab-ray-head", "gpulab-vllm"]), ("node2", ["gpulab-ray-worker"])):
        for name in names:
            logs = _docker(node, "logs", name)
            places[f"docker logs {name} on {node}"] = logs.stdout + logs.stderr
    for folder in (deployed["secrets_dir"], deployed["config_dir"]):
        for path in folder.rglob("*") if folder.exists() else []:
            if path.is_file() and path.name not in ("ray_token", "vllm_api_key"):
                places[str(path)] = path.read_text(errors="replace")
    for what, secret in secrets.items():
        for place, text in places.items():
            assert secret not in text, f"the {what} appears in {place}"


def test_token_file_is_root_only(deployed):
    token = deployed["secrets_dir"] / "ray_token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert token.parent.stat().st_mode & 0o777 == 0o700
    assert token.stat().st_uid == 0


def test_ray_refuses_a_client_without_the_token(deployed):
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


def test_gcs_port_answers_on_the_fabric_only(deployed):
    assert _connect_from("node2", "10.220.0.11", 6379) == "open"
    assert _connect_from("node2", "10.210.0.11", 6379) == "refused"


def test_vllm_without_the_key_gets_401(deployed):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen("http://10.210.0.11:8000/v1/models", timeout=10)
    assert err.value.code == 401
    request = urllib.request.Request("http://10.210.0.11:8000/v1/models",
                                     headers={"Authorization": f"Bearer {deployed['api_key']}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def test_no_recorded_fixture_holds_this_labs_secrets():
    """The unit tests' fixtures are recorded from a lab; none may carry the lab's token or key (the
    recorder redacts them). Checked here, where the lab and its secrets exist."""
    lab_vars = lab_hosts()["all"]["vars"]
    secrets = [lab_vars["ray_cluster_auth_token"], lab_vars["vllm_server_api_key"]]
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


def test_every_listener_of_the_head_is_refused_from_the_office_side_but_ssh(deployed):
    ports = _listening("node1")
    assert {22, 6379, 8000} <= set(ports) and len(ports) > 8, ports
    v4 = _sweep_from("node2", [["10.210.0.11", port] for port in ports])
    assert {target: state for target, state in v4.items() if state != "refused"} == {"10.210.0.11 22": "open"}
    # IPv6 link-local on the management interface: no rule of an IPv4-only firewall would see it.
    v6 = _sweep_from("node2", [[f"{_link_local('node1')}%eth0", port] for port in ports])
    assert set(v6.values()) == {"refused"}, v6
    # The fabric still carries Ray.
    assert _sweep_from("node2", [["10.220.0.11", 6379]]) == {"10.220.0.11 6379": "open"}


def test_a_new_listener_is_refused_from_the_office_side_and_open_on_the_fabric(deployed):
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


def test_every_route_needs_the_key(deployed):
    """vLLM's own --api-key guards /v1 only; the collection's key check guards every route but liveness."""
    base = "http://10.210.0.11:8000"
    key = {"Authorization": f"Bearer {deployed['api_key']}", "Content-Type": "application/json"}
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


def test_the_key_is_in_no_environment_and_not_in_docker_inspect(deployed):
    key = deployed["api_key"]
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
    key_file = deployed["secrets_dir"] / "vllm_api_key"
    assert key_file.read_text() == key and key_file.stat().st_mode & 0o777 == 0o600


def test_an_accept_put_ahead_of_the_firewall_is_repaired_by_a_rerun(deployed):
    _in_node("node1", "iptables", "-I", "INPUT", "1", "-i", "eth0", "-j", "ACCEPT")
    assert _sweep_from("node2", [["10.210.0.11", 6379]]) == {"10.210.0.11 6379": "open"}
    status = subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / "status.yml"],
                            cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    # Drift is not the cluster as deployed: status says so and exits non-zero. The callback folds long lines.
    assert status.returncode != 0
    assert "Firewall node1: DRIFT: IPv4 the jump to GPULAB-INPUT is not the first rule of INPUT" in " ".join(status.stdout.split())
    assert "Verdict: degraded: node1: firewall drift" in " ".join(status.stdout.split()), status.stdout[-2000:]
    # The same inputs as the deploy (its extra environment included): only the firewall differs.
    rerun = subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / "deploy_qwen35.yml",
                            "-e", json.dumps(deployed["extra"])],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, check=False, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert "node1: firewall drift repaired: IPv4 the jump to GPULAB-INPUT is not the first rule of INPUT" in \
        " ".join(rerun.stdout.split())
    assert re.search(r"^node1\s+:.*changed=[1-9]", rerun.stdout, re.M), rerun.stdout[-1500:]
    assert re.search(r"^node2\s+:.*changed=0", rerun.stdout, re.M), rerun.stdout[-1500:]
    assert _sweep_from("node2", [["10.210.0.11", 6379]]) == {"10.210.0.11 6379": "refused"}
    # The server was not restarted for it.
    assert "gpulab-vllm unchanged" in rerun.stdout
