"""_node's platform reads on the Engine API's answers recorded by tests/fixtures_record_platforms.py: the daemon's
platform (/version), the node's copy of an image (/images/REF/json), the registry's platforms asked through the
daemon (/distribution/REF/json), and the credentials a node's docker client would send with that question."""

from __future__ import annotations

import base64
import json

import pytest

from platform_replay import RECORD, REFS, replay
from ansible_collections.gpulab.vllm.plugins.module_utils import _node


def distribution_calls(calls):
    return [path for path, _headers in calls if path.startswith("/distribution/")]


def test_the_recording_covers_the_cases():
    assert set(REFS) == {"amd64", "arm64", "multi", "oci_amd64", "oci_arm64", "oci_multi", "arm64_by_digest",
                         "multi_by_digest", "missing_tag", "missing_repo", "unreachable", "malformed"}
    for role, answer in RECORD["distribution"].items():
        assert answer["rc"] == 0 and answer["status"] is not None, role
    assert RECORD["version"]["status"] == 200 and RECORD["info"]["status"] == 200
    # Docker 20.10 ignores the architecture of `docker import --platform`: the recorder says how it made arm64.
    assert RECORD["notes"]["import_platform_arm64_gave"] == "amd64"
    assert RECORD["images"]["arm64"]["body"]["Architecture"] == "arm64"


def test_the_daemon_pulls_for_its_own_go_platform_which_is_the_oci_name_of_the_kernels():
    """/version says amd64 where /info (uname) says x86_64: node_facts reads /version, no name to map."""
    docker_get, calls = replay()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_node, "docker_get", docker_get)
        assert _node.docker_platform(RECORD["docker_host"], 10) == {"os": "linux", "architecture": "amd64"}
    assert calls == [("/version", {})]
    assert (RECORD["info"]["body"]["Architecture"], RECORD["info"]["body"]["OSType"]) == ("x86_64", "linux")


def test_a_daemon_that_cannot_say_its_version_is_an_error(monkeypatch):
    monkeypatch.setattr(_node, "docker_get", lambda *args, **kwargs: (500, {"message": "boom"}))
    with pytest.raises(_node.DockerError, match="asking the daemon's version answered HTTP 500: boom"):
        _node.docker_platform(RECORD["docker_host"], 10)


def images(monkeypatch, roles, ask_registry, credentials_for=None, **replay_args):
    docker_get, calls = replay(**replay_args)
    monkeypatch.setattr(_node, "docker_get", docker_get)
    refs = [REFS[role] for role in roles]
    read = _node.docker_images(RECORD["docker_host"], refs, 10, ask_registry, credentials_for)
    return dict(zip(roles, (read[ref] for ref in refs))), calls


def test_the_node_copy_carries_its_platform(monkeypatch):
    read, _calls = images(monkeypatch, ["amd64", "arm64", "multi", "arm64_by_digest"], "never")
    assert (read["amd64"]["os"], read["amd64"]["architecture"], read["amd64"]["variant"]) == ("linux", "amd64", None)
    assert (read["arm64"]["os"], read["arm64"]["architecture"], read["arm64"]["variant"]) == ("linux", "arm64", "v8")
    # The index, pulled on this amd64 node: the daemon took the amd64 image and keeps the index's digest.
    assert read["multi"]["architecture"] == "amd64"
    assert REFS["multi_by_digest"] in read["multi"]["repo_digests"]
    assert read["arm64_by_digest"]["id"] == read["arm64"]["id"]


def test_absent_asks_the_registry_only_for_images_the_node_lacks(monkeypatch):
    roles = ["amd64", "multi", "oci_multi", "missing_tag"]
    read, calls = images(monkeypatch, roles, "absent")
    assert read["amd64"]["registry"] is None and read["multi"]["registry"] is None
    assert distribution_calls(calls) == [RECORD["distribution"][role]["path"] for role in ("oci_multi", "missing_tag")]
    assert read["oci_multi"]["registry"] == {
        "digest": RECORD["distribution"]["oci_multi"]["body"]["Descriptor"]["digest"],
        "media_type": "application/vnd.oci.image.index.v1+json",
        "platforms": [{"os": "linux", "architecture": "amd64", "variant": None},
                      {"os": "linux", "architecture": "arm64", "variant": "v8"}],
        "error": None}
    assert read["missing_tag"]["registry"] == {"digest": None, "media_type": None, "platforms": None,
                                               "error": "manifest unknown: manifest unknown"}


def test_always_asks_again_for_tags_the_node_has_but_never_for_a_digest(monkeypatch):
    read, calls = images(monkeypatch, ["amd64", "multi", "arm64_by_digest", "multi_by_digest"], "always")
    assert distribution_calls(calls) == [RECORD["distribution"][role]["path"] for role in ("amd64", "multi")]
    assert read["multi"]["registry"]["platforms"] == [{"os": "linux", "architecture": "amd64", "variant": None},
                                                      {"os": "linux", "architecture": "arm64", "variant": "v8"}]
    assert read["amd64"]["registry"]["media_type"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert read["arm64_by_digest"]["registry"] is None and read["multi_by_digest"]["registry"] is None


def test_never_asks_nothing(monkeypatch):
    _read, calls = images(monkeypatch, list(REFS), "never")
    assert distribution_calls(calls) == []


def test_a_single_image_lists_the_platform_of_its_config_but_an_oci_manifest_none_on_docker_20(monkeypatch):
    read, _calls = images(monkeypatch, ["amd64", "arm64", "oci_arm64", "oci_amd64"], "always")
    assert read["arm64"]["registry"]["platforms"] == [{"os": "linux", "architecture": "arm64", "variant": "v8"}]
    assert read["amd64"]["registry"]["platforms"] == [{"os": "linux", "architecture": "amd64", "variant": None}]
    for role in ("oci_arm64", "oci_amd64"):
        assert RECORD["distribution"][role]["body"]["Platforms"] is None
        assert read[role]["registry"]["platforms"] is None and read[role]["registry"]["error"] is None
        assert read[role]["registry"]["media_type"] == "application/vnd.oci.image.manifest.v1+json"


def test_registry_errors_are_the_registrys_words_on_one_line(monkeypatch):
    read, _calls = images(monkeypatch, ["missing_repo", "unreachable"], "absent")
    assert read["missing_repo"]["registry"]["error"] == "manifest unknown: manifest unknown"
    port = REFS["unreachable"].split("/", 1)[0].rsplit(":", 1)[1]
    assert read["unreachable"]["registry"]["error"] == (
        'Get "http://127.0.0.1:%s/v2/": dial tcp 127.0.0.1:%s: connect: connection refused' % (port, port))


def test_a_reference_the_daemon_refuses_is_absent_with_its_words_and_not_asked_about(monkeypatch):
    read, calls = images(monkeypatch, ["malformed"], "always")
    assert read["malformed"]["present"] is False
    assert read["malformed"]["error"] == "no such image: not an image!: invalid reference format"
    assert distribution_calls(calls) == []
    # The registry would have said the same, as recorded.
    assert RECORD["distribution"]["malformed"]["body"] == {"message": "invalid reference format"}


def test_an_empty_reference_is_not_asked_about(monkeypatch):
    docker_get, calls = replay()
    monkeypatch.setattr(_node, "docker_get", docker_get)
    assert _node.docker_images(RECORD["docker_host"], [""], 10, "always")[""]["error"] == "empty image reference"
    assert calls == []


def test_a_daemon_that_does_not_answer_in_time_is_a_registry_error(monkeypatch):
    def docker_get(docker_host, path, timeout, headers=None):
        raise _node.DockerError("timed out")
    monkeypatch.setattr(_node, "docker_get", docker_get)
    assert _node.docker_distribution(RECORD["docker_host"], REFS["multi"], 10)["error"] == (
        "no answer through the node's Docker daemon within 10 s")


# Credentials: the daemon keeps none; the node's docker client config gives them, as to `docker pull`.


def test_the_daemon_asks_the_registry_with_the_credentials_it_is_given(monkeypatch):
    auth = RECORD["auth"]
    assert auth["without_credentials"]["status"] == 500
    assert "no basic auth credentials" in auth["without_credentials"]["body"]["message"]
    assert auth["wrong_credentials"]["body"] == {"message": "unauthorized: authentication required"}
    assert auth["with_credentials"]["body"] == RECORD["distribution"]["multi"]["body"]
    config = auth["config_json"]
    for credentials_for, expected in (
            (lambda ref: _node.registry_credentials(ref, config, lambda *unused: None), None),
            (lambda ref: None, "no basic auth credentials")):
        read, calls = images(monkeypatch, ["oci_multi"], "absent", credentials_for, auth=auth)
        error = read["oci_multi"]["registry"]["error"]
        assert (error is None) if expected is None else (expected in error), error
    read, calls = images(monkeypatch, ["oci_multi"], "absent",
                         lambda ref: _node.registry_credentials(ref, config, lambda *unused: None), auth=auth)
    assert [headers for path, headers in calls if path.startswith("/distribution/")][0]["X-Registry-Auth"]
    assert "archprobe-not-a-secret" not in json.dumps(read)


def _b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("ref, config, expected", [
    ("10.210.0.1:5055/gpulab/ray:1", {"auths": {"10.210.0.1:5055": {"auth": _b64("u:p:with:colons")}}},
     {"username": "u", "password": "p:with:colons", "serveraddress": "10.210.0.1:5055"}),
    ("nvcr.io/nvidia/vllm:26.02-py3", {"auths": {"https://nvcr.io/v1/": {"username": "$oauthtoken", "password": "k"}}},
     {"username": "$oauthtoken", "password": "k", "serveraddress": "nvcr.io"}),
    ("vllm/vllm-openai:v0.11.0", {"auths": {"https://index.docker.io/v1/": {"auth": _b64("hub:pw")}}},
     {"username": "hub", "password": "pw", "serveraddress": "https://index.docker.io/v1/"}),
    ("docker.io/library/ubuntu:24.04", {"auths": {"https://index.docker.io/v1/": {"identitytoken": "t"}}},
     {"identitytoken": "t", "serveraddress": "https://index.docker.io/v1/"}),
    ("localhost:5000/x:1", {"auths": {"localhost:5000": {}}}, None),
    ("ghcr.io/o/x:1", {"auths": {"nvcr.io": {"auth": _b64("u:p")}}}, None),
    ("ghcr.io/o/x:1", {}, None),
])
def test_credentials_from_the_auths_of_the_client_config(ref, config, expected):
    assert _node.registry_credentials(ref, config, lambda *unused: pytest.fail("no helper is configured")) == expected


def test_credential_helpers_as_the_docker_cli_asks_them():
    asked = []

    def helper(name, server):
        asked.append((name, server))
        return {"nvcr": {"ServerURL": server, "Username": "$oauthtoken", "Secret": "key"},
                "store": {"ServerURL": server, "Username": "<token>", "Secret": "refresh"}}.get(name)

    config = {"credHelpers": {"nvcr.io": "nvcr"}, "credsStore": "store",
              "auths": {"nvcr.io": {"auth": _b64("ignored:when-a-helper-answers")}}}
    assert _node.registry_credentials("nvcr.io/nvidia/vllm:1", config, helper) == {
        "username": "$oauthtoken", "password": "key", "serveraddress": "nvcr.io"}
    assert _node.registry_credentials("ubuntu:24.04", config, helper) == {
        "identitytoken": "refresh", "serveraddress": "https://index.docker.io/v1/"}
    assert asked == [("nvcr", "nvcr.io"), ("store", "https://index.docker.io/v1/")]
    # A helper without credentials for the registry: none are sent, as by the docker CLI.
    assert _node.registry_credentials("ghcr.io/o/x:1", {"credsStore": "none"}, lambda *unused: None) is None


def test_the_header_is_url_safe_base64_of_the_credentials_json():
    header = _node.registry_auth_header({"username": "u", "password": "p?>", "serveraddress": "r"})
    assert json.loads(base64.urlsafe_b64decode(header["X-Registry-Auth"])) == {
        "username": "u", "password": "p?>", "serveraddress": "r"}
    assert _node.registry_auth_header(None) == {}


@pytest.mark.parametrize("ref, registry", [
    ("ubuntu", "docker.io"), ("library/ubuntu:24.04", "docker.io"), ("vllm/vllm-openai:v1", "docker.io"),
    ("nvcr.io/nvidia/vllm:26.02-py3", "nvcr.io"), ("10.210.0.1:5055/gpulab/ray@sha256:ab", "10.210.0.1:5055"),
    ("localhost/x:1", "localhost"), ("127.0.0.1:5077/archprobe/platforms:multi", "127.0.0.1:5077"),
])
def test_the_registry_of_a_reference(ref, registry):
    assert _node.registry_of(ref) == registry


def test_the_client_config_path_and_an_unreadable_config(tmp_path):
    assert _node.docker_config_path({"DOCKER_CONFIG": str(tmp_path)}) == str(tmp_path / "config.json")
    assert _node.docker_config_path({}).endswith("/.docker/config.json")
    assert _node.read_docker_config(str(tmp_path / "config.json")) == {}
    (tmp_path / "config.json").write_text("not json")
    assert _node.read_docker_config(str(tmp_path / "config.json")) == {}
    (tmp_path / "config.json").write_text(json.dumps(RECORD["auth"]["config_json"]))
    assert _node.read_docker_config(str(tmp_path / "config.json")) == RECORD["auth"]["config_json"]
