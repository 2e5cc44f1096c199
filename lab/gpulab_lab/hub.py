"""A Hugging Face hub on the lab's own network, so that the weights role's hub source is tested with the real
huggingface_hub client (the public hub is out of reach here).

The mirror is olah (from the package index), which serves local git repositories offline: the lab model becomes a
git repository whose weight shards are Git LFS objects (pointer files in the tree, contents under .git/lfs/objects,
as git-lfs lays them out), so the hub's answers carry each file's size, git blob id and, for the shards, sha256, as
the public hub's do. It listens on the management gateway, where every node reaches the controller.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .common import BUILD, PROJECT, LabError, log, pid_alive, run, stop_pid
from .config import LabConfig

HUB = BUILD / "lab" / "hub"
VENV = BUILD / "lab" / "hub-venv"
REQUIREMENTS = PROJECT / "lab" / "hub" / "requirements.txt"
PORT = 8091
ORG, NAME = "gpulab", "tiny-llama"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


def _pid_file() -> Path:
    return Path("/run/gpulab-lab") / "hub.pid"


def ensure_venv() -> Path:
    """The mirror's own venv (made once, again when its requirements change)."""
    stamp = VENV / ".requirements.sha1"
    wanted = hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted:
        return VENV / "bin" / "olah-cli"
    shutil.rmtree(VENV, ignore_errors=True)
    log("hub: making the mirror's venv (olah) in %s" % VENV)
    run([sys.executable, "-m", "venv", str(VENV)])
    run([str(VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "-r", str(REQUIREMENTS)])
    stamp.write_text(wanted)
    return VENV / "bin" / "olah-cli"


def make_repository(model: Path) -> str:
    """The lab model as a hub repository (git, shards as LFS objects); its commit, the same for the same files."""
    repo = HUB / "mirrors" / "models" / ORG / NAME
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo)]
    run([*git, "init", "-q", "-b", "main"])
    for source in sorted(model.iterdir()):
        if not source.is_file():
            continue
        if source.name.endswith(LFS_SUFFIXES):
            data = source.read_bytes()
            oid = hashlib.sha256(data).hexdigest()
            objects = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4]
            objects.mkdir(parents=True, exist_ok=True)
            (objects / oid).write_bytes(data)
            (repo / source.name).write_text("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (oid, len(data)))
        else:
            shutil.copyfile(source, repo / source.name)
    run([*git, "add", "-A"])
    # Fixed dates and names: the same files give the same commit.
    env = dict(os.environ, GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z",
               GIT_AUTHOR_NAME="gpulab lab", GIT_AUTHOR_EMAIL="lab@gpulab.invalid",
               GIT_COMMITTER_NAME="gpulab lab", GIT_COMMITTER_EMAIL="lab@gpulab.invalid")
    subprocess.run([*git, "commit", "-q", "-m", "the lab model"], env=env, check=True)
    return run([*git, "rev-parse", "HEAD"]).stdout.strip()


def start(cfg: LabConfig, model: Path) -> dict:
    """The mirror up on the management gateway, serving the lab model; what a play needs to reach it."""
    commit = make_repository(model)
    olah = ensure_venv()
    stop()
    config = HUB / "olah.toml"
    config.write_text("\n".join([
        "[basic]", 'host = "%s"' % cfg.mgmt_gateway, "port = %d" % PORT,
        'mirrors-path = ["%s"]' % (HUB / "mirrors"), 'repos-path = "%s"' % (HUB / "repos"),
        'mirror-netloc = "%s:%d"' % (cfg.mgmt_gateway, PORT), 'mirror-lfs-netloc = "%s:%d"' % (cfg.mgmt_gateway, PORT),
        "[accessibility]", "offline = true", ""]))
    logs = BUILD / "lab" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "hub.log", "ab") as out:
        proc = subprocess.Popen([str(olah), "-c", str(config)], cwd=str(HUB), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    _pid_file().write_text("%d\n" % proc.pid)
    url = "http://%s:%d" % (cfg.mgmt_gateway, PORT)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen("%s/api/models/%s/%s/revision/main" % (url, ORG, NAME), timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LabError("the lab hub did not answer at %s; its log: %s" % (url, logs / "hub.log"))
        time.sleep(0.5)
    log("hub: %s serves %s/%s at commit %s" % (url, ORG, NAME, commit))
    return {"endpoint": url, "repo": "%s/%s" % (ORG, NAME), "commit": commit}


def stop() -> None:
    if pid_alive(_pid_file()) is not None:
        stop_pid(_pid_file(), timeout=10)
    _pid_file().unlink(missing_ok=True)
