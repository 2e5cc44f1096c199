"""The least vLLM a deployment needs (plugins/filter/vllm_version.py), on the versions real images report.

Where each version comes from:
- the lab's images, recorded: today's image's contract record on the head's Ray container (0.32.0, fixtures/node/)
  and the seed image's server answering /version (0.17.1, fixtures/vllm/);
- public recordings: the vLLM banner of NVIDIA's 26.03 container in a user's log (0.17.1+a03ca76a.nv26.03.46967107,
  mark-ramsey-ri/vllm-dgx-spark issue 3);
- documents: NVIDIA's vLLM release notes (26.01 lists vLLM 0.11.1, 26.03 lists 0.17.1); issue 34 (the image a user
  runs on GB10 reports 0.17.1rc1); runpod-workers/worker-vllm issue 279 (a stock 0.16.0 refuses Qwen3.5's classes);
- written here for the parser alone, and named so: local labels, a leading v, a suffix PEP 440 does not know.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
import yaml

from conftest import load_fixture
from ansible_collections.gpulab.vllm.plugins.filter.vllm_version import parse_version, vllm_minimum_problems, vllm_version_problem

ROOT = Path(__file__).resolve().parents[4]
IMAGE = "hellohal2064/vllm-qwen3.5-gb10:latest"
SETTING = yaml.safe_load((ROOT / "roles" / "image" / "vars" / "main.yml").read_text())["_image_min_vllm_setting"]
CONTRACT_LABEL = "org.gpulab.vllm.image-contract"


def lab_image_vllm() -> str:
    """What the contract probe found in today's lab image, as the head's Ray container records it."""
    node = load_fixture("node", "node1_deployed")
    labels = node["docker"]["inspect"]["gpulab-ray-head"]["body"]["Config"]["Labels"]
    return json.loads(labels[CONTRACT_LABEL])["vllm"]


def seed_image_vllm() -> str:
    """What the seed image's server answered on /version."""
    exchanges = load_fixture("vllm", "vllm-0.17.1_healthy")["exchanges"]
    return json.loads(next(e["body"] for e in exchanges if e["url"].endswith("/version")))["version"]


def qwen35_minimum(**inventory) -> str:
    """The minimum deploy_qwen35 hands the image role, rendered as Ansible renders the preset's expression."""
    play = yaml.safe_load((ROOT / "playbooks" / "deploy_qwen35.yml").read_text())[0]
    return jinja2.Environment().from_string(play["vars"]["image_min_vllm_version"]).render(**inventory)


def test_the_lab_images_report_what_their_names_say():
    assert (lab_image_vllm(), seed_image_vllm()) == ("0.32.0", "0.17.1")


def test_the_qwen35_preset_asks_for_0_17_unless_the_inventory_lowers_it():
    assert qwen35_minimum() == "0.17"
    assert qwen35_minimum(qwen35_min_vllm_version="0.16.0rc1") == "0.16.0rc1"


@pytest.mark.parametrize("found", [
    pytest.param(lab_image_vllm(), id="lab-image-0.32.0"),
    pytest.param(seed_image_vllm(), id="seed-image-0.17.1"),
    pytest.param("0.17.1+a03ca76a.nv26.03.46967107", id="ngc-26.03-banner"),
    pytest.param("0.17.1", id="ngc-26.03-notes"),
    pytest.param("0.17.1rc1", id="gb10-image-of-issue-34"),
    pytest.param("0.17.0", id="first-release-with-qwen35"),
])
def test_the_qwen35_preset_takes_these_images(found):
    assert vllm_version_problem(found, qwen35_minimum(), "spark-1", IMAGE, SETTING) == ""


def test_image_vllm_older_than_minimum():
    """The bad-input row of the same name, on the lab's values: the preset's minimum raised past today's image."""
    message = vllm_version_problem(lab_image_vllm(), qwen35_minimum(qwen35_min_vllm_version="0.33"), "node1",
                                   "10.210.0.1:5055/gpulab/vllm-cpu@sha256:ab", SETTING)
    assert message == (
        "node1: 10.210.0.1:5055/gpulab/vllm-cpu@sha256:ab has vLLM 0.32.0, older than 0.33, the least this deployment "
        "needs; use an image whose vLLM is 0.33 or later, or lower image_min_vllm_version (qwen35_min_vllm_version for "
        "deploy_qwen35) only for a build known to serve the model")


@pytest.mark.parametrize("found", [
    pytest.param("0.11.1", id="ngc-26.01-notes"),
    pytest.param("0.16.0", id="stock-0.16.0"),
    pytest.param("0.17.0rc1", id="candidate-before-0.17.0"),
])
def test_the_qwen35_preset_refuses_an_older_vllm_naming_node_image_versions_and_fix(found):
    message = vllm_version_problem(found, qwen35_minimum(), "spark-2", IMAGE, SETTING)
    assert message.startswith(f"spark-2: {IMAGE} has vLLM {found}, older than 0.17, the least this deployment needs; ")
    assert "use an image whose vLLM is 0.17 or later" in message
    assert "qwen35_min_vllm_version for deploy_qwen35" in message
    assert "\n" not in message


def test_no_minimum_or_no_vllm_leaves_the_judgement_to_other_rules():
    assert vllm_version_problem("0.11.1", "", "node1", IMAGE) == ""
    assert vllm_version_problem("0.11.1", None, "node1", IMAGE) == ""
    # No vLLM at all is image_require_vllm's refusal (the contract check), not this one.
    assert vllm_version_problem(None, "0.17", "node1", IMAGE) == ""


def test_a_version_that_cannot_be_compared_is_refused_with_the_way_out():
    # The probe says "unknown" when vLLM imports but no package declares its version.
    message = vllm_version_problem("unknown", "0.17", "node1", IMAGE)
    assert message == (f"node1: {IMAGE} reports its vLLM version as 'unknown', which cannot be compared with 0.17, the "
                       "least this deployment needs; use an image whose vLLM package declares its version, or set "
                       "image_min_vllm_version to \"\" to deploy it unchecked")


@pytest.mark.parametrize("text, same_as", [
    # Written here for the parser.
    ("0.17.1+cu130", "0.17.1"),
    ("v0.17.1", "0.17.1"),
    ("0.17.1-custom", "0.17.1"),
    (" 0.17.1 ", "0.17.1"),
    ("0.17.0", "0.17"),
    ("0.17.1RC1", "0.17.1rc1"),
    ("0.17.1c1", "0.17.1rc1"),
    ("0.17.1rc1.dev88+g36735fd77", "0.17.1rc1.dev88"),
])
def test_versions_as_images_write_them(text, same_as):
    assert parse_version(text) == parse_version(same_as)


@pytest.mark.parametrize("text", ["unknown", "", None, 0.17, "rc1"])
def test_no_version_in_these(text):
    assert parse_version(text) is None


@pytest.mark.parametrize("older, newer", [
    ("0.17.0rc1", "0.17"),
    ("0.17.1rc1.dev88+g36735fd77", "0.17.1rc1"),
    ("0.17.1rc1", "0.17.1"),
    ("0.17.1", "0.17.1.post1"),
    ("0.9.2", "0.17"),
    ("0.17.9", "0.17.10"),
    ("0.17.dev1", "0.17a1"),
    ("0.17a1", "0.17b1"),
    ("0.17b1", "0.17rc1"),
    ("0.17.1.post1.dev1", "0.17.1.post1"),
    ("0.17.1-custom", "0.17.2rc1"),
])
def test_pep_440_order(older, newer):
    assert parse_version(older) < parse_version(newer)


def test_a_local_label_changes_nothing():
    assert parse_version("0.17.1+cu130") >= parse_version("0.17.1")
    assert vllm_version_problem("0.17.1+cu130", "0.17.1", "node1", IMAGE) == ""


@pytest.mark.parametrize("minimum", ["", None, "0.17", "0.17.1", "0.17.1rc1"])
def test_minimums_taken(minimum):
    assert vllm_minimum_problems(minimum, "node1") == []


def test_a_minimum_given_as_a_number_is_refused_before_anything_is_pulled():
    assert vllm_minimum_problems(0.1, "node1", SETTING) == [
        "image_min_vllm_version (qwen35_min_vllm_version for deploy_qwen35) on node1 is the number 0.1, which YAML may "
        "have shortened (0.10 reads as 0.1); write the version in quotes so that it is compared as written"]


@pytest.mark.parametrize("minimum", ["zero.17", "latest", ["0.17"]])
def test_a_minimum_that_is_no_version_is_refused(minimum):
    problems = vllm_minimum_problems(minimum, "node2")
    assert problems == [f"image_min_vllm_version on node2 is {minimum!r}, not a version such as \"0.17\" or \"0.17.1\"; "
                        "correct it, or leave it empty for no minimum"]
