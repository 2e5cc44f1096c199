"""The collection builds, installs from its tarball beside only the collections galaxy.yml declares, on ansible-core
alone, and resolves from there: by FQCN, and every name its code uses (names_resolve.py)."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
# The ansible package in .venv brings community.docker and the rest; the dependencies are installed from it, offline.
BUNDLED = Path(sysconfig.get_paths()["purelib"]) / "ansible_collections"
# Kept between runs: a virtual environment per ansible-core version, and the dependencies' tarballs.
CACHE = ROOT / "build" / "collection"


def run(cmd, env=None, cwd=ROOT):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def core_alone() -> Path:
    """A virtual environment that holds ansible-core alone (no ansible package, so no collection), at .venv's
    version: made once per version under build/collection/ (pip reuses its cache of wheels)."""
    version = metadata.version("ansible-core")
    venv = CACHE / f"core-{version}"
    stamp = venv / ".installed"
    if not (stamp.exists() and stamp.read_text() == version):
        shutil.rmtree(venv, ignore_errors=True)
        # No pip of its own (ensurepip is most of a venv's making): .venv's pip installs into it.
        run([sys.executable, "-m", "venv", "--without-pip", venv])
        run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet",
             "--disable-pip-version-check", f"ansible-core=={version}"])
        stamp.write_text(version)
    return venv / "bin"


def dependency_tarballs(core_bin: Path, env: dict, work: Path) -> list:
    """A tarball of each collection galaxy.yml declares, and of theirs, built from .venv's ansible package (its copies
    are installed collections, whose MANIFEST.json names files it no longer ships: each is built again from a
    galaxy.yml written from that MANIFEST.json)."""
    wanted = list((yaml.safe_load((ROOT / "galaxy.yml").read_text()).get("dependencies") or {}))
    tarballs = {}
    while wanted:
        fqcn = wanted.pop()
        if fqcn in tarballs:
            continue
        source = BUNDLED.joinpath(*fqcn.split("."))
        if not (source / "MANIFEST.json").exists():
            pytest.fail(f"{fqcn}, a dependency, is not in the ansible package of .venv ({BUNDLED}); Galaxy is not asked")
        info = json.loads((source / "MANIFEST.json").read_text())["collection_info"]
        tarball = CACHE / "dependencies" / f"{info['namespace']}-{info['name']}-{info['version']}.tar.gz"
        if not tarball.exists():
            copy = work / fqcn
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "MANIFEST.json", "FILES.json"))
            galaxy = {key: value for key, value in info.items() if value not in (None, "", [], {})}
            galaxy["dependencies"] = info.get("dependencies") or {}
            (copy / "galaxy.yml").write_text(json.dumps(galaxy))
            run([core_bin / "ansible-galaxy", "collection", "build", "--force", "--output-path", tarball.parent, copy], env=env)
        tarballs[fqcn] = tarball
        wanted.extend(info.get("dependencies") or {})
    return list(tarballs.values())


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    core_bin = core_alone()
    # An empty configuration: this checkout's ansible.cfg links the checkout in as the collection,
    # and ansible-galaxy would then find it "already installed".
    config = tmp_path_factory.mktemp("config") / "ansible.cfg"
    config.write_text("[defaults]\n")
    dest = tmp_path_factory.mktemp("collections")
    # Only dest: not ~/.ansible/collections, and not the collections of a Python's own site-packages.
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(dest), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_CONFIG=str(config), PATH=f"{core_bin}:{os.environ.get('PATH', '')}")
    out = tmp_path_factory.mktemp("dist")
    run([core_bin / "ansible-galaxy", "collection", "build", "--output-path", out, "."], env=env)
    tarballs = list(out.glob("gpulab-vllm-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    dependencies = dependency_tarballs(core_bin, env, tmp_path_factory.mktemp("dependencies"))
    # Offline, with the dependencies resolved: galaxy.yml's requirements must be met by the tarballs given.
    run([core_bin / "ansible-galaxy", "collection", "install", "--offline", "-p", dest, tarballs[0], *dependencies], env=env)
    assert (dest / "ansible_collections" / "gpulab" / "vllm" / "MANIFEST.json").exists()
    return tarballs[0], dest, env, core_bin


def test_tarball_ships_the_collection_and_nothing_of_the_lab(installed):
    tarball = installed[0]
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    for shipped in ("MANIFEST.json", "meta/runtime.yml", "roles/fabric/tasks/main.yml",
                    "playbooks/deploy_qwen35.yml", "plugins/filter/fabric.py"):
        assert shipped in names or any(n.endswith(shipped) for n in names), shipped
    for kept_out in ("molecule", "tests", "inventories", "lab", "build", ".venv"):
        assert not any(n == kept_out or n.startswith(kept_out + "/") for n in names), kept_out


@pytest.mark.parametrize("kind, folder", [("module", "modules"), ("lookup", "lookup")])
def test_documented_plugins_resolve_by_fqcn_from_the_install(installed, kind, folder):
    # Their documentation fragments too: one of an undeclared collection would not resolve.
    dest, env, core_bin = installed[1:]
    names = sorted(f"gpulab.vllm.{path.stem}" for path in (ROOT / "plugins" / folder).glob("*.py"))
    out = run([core_bin / "ansible-doc", "-t", kind, *names], env=env, cwd=dest)
    for name in names:
        assert name in out, name


def test_roles_and_playbooks_resolve_from_the_install(installed):
    dest, env, core_bin = installed[1:]
    out = run([core_bin / "ansible-doc", "-t", "role", "gpulab.vllm.fabric"], env=env, cwd=dest)
    assert "fabric_subnet" in out
    playbooks = sorted(f"gpulab.vllm.{path.stem}" for path in (ROOT / "playbooks").glob("*.yml"))
    out = run([core_bin / "ansible-playbook", "--syntax-check", "-i", ROOT / "inventories" / "spark_lab", *playbooks],
              env=env, cwd=dest)
    assert "deploy_qwen35" in out


def test_every_name_the_code_uses_resolves_with_the_declared_dependencies_alone(installed):
    # Each task's module, each role, each filter, test and lookup, and each plugin's imports (names_resolve.py):
    # a filter of a collection galaxy.yml does not declare fails here, not on an operator's controller.
    dest, env, core_bin = installed[1:]
    run([core_bin / "python", Path(__file__).with_name("names_resolve.py"), "gpulab.vllm"], env=env, cwd=dest)


def test_spark_lab_inventory_is_data_we_can_read():
    out = run([BIN / "ansible-inventory", "-i", "inventories/spark_lab", "--graph"])
    assert "@ray_head:" in out and "spark-1" in out and "@ray_workers:" in out and "spark-2" in out
    out = run([BIN / "ansible-inventory", "-i", "inventories/spark_lab", "--host", "spark-1"])
    assert '"fabric_address": "192.168.200.12"' in out and '"fabric_subnet": "192.168.200.0/24"' in out


@pytest.mark.parametrize("playbook", ["deploy.yml", "deploy_qwen35.yml", "status.yml", "teardown.yml"])
def test_playbooks_pass_syntax_check_on_the_spark_lab(playbook):
    run([BIN / "ansible-playbook", "--syntax-check", "-i", "inventories/spark_lab", f"playbooks/{playbook}"],
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
