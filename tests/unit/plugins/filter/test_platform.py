"""platform_problem: can a node run the image, judged before anything is pulled, on node reads made by replaying
the Engine API's answers recorded by tests/fixtures_record_platforms.py (an amd64 machine, Docker 20.10, a
throwaway registry with an image index, single amd64 and arm64 images, OCI manifests, a missing tag, ...).

The recording's daemon is amd64. An aarch64 node (a DGX Spark) is the same recording with the Arch of its /version
answer set to arm64, which is what an arm64 daemon says there; its copies of images are the recording's (amd64
and arm64), or none."""

from __future__ import annotations

import copy

import pytest

from conftest import load_fixture
from platform_replay import RECORD, REFS, replay
from ansible_collections.gpulab.vllm.plugins.filter.platform import platform_problem, runs_on
from ansible_collections.gpulab.vllm.plugins.module_utils import _node

ARM64 = {"Arch": "arm64"}
FIX = {"amd64": "use a multi-arch tag (one whose image index lists linux/amd64) or the image's amd64 build",
       "arm64": "use a multi-arch tag (one whose image index lists linux/arm64) or the image's arm64 build"}


def read_node(monkeypatch, roles, ask_registry="absent", version=None, **replay_args):
    """The node read node_facts makes (its platform and images) from the recorded answers."""
    docker_get, _calls = replay(version=version, **replay_args)
    monkeypatch.setattr(_node, "docker_get", docker_get)
    refs = [REFS[role] for role in roles]
    return {"platform": _node.docker_platform(RECORD["docker_host"], 10),
            "images": _node.docker_images(RECORD["docker_host"], refs, 10, ask_registry)}


def problem(monkeypatch, role, arch="amd64", ask_registry="absent", host="node1", no_images=False):
    node = read_node(monkeypatch, [role], ask_registry, ARM64 if arch == "arm64" else None, no_images=no_images)
    assert node["platform"] == {"os": "linux", "architecture": arch}
    return platform_problem(node, REFS[role], host)


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
@pytest.mark.parametrize("role", ["multi", "oci_multi", "multi_by_digest"])
def test_an_image_index_with_the_nodes_platform_passes(monkeypatch, role, arch):
    # On a node that has none of the images: the registry's answer decides.
    assert problem(monkeypatch, role, arch, "absent", no_images=True) == ""
    # On the recorded node, whose copy of the index is its own platform's image, and with always.
    assert problem(monkeypatch, role, "amd64", "always") == ""


def test_a_copy_of_an_index_pulled_for_another_platform_is_refused(monkeypatch):
    """The recording's copy of the index (by digest) is amd64: an arm64 node holding it (pulled with
    --platform linux/amd64) cannot run it, and a digest is not asked again."""
    line = problem(monkeypatch, "multi_by_digest", "arm64", "always", host="spark-1")
    assert line == ("spark-1 (linux/arm64) cannot run %s: the node's copy is for linux/amd64; remove it "
                    "(docker image rm %s) and %s" % (REFS["multi_by_digest"], REFS["multi_by_digest"], FIX["arm64"]))


@pytest.mark.parametrize("no_images", [True, False])
@pytest.mark.parametrize("role, arch", [("amd64", "amd64"), ("arm64", "arm64"), ("arm64_by_digest", "arm64")])
def test_a_single_image_whose_config_names_the_nodes_architecture_passes(monkeypatch, role, arch, no_images):
    assert problem(monkeypatch, role, arch, "always", no_images=no_images) == ""


def test_a_single_amd64_image_is_refused_on_an_aarch64_node_in_one_line(monkeypatch):
    assert problem(monkeypatch, "amd64", "arm64", "absent", host="spark-2", no_images=True) == (
        "spark-2 (linux/arm64) cannot run %s: the registry has it for linux/amd64 only; %s" % (REFS["amd64"], FIX["arm64"]))


@pytest.mark.parametrize("role", ["arm64", "arm64_by_digest"])
def test_a_single_arm64_image_is_refused_on_an_amd64_node_in_one_line(monkeypatch, role):
    # As the lab's bad-input case: an arm64-only image in the registry (by tag or digest), amd64 nodes without it.
    line = problem(monkeypatch, role, "amd64", "absent", no_images=True)
    assert line == "node1 (linux/amd64) cannot run %s: the registry has it for linux/arm64/v8 only; %s" % (
        REFS[role], FIX["amd64"])
    assert "\n" not in line


def test_a_copy_of_another_platform_on_the_node_is_refused_without_asking_the_registry(monkeypatch):
    node = read_node(monkeypatch, ["arm64"], "absent")
    assert node["images"][REFS["arm64"]]["registry"] is None
    assert platform_problem(node, REFS["arm64"], "node1") == (
        "node1 (linux/amd64) cannot run %s: the node's copy is for linux/arm64/v8; remove it (docker image rm %s) and %s"
        % (REFS["arm64"], REFS["arm64"], FIX["amd64"]))


def test_a_copy_of_the_nodes_platform_passes_when_the_registry_cannot_be_reached(monkeypatch):
    node = read_node(monkeypatch, ["multi"], "absent")
    unreachable = _node.summarize_distribution(RECORD["distribution"]["unreachable"]["status"],
                                               RECORD["distribution"]["unreachable"]["body"])
    node["images"][REFS["multi"]]["registry"] = unreachable
    assert unreachable["error"].endswith("connect: connection refused")
    assert platform_problem(node, REFS["multi"], "node1") == ""


@pytest.mark.parametrize("role, words", [
    ("missing_tag", "manifest unknown: manifest unknown"),
    ("missing_repo", "manifest unknown: manifest unknown"),
    ("unreachable", "connect: connection refused"),
])
def test_a_registry_error_refuses_a_node_without_the_image_in_the_registrys_words(monkeypatch, role, words):
    line = problem(monkeypatch, role, "amd64", "absent")
    assert line.startswith("node1 cannot pull %s: " % REFS[role])
    assert words in line
    assert line.endswith("; check that the registry has this tag (or digest), that the node can reach the registry, "
                         "and its credentials")
    assert "\n" not in line


def test_credentials_missing_for_a_private_registry_say_so(monkeypatch):
    node = read_node(monkeypatch, ["oci_multi"], "absent", auth=RECORD["auth"])
    line = platform_problem(node, REFS["oci_multi"], "node1")
    assert line.startswith("node1 cannot pull %s: Head " % REFS["oci_multi"]) and "no basic auth credentials" in line


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_an_oci_manifest_docker_20_lists_no_platform_for_is_left_to_the_check_after_the_pull(monkeypatch, arch):
    assert problem(monkeypatch, "oci_arm64", arch, "absent") == ""
    assert problem(monkeypatch, "oci_amd64", arch, "absent") == ""


def test_after_the_pull_the_pulled_image_decides(monkeypatch):
    """The pull's result holds the image's inspection: what the recorded daemon says of its arm64 and amd64
    images stands for what a pull of oci-arm64 and oci-amd64 puts on a node (the same configs)."""
    arm64 = RECORD["images"]["arm64"]["body"]
    amd64 = RECORD["images"]["amd64"]["body"]
    node = read_node(monkeypatch, ["oci_arm64"], "absent")
    assert platform_problem(node, REFS["oci_arm64"], "node1", arm64) == (
        "node1 (linux/amd64) cannot run %s: the image pulled is for linux/arm64/v8; %s" % (REFS["oci_arm64"], FIX["amd64"]))
    assert platform_problem(node, REFS["oci_amd64"], "node1", amd64) == ""
    spark = read_node(monkeypatch, ["oci_amd64"], "absent", ARM64)
    assert platform_problem(spark, REFS["oci_amd64"], "spark-1", amd64) == (
        "spark-1 (linux/arm64) cannot run %s: the image pulled is for linux/amd64; %s" % (REFS["oci_amd64"], FIX["arm64"]))
    assert platform_problem(spark, REFS["oci_amd64"], "spark-1", arm64) == ""
    assert platform_problem(spark, REFS["oci_amd64"], "spark-1", {}) == ""


def test_with_always_the_registry_decides_over_the_nodes_copy(monkeypatch):
    """image_pull=always pulls what the tag names now: a tag moved to an amd64-only image is refused on an arm64
    node even while its copy (here the recording's arm64 image, read under that tag) still runs there."""
    spark = read_node(monkeypatch, ["amd64"], "always", ARM64)
    spark["images"][REFS["amd64"]].update(architecture="arm64", variant="v8")
    assert "the registry has it for linux/amd64 only" in platform_problem(spark, REFS["amd64"], "spark-1")


def test_entries_of_an_index_that_are_no_image_are_not_platforms(monkeypatch):
    """BuildKit adds attestation manifests to an index under unknown/unknown: added here to the recorded OCI
    index's answer, they neither match a node nor appear in the line."""
    body = copy.deepcopy(RECORD["distribution"]["oci_multi"]["body"])
    body["Platforms"] = [body["Platforms"][0], {"architecture": "unknown", "os": "unknown"}]
    node = {"platform": {"os": "linux", "architecture": "arm64"},
            "images": {REFS["oci_multi"]: dict(_node.absent_image(), registry=_node.summarize_distribution(200, body))}}
    assert platform_problem(node, REFS["oci_multi"], "spark-1") == (
        "spark-1 (linux/arm64) cannot run %s: the registry has it for linux/amd64 only; %s" % (REFS["oci_multi"], FIX["arm64"]))


def test_a_read_without_the_platform_or_the_image_tells_nothing():
    assert platform_problem({}, REFS["multi"], "node1") == ""
    assert platform_problem(None, REFS["multi"], "node1") == ""
    assert platform_problem({"platform": {"os": "linux", "architecture": "amd64"}, "images": {}}, REFS["multi"], "n") == ""


def test_the_lab_recordings_images_run_on_their_nodes():
    """The node reads recorded in the lab (tests/unit/fixtures/node/) hold the lab's images: amd64, as its nodes."""
    record = load_fixture("node", "node1_deployed")
    for ref, answer in record["docker"]["images"].items():
        if answer["status"] == 200:
            image = _node.summarize_image(answer["body"])
            assert runs_on(image, {"os": "linux", "architecture": "amd64"}), ref
            node = {"platform": {"os": "linux", "architecture": "amd64"}, "images": {ref: image}}
            assert platform_problem(node, ref, "node1") == ""


@pytest.mark.parametrize("platform, node, runs", [
    ({"os": "linux", "architecture": "arm64", "variant": "v8"}, {"os": "linux", "architecture": "arm64"}, True),
    ({"os": "linux", "architecture": "amd64", "variant": "v3"}, {"os": "linux", "architecture": "amd64"}, True),
    ({"os": "windows", "architecture": "amd64"}, {"os": "linux", "architecture": "amd64"}, False),
    ({"os": "linux", "architecture": "arm", "variant": "v7"}, {"os": "linux", "architecture": "arm64"}, False),
])
def test_os_and_architecture_decide_the_variant_does_not(platform, node, runs):
    assert runs_on(platform, node) is runs
