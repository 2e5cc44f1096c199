"""The collection builds, installs from its tarball, and resolves by FQCN from there."""

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"


def run(cmd, env=None, cwd=ROOT):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    # An empty configuration: this checkout's ansible.cfg links the checkout in as the collection,
    # and ansible-galaxy would then find it "already installed".
    config = tmp_path_factory.mktemp("config") / "ansible.cfg"
    config.write_text("[defaults]\n")
    dest = tmp_path_factory.mktemp("collections")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(dest), ANSIBLE_CONFIG=str(config))
    out = tmp_path_factory.mktemp("dist")
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", out, "."], env=env)
    tarballs = list(out.glob("gpulab-vllm-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    # Dependencies (community.docker) come with the ansible package; Galaxy is not contacted.
    run([BIN / "ansible-galaxy", "collection", "install", "--no-deps", "-p", dest, tarballs[0]], env=env)
    assert (dest / "ansible_collections" / "gpulab" / "vllm" / "MANIFEST.json").exists()
    return tarballs[0], dest, env


def test_tarball_ships_the_collection_and_nothing_of_the_lab(installed):
    tarball = installed[0]
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    for shipped in ("MANIFEST.json", "meta/runtime.yml", "roles/fabric/tasks/main.yml",
                    "playbooks/deploy_qwen35.yml", "plugins/filter/fabric.py"):
        assert shipped in names or any(n.endswith(shipped) for n in names), shipped
    for kept_out in ("molecule", "tests", "inventories", "lab", "build", ".venv"):
        assert not any(n == kept_out or n.startswith(kept_out + "/") for n in names), kept_out


@pytest.mark.parametrize("module", ["gpulab.vllm.ray_cluster_facts", "gpulab.vllm.vllm_health"])
def test_modules_resolve_by_fqcn_from_the_install(installed, module):
    dest, env = installed[1:]
    out = run([BIN / "ansible-doc", module], env=env, cwd=dest)
    assert f"({dest}" in out or module.split(".")[-1] in out


def test_roles_and_playbooks_resolve_from_the_install(installed):
    dest, env = installed[1:]
    out = run([BIN / "ansible-doc", "-t", "role", "gpulab.vllm.fabric"], env=env, cwd=dest)
    assert "fabric_subnet" in out
    out = run([BIN / "ansible-playbook", "--syntax-check", "-i", ROOT / "inventories" / "spark_lab",
               "gpulab.vllm.deploy_qwen35"], env=env, cwd=dest)
    assert "deploy_qwen35" in out


def test_spark_lab_inventory_is_data_we_can_read():
    out = run([BIN / "ansible-inventory", "-i", "inventories/spark_lab", "--graph"])
    assert "@ray_head:" in out and "spark-1" in out and "@ray_workers:" in out and "spark-2" in out
    out = run([BIN / "ansible-inventory", "-i", "inventories/spark_lab", "--host", "spark-1"])
    assert '"fabric_address": "192.168.200.12"' in out and '"fabric_subnet": "192.168.200.0/24"' in out


@pytest.mark.parametrize("playbook", ["deploy.yml", "deploy_qwen35.yml", "status.yml", "teardown.yml"])
def test_playbooks_pass_syntax_check_on_the_spark_lab(playbook):
    run([BIN / "ansible-playbook", "--syntax-check", "-i", "inventories/spark_lab", f"playbooks/{playbook}"],
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
