"""The model's proof and its copy: manifests and stamps on real files, the plan of rounds, and a real copy server
and client on loopback (resume, a wrong token, bytes that do not match the manifest)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights, _weights_fetch

REPO = Path(__file__).resolve().parents[4]
SERVER = REPO / "roles" / "weights" / "files" / "weights_server.py"


def make_model(root: Path, shards=(300_000, 200_000)) -> dict:
    """A folder shaped like a sharded safetensors model, with random bytes of the given sizes."""
    root.mkdir(parents=True, exist_ok=True)
    names = ["model-%05d-of-%05d.safetensors" % (i + 1, len(shards)) for i in range(len(shards))]
    for name, size in zip(names, shards):
        (root / name).write_bytes(os.urandom(size))
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"layer.%d.weight" % i: name for i, name in enumerate(names)}}))
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "tokenizer.json").write_text('{"version": "1.0"}')
    return _weights.strip(_weights.manifest(str(root))[0])


def test_manifest_lists_the_models_files_and_not_the_collections_own(tmp_path):
    expected = make_model(tmp_path / "m")
    (tmp_path / "m" / ".gpulab-manifest.json").write_text("{}")
    (tmp_path / "m" / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / "m" / ".cache" / "huggingface" / "x.lock").write_text("")
    assert sorted(expected) == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                "model.safetensors.index.json", "sub/tokenizer.json"]
    data = (tmp_path / "m" / "model-00001-of-00002.safetensors").read_bytes()
    assert expected["model-00001-of-00002.safetensors"] == {"size": 300_000, "sha256": hashlib.sha256(data).hexdigest()}


def test_a_stamp_spares_the_reading_of_unchanged_files_and_not_of_changed_ones(tmp_path):
    make_model(tmp_path / "m")
    files, hashed = _weights.manifest(str(tmp_path / "m"))
    assert len(hashed) == 5
    again, hashed = _weights.manifest(str(tmp_path / "m"), stamp=files)
    assert hashed == [] and _weights.strip(again) == _weights.strip(files)
    shard = tmp_path / "m" / "model-00002-of-00002.safetensors"
    with open(shard, "r+b") as stream:  # truncated: size and mtime change
        stream.truncate(1000)
    after, hashed = _weights.manifest(str(tmp_path / "m"), stamp=files)
    assert hashed == ["model-00002-of-00002.safetensors"]
    # full trusts no stamp
    assert len(_weights.manifest(str(tmp_path / "m"), stamp=after, full=True)[1]) == 5


def test_compare_names_missing_truncated_and_corrupt_files(tmp_path):
    expected = make_model(tmp_path / "m")
    copy = dict(expected)
    del copy["config.json"]
    copy["model-00002-of-00002.safetensors"] = {"size": 1000, "sha256": "0" * 64}
    copy["sub/tokenizer.json"] = dict(copy["sub/tokenizer.json"], sha256="f" * 64)
    problems = _weights.compare(expected, copy)
    assert [(p["file"], p["problem"]) for p in problems] == [
        ("config.json", "missing"), ("model-00002-of-00002.safetensors", "size"), ("sub/tokenizer.json", "sha256")]
    lines = [_weights.describe(p) for p in problems]
    assert lines[1] == "model-00002-of-00002.safetensors: truncated (expected 200000 bytes, found 1000 bytes)"
    assert lines[2].startswith("sub/tokenizer.json: corrupt (expected sha256 ")
    assert _weights.compare(expected, expected) == []


def test_the_index_names_a_shard_the_folder_lacks(tmp_path):
    make_model(tmp_path / "m")
    os.unlink(tmp_path / "m" / "model-00001-of-00002.safetensors")
    present = set(_weights.walk(str(tmp_path / "m")))
    assert _weights.index_problems(str(tmp_path / "m"), present) == [
        {"file": "model-00001-of-00002.safetensors", "problem": "missing",
         "expected": "a shard model.safetensors.index.json names", "found": "absent"}]


@pytest.mark.parametrize("holders, targets, rounds", [
    (["@source"], ["node1"], [{"node1": "@source"}]),
    # the second node copies from the first over the fabric, not from the source across the management network
    (["@source"], ["node1", "node2"], [{"node1": "@source"}, {"node2": "node1"}]),
    (["@source"], ["node1", "node2", "node3"], [{"node1": "@source"}, {"node2": "node1", "node3": "@source"}]),
    (["@source", "node1"], ["node2", "node3", "node4"], [{"node2": "node1", "node3": "@source"}, {"node4": "node1"}]),
    (["node1", "node2", "@source"], ["node2"], []),
])
def test_the_plan_doubles_the_holders_every_round(holders, targets, rounds):
    assert _weights.spread_plan(holders, targets) == rounds


@pytest.mark.parametrize("nodes, expected_rounds", [(1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (15, 4), (64, 7)])
def test_n_nodes_from_one_source_take_log2_rounds(nodes, expected_rounds):
    plan = _weights.spread_plan(["@source"], ["node%d" % i for i in range(1, nodes + 1)])
    assert len(plan) == expected_rounds  # ceil(log2(nodes + 1))


def test_no_holder_is_refused():
    with pytest.raises(ValueError, match="no node holds the model"):
        _weights.spread_plan([], ["node1"])


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def served(tmp_path):
    """A real copy server (the role's script) on loopback, serving a model folder."""
    expected = make_model(tmp_path / "src", shards=(3_000_000, 2_000_000, 1_000_000))
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--bind", "127.0.0.1", "--port", str(port), "--root", str(tmp_path / "src"),
                             "--token-file", str(token), "--pid-file", str(tmp_path / "pid"), "--idle", "30"])
    deadline = time.monotonic() + 120  # generous: CI runs unit tests at nice 19 beside the lab
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield {"url": "http://127.0.0.1:%d" % port, "expected": expected, "root": tmp_path, "proc": proc}
    proc.terminate()
    proc.wait(5)


def test_a_copy_arrives_whole_and_proven(served):
    dest = served["root"] / "dst"
    copier = _weights_fetch.Copier(str(dest), served["url"], "s3cret-token", served["expected"], streams=3).run()
    assert copier.errors == [] and copier.left == []
    assert _weights.compare(served["expected"], _weights.manifest(str(dest))[0]) == []
    assert not any((dest / _weights.PARTIAL_DIR).rglob("*.safetensors"))
    assert set(copier.done) == set(served["expected"])


def test_a_cut_off_copy_resumes_where_it_stopped(served):
    dest = served["root"] / "dst"
    rel = "model-00001-of-00003.safetensors"
    source = served["root"] / "src" / rel
    part = Path(_weights_fetch.partial_path(str(dest), rel))
    part.parent.mkdir(parents=True)
    part.write_bytes(source.read_bytes()[:1_234_567])  # what a cut-off run left
    copier = _weights_fetch.Copier(str(dest), served["url"], "s3cret-token", {rel: served["expected"][rel]}).run()
    assert copier.errors == [] and copier.resumed == 1_234_567
    assert copier.received == served["expected"][rel]["size"] - 1_234_567
    assert (dest / rel).read_bytes() == source.read_bytes()


def test_a_deadline_leaves_partial_copies_that_the_next_call_continues(served):
    dest = served["root"] / "dst"
    first = _weights_fetch.Copier(str(dest), served["url"], "s3cret-token", served["expected"], streams=1,
                                  deadline=time.monotonic()).run()
    assert first.left == sorted(served["expected"]) and first.errors == []
    second = _weights_fetch.Copier(str(dest), served["url"], "s3cret-token", served["expected"], streams=2).run()
    assert second.left == [] and _weights.compare(served["expected"], _weights.manifest(str(dest))[0]) == []


def test_a_wrong_token_is_refused_with_one_line(served):
    copier = _weights_fetch.Copier(str(served["root"] / "dst"), served["url"], "guess", served["expected"]).run()
    assert copier.errors and copier.errors[0] == "the copy at %s refused this run's token" % served["url"]


def test_bytes_that_differ_from_the_manifest_are_fetched_again_then_refused(served):
    rel = sorted(served["expected"])[0]
    wrong = {rel: dict(served["expected"][rel], sha256="0" * 64)}
    copier = _weights_fetch.Copier(str(served["root"] / "dst"), served["url"], "s3cret-token", wrong).run()
    assert copier.retried == [rel]
    assert copier.errors[0].startswith("%s arrived twice with sha256 " % rel)
    assert not (served["root"] / "dst" / rel).exists()


def test_the_server_serves_nothing_outside_its_folder_and_not_its_own_files(served):
    import http.client
    (served["root"] / "src" / ".gpulab-manifest.json").write_text("{}")
    port = int(served["url"].rsplit(":", 1)[1])
    for path in ("/../token", "/%2e%2e/token", "/.gpulab-manifest.json", "/sub/../../token", "/"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path, headers={"Authorization": "Bearer s3cret-token"})
        assert conn.getresponse().status == 404, path
        conn.close()


def test_an_unreachable_source_fails_after_its_retries(tmp_path, monkeypatch):
    monkeypatch.setattr(_weights_fetch, "CONNECT_RETRY", 1.0)
    url = "http://127.0.0.1:%d" % _free_port()
    copier = _weights_fetch.Copier(str(tmp_path / "dst"), url, "t", {"a.bin": {"size": 10, "sha256": "0" * 64}}).run()
    assert copier.errors[0].startswith("cannot reach the copy at %s: " % url)
