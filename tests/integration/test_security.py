"""Secure by default, shown on a real deployment in the lab.

One deploy at -vvv from nothing; then: no secret in its output, in the containers' logs or in
the files the roles wrote (but the token file); Ray refuses a client without the token; Ray's
GCS port answers on the fabric and not on the management network; vLLM answers 401 without
the API key.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

from labkit import BIN, LAB_INVENTORY as INVENTORY, ROOT, lab_hosts, node_docker as _docker, playbook_env as _env


@pytest.fixture(scope="module")
def deployed():
    lab_vars = lab_hosts()["all"]["vars"]
    subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / "teardown.yml"],
                   cwd=ROOT, env=_env(), capture_output=True, check=True)
    run = subprocess.run([BIN / "ansible-playbook", "-vvv", "-i", INVENTORY, ROOT / "playbooks" / "deploy_qwen35.yml"],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, check=False, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:]
    yield {"output": run.stdout + run.stderr, "token": lab_vars["ray_cluster_auth_token"],
           "api_key": lab_vars["vllm_server_api_key"], "secrets_dir": Path(lab_vars["gpulab_secrets_dir"]),
           "config_dir": Path(lab_vars["vllm_server_config_dir"])}
    subprocess.run([BIN / "ansible-playbook", "-i", INVENTORY, ROOT / "playbooks" / "teardown.yml"],
                   cwd=ROOT, env=_env(), capture_output=True, check=False)


def test_no_secret_in_the_verbose_output_the_logs_or_the_files(deployed):
    secrets = {"Ray token": deployed["token"], "API key": deployed["api_key"]}
    assert len(deployed["output"]) > 10000, "a -vvv deploy prints a lot; this output is suspiciously short"
    places = {"ansible-playbook -vvv": deployed["output"]}
    for node, names in (("node1", ["gpulab-ray-head", "gpulab-vllm"]), ("node2", ["gpulab-ray-worker"])):
        for name in names:
            logs = _docker(node, "logs", name)
            places[f"docker logs {name} on {node}"] = logs.stdout + logs.stderr
    for folder in (deployed["secrets_dir"], deployed["config_dir"]):
        for path in folder.rglob("*") if folder.exists() else []:
            if path.is_file() and path.name != "ray_token":
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
