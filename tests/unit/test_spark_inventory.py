"""The example inventory of two DGX Sparks (inventories/spark_lab) holds settings the roles take as they stand.

It is data: no test contacts its hosts. tests/collection reads it with ansible-inventory and syntax-checks the
playbooks against it; here its values meet the roles' own rules."""

from __future__ import annotations

from pathlib import Path

import yaml

from ansible_collections.gpulab.vllm.plugins.filter.preflight import image_problems

ROOT = Path(__file__).resolve().parents[2]
GROUP_VARS = yaml.safe_load((ROOT / "inventories" / "spark_lab" / "group_vars" / "all.yml").read_text())


def test_rays_memory_monitor_is_off_as_a_choice_the_role_takes():
    specs = yaml.safe_load((ROOT / "roles" / "ray_cluster" / "meta" / "argument_specs.yml").read_text())
    option = specs["argument_specs"]["main"]["options"]["ray_cluster_memory_monitor"]
    assert GROUP_VARS["ray_cluster_memory_monitor"] == "false"
    assert GROUP_VARS["ray_cluster_memory_monitor"] in option["choices"]


def test_the_image_is_a_tag_the_image_rules_take_until_it_is_pinned():
    assert GROUP_VARS["image_ref"].startswith("hellohal2064/vllm-qwen3.5-gb10:")
    assert GROUP_VARS["image_allow_tag"] is True
    assert image_problems(GROUP_VARS["image_ref"], GROUP_VARS["image_allow_tag"], "spark-1") == []
