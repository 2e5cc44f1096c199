"""The serving chain on the seed's image (vLLM 0.17.1, Ray 2.53: the versions our first users run): the links of
test_serving_chain.py that do not depend on the image's version, in the same order: from nothing, check mode that
starts nothing, a deploy that serves, the endpoint verified (generation, TP rank 1 on the second node with its own
fabric settings, the GPU contract, check mode on the deployment, the openai client), and a re-run that changes
nothing.

The lab is up with every image (lab:seed); this chain deploys the seed's image with the seed's own model through an
inventory of its own beside the lab's (local_lab_seed): the lab's hosts and secrets, lab_vllm_image and lab_model_dir
pointing at the seed's.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from labkit import LAB_INVENTORY, Chain
# The shared links, collected here again on this module's chain (pytest collects what a test module holds).
from test_serving_chain import (  # noqa: F401  pylint: disable=unused-import
    chain_inputs, play, test_the_chain_starts_from_nothing, test_check_mode_from_nothing_starts_nothing,
    test_the_deploy_from_nothing_serves, test_the_endpoint_verifies, test_a_rerun_changes_nothing)

pytestmark = [pytest.mark.lab, pytest.mark.seed]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("chain") / "local_lab_seed"
    shutil.copytree(LAB_INVENTORY / "group_vars", inventory / "group_vars")
    hosts = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    lab_vars = hosts["all"]["vars"]
    if not lab_vars.get("lab_vllm_seed_model_dir"):
        pytest.fail("the lab is up without the seed's image: run `make lab-up LAB_IMAGES='ray vllm vllm-seed'` first")
    lab_vars.update(lab_vllm_image=lab_vars["lab_vllm_seed_image"], lab_model_dir=lab_vars["lab_vllm_seed_model_dir"])
    (inventory / "hosts.yml").write_text(json.dumps(hosts))
    (inventory / "hosts.yml").chmod(0o600)
    shared = Chain("serving (the seed's image)", verbose=False, **chain_inputs(inventory))
    yield shared
    play(shared, "teardown.yml")
