"""The controller-side reads that spare a re-run a module: a model folder vouched for by its stamp, and whether a
controller file is in place. Real files in a temporary folder, read by the lookups' own code."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ansible_collections.gpulab.vllm.plugins.lookup import file_state, weights_stamped
from ansible_collections.gpulab.vllm.plugins.module_utils import _weights


def model(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "model-00001-of-00002.safetensors").write_bytes(os.urandom(4096))
    (root / "model-00002-of-00002.safetensors").write_bytes(os.urandom(2048))
    (root / "config.json").write_text('{"model_type": "llama"}')


def lookup(root: Path, stamp: Path) -> dict:
    return weights_stamped.LookupModule().run([str(root)], {}, stamp_file=str(stamp))[0]


def test_a_folder_without_a_stamp_is_left_to_the_module(tmp_path):
    model(tmp_path / "m")
    assert lookup(tmp_path / "m", tmp_path / "stamp.json") == {}
    assert not (tmp_path / "stamp.json").exists()


def test_a_stamped_folder_reads_as_the_module_read_it(tmp_path):
    root, stamp = tmp_path / "m", tmp_path / "stamps" / "s.json"
    model(root)
    by_module = _weights.read_folder(str(root), str(stamp))
    assert sorted(by_module["hashed"]) == sorted(by_module["files"])
    stamped = lookup(root, stamp)
    assert stamped["hashed"] == []
    # Free space is read live (other writers move it between two reads): only its presence is compared.
    live = ("hashed", "free_bytes")
    assert {k: v for k, v in stamped.items() if k not in live} == {k: v for k, v in by_module.items() if k not in live}
    assert stamped["free_bytes"] > 0
    assert stamped["files"]["config.json"]["sha256"] == hashlib.sha256(b'{"model_type": "llama"}').hexdigest()


def test_a_changed_added_or_removed_file_sends_the_read_back_to_the_module(tmp_path):
    root, stamp = tmp_path / "m", tmp_path / "s.json"
    model(root)
    _weights.read_folder(str(root), str(stamp))
    shard = root / "model-00002-of-00002.safetensors"
    info = shard.stat()
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    assert lookup(root, stamp) == {}
    _weights.read_folder(str(root), str(stamp))
    assert lookup(root, stamp) != {}
    (root / "tokenizer.json").write_text("{}")
    assert lookup(root, stamp) == {}
    _weights.read_folder(str(root), str(stamp))
    (root / "tokenizer.json").unlink()
    assert lookup(root, stamp) == {}


def test_the_lookup_writes_nothing(tmp_path):
    root, stamp = tmp_path / "m", tmp_path / "s.json"
    model(root)
    _weights.read_folder(str(root), str(stamp))
    before = stamp.stat().st_mtime_ns
    lookup(root, stamp)
    assert stamp.stat().st_mtime_ns == before


def test_file_state_says_content_mode_and_folder_mode(tmp_path):
    folder = tmp_path / "gpulab"
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    env = folder / "lab.env"
    assert file_state.describe(str(env)) == {"exists": False, "mode": None, "sha1": None, "dir_mode": "0700"}
    env.write_text("export OPENAI_API_KEY=secret\n")
    env.chmod(0o644)
    found = file_state.describe(str(env))
    assert found == {"exists": True, "mode": "0644", "sha1": hashlib.sha1(b"export OPENAI_API_KEY=secret\n").hexdigest(),
                     "dir_mode": "0700"}
    assert "secret" not in repr(found)
    assert file_state.describe(str(tmp_path / "none" / "x.env"))["dir_mode"] is None
