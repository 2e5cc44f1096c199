"""The hub fetch's proof (roles/weights/files/hub_fetch.py): a file's sha256 and git blob id, judged against what a hub
publishes. The blob id is checked against git's own `git hash-object`, which computes what the hub publishes."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("hub_fetch", REPO / "roles" / "weights" / "files" / "hub_fetch.py")
hub_fetch = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(hub_fetch)


def test_the_blob_id_is_gits_and_the_sha256_is_the_files(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "llama"}\n' + os.urandom(3000))
    sha256, blob = hub_fetch.digests(str(path))
    assert sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert blob == subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()


def test_the_proof_names_what_differs_from_what_the_hub_published(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 5000)
    (tmp_path / "config.json").write_bytes(b"{}")
    (tmp_path / "short.safetensors").write_bytes(b"y" * 10)
    good_sha = hashlib.sha256(b"x" * 5000).hexdigest()
    git_blob = subprocess.run(["git", "hash-object", str(tmp_path / "config.json")], capture_output=True, text=True,
                              check=True).stdout.strip()
    want = {
        "a.safetensors": {"size": 5000, "sha256": good_sha, "blob_id": "0" * 40},  # LFS: judged on its sha256
        "config.json": {"size": 2, "sha256": None, "blob_id": git_blob},           # not LFS: on its blob id
        "short.safetensors": {"size": 100, "sha256": "1" * 64, "blob_id": None},
        "missing.json": {"size": 7, "sha256": None, "blob_id": "2" * 40},
    }
    manifest, problems = hub_fetch.prove(str(tmp_path), want)
    assert manifest["a.safetensors"] == {"size": 5000, "sha256": good_sha}
    assert [(p["file"], p["problem"]) for p in problems] == [("missing.json", "missing"), ("short.safetensors", "size")]
    want["config.json"]["blob_id"] = "3" * 40
    assert [(p["file"], p["expected"][:8]) for p in hub_fetch.prove(str(tmp_path), want)[1]][0] == ("config.json", "git blob")


def test_what_a_hub_publishes_for_a_revision(tmp_path):
    """A tree recorded from the lab's hub mirror (olah 0.5.4) through huggingface_hub: the shards are LFS files with
    their sha256, the others are judged on their git blob id."""
    import json  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415

    recorded = json.loads((REPO / "tests" / "unit" / "fixtures" / "hub" / "olah-0.5.4_tiny-llama.json").read_text())
    entries = [SimpleNamespace(**e) for e in recorded["tree"]]
    want = hub_fetch.published(entries)
    shards = sorted(p for p in want if p.endswith(".safetensors"))
    assert shards == ["model-0000%d-of-00003.safetensors" % i for i in (1, 2, 3)]
    assert all(len(want[p]["sha256"]) == 64 and want[p]["size"] > 100_000 for p in shards)
    assert want["config.json"]["sha256"] is None and len(want["config.json"]["blob_id"]) == 40
    assert len(want) == 9
