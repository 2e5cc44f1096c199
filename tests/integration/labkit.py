"""What the lab tests share: paths, the environment of a playbook run, the lab's inventory, node daemons, an image
built for another architecture, and the Chain that the links of one deployment share (conftest.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
LAB_INVENTORY = ROOT / "inventories" / "local_lab"
RUN = Path("/run/gpulab-lab")


def playbook_env() -> dict:
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                PATH=f"{BIN}:{os.environ['PATH']}")


def lab_hosts() -> dict:
    """The generated inventory of the lab that is up (a YAML document)."""
    path = LAB_INVENTORY / "hosts.yml"
    if not path.exists():
        pytest.fail("the lab is not up: run `make lab-up` first (inventories/local_lab/hosts.yml is missing)")
    return yaml.safe_load(path.read_text())


def in_node(node: str, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command in a lab node's network namespace (its own addresses, routes and firewall)."""
    import sys  # noqa: PLC0415 - the lab's own naming, loaded on demand

    if str(ROOT / "lab") not in sys.path:
        sys.path.insert(0, str(ROOT / "lab"))
    from gpulab_lab.common import ns_name  # noqa: PLC0415

    return subprocess.run(["ip", "netns", "exec", ns_name(node), *cmd], capture_output=True, text=True, check=check,
                          timeout=timeout)


def node_docker(node: str, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run the docker client against one lab node's own daemon (stdin: what the client reads, a Dockerfile say)."""
    sock = RUN / node / "run" / "docker.sock"
    return subprocess.run(["docker", "-H", f"unix://{sock}", *args], capture_output=True, text=True, input=stdin,
                          check=check, timeout=180)


def single_file_image(ref: str, arch: str, folder: Path) -> tuple[str, str]:
    """An image of one file (no program) built for linux/ARCH, in this machine's Docker as ref; how it was made, and
    the architecture `docker import` gave it.

    `docker import --platform` sets the architecture on recent engines; Docker 20.10 keeps its own. Then the image
    is the same with its config saying ARCH (and variant v8 for arm64), saved and loaded again."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README").write_text(f"one file, no program, built for linux/{arch}\n")
    with tarfile.open(folder / "one.tar", "w") as tar:
        tar.add(folder / "README", arcname="README")

    def docker(*args: str, **kwargs) -> str:
        return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120, **kwargs).stdout.strip()

    docker("import", "--platform", f"linux/{arch}", "-m", f"one file for {arch}", str(folder / "one.tar"), ref)
    made = f"docker import --platform linux/{arch} one.tar {ref}"
    imported_arch = docker("image", "inspect", "--format", "{{.Architecture}}", ref)
    if imported_arch == arch:
        return made, imported_arch
    imported = docker("image", "inspect", "--format", "{{.Id}}", ref)
    save = folder / "save"
    save.mkdir()
    with subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE) as proc:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(save)
    entry = json.loads((save / "manifest.json").read_text())[0]
    config = json.loads((save / entry["Config"]).read_text())
    config.update(architecture=arch, **({"variant": "v8"} if arch == "arm64" else {}))
    raw = json.dumps(config, separators=(",", ":")).encode()
    (save / entry["Config"]).unlink()
    name = hashlib.sha256(raw).hexdigest() + ".json"
    (save / name).write_bytes(raw)
    (save / "manifest.json").write_text(json.dumps([{"Config": name, "RepoTags": [ref], "Layers": entry["Layers"]}]))
    (save / "repositories").unlink(missing_ok=True)
    with tarfile.open(folder / "image.tar", "w") as tar:
        for path in sorted(save.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(save)), recursive=False)
    docker("load", "-i", str(folder / "image.tar"))
    subprocess.run(["docker", "image", "rm", imported], capture_output=True, check=False, timeout=60)
    if docker("image", "inspect", "--format", "{{.Architecture}}", ref) != arch:
        raise RuntimeError(f"could not make an image for linux/{arch} as {ref}")
    return (made + f"; the engine made it {imported_arch}: docker save, the config's architecture set to {arch}"
            + (" and variant to v8" if arch == "arm64" else "") + f", docker load as {ref}"), imported_arch


class Chain(dict):
    """What the links of one chain share (the deployment's inputs and outputs), and the first link that failed."""

    def __init__(self, name: str, **shared):
        super().__init__(shared)
        self.name = name
        self.broken_by: str | None = None
