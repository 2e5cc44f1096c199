"""What the node role asks the node read about the files the other roles write."""

from __future__ import annotations

from ansible_collections.gpulab.vllm.plugins.filter.node import files_with_digest


def test_the_deploys_files_on_the_lab_head_each_with_its_digest_in_order():
    # node_files as deploy.yml builds it on the local lab's head, with weights_source set.
    paths = ["/etc/gpulab-vllm", "/etc/gpulab-vllm/vllm.yaml", "/etc/gpulab-vllm/ray_non_carry_over_env_vars.json",
             "/etc/gpulab-vllm/middleware/gpulab_vllm_auth.py", "/srv/gpulab-lab/supervisor/config.json",
             "/srv/gpulab-lab/models/.gpulab-cache"]
    assert files_with_digest(paths) == [{"path": path, "digest": True} for path in paths]


def test_a_worker_asks_for_the_supervisors_file_only_and_nothing_asks_for_nothing():
    assert files_with_digest(["/var/lib/gpulab-vllm/supervisor/config.json"]) == [
        {"path": "/var/lib/gpulab-vllm/supervisor/config.json", "digest": True}]
    assert files_with_digest([]) == []
