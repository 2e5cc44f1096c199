"""The port plan: ranges, overlaps, and the SSH port kept out of everything the firewall covers."""

from __future__ import annotations

from ansible_collections.gpulab.vllm.plugins.filter.ports import port_problems

RAY = {"ray_cluster_port": 6379, "ray_cluster_node_manager_port": 6381, "ray_cluster_client_server_port": 10001}
WORKERS = {"ray_cluster_min_worker_port..ray_cluster_max_worker_port": [10002, 10999]}


def test_the_defaults_are_sound():
    assert port_problems(RAY, WORKERS, {"the SSH port (ansible_port)": 22}) == []


def test_a_worker_range_over_ssh_is_refused():
    # The lockout seen on a lab node: min worker port 20 put SSH inside the REJECT range.
    problems = port_problems(RAY, {"ray_cluster_min_worker_port..ray_cluster_max_worker_port": [20, 10999]},
                             {"the SSH port (ansible_port)": 22})
    assert "the SSH port (ansible_port) 22 lies inside ray_cluster_min_worker_port..ray_cluster_max_worker_port (20..10999), " \
           "which the firewall rules cover" in problems
    # Ray's own ports then lie in the range too.
    assert "ray_cluster_port=6379 lies inside ray_cluster_min_worker_port..ray_cluster_max_worker_port (20..10999)" in problems


def test_out_of_range_and_inverted():
    assert port_problems({}, {"a..b": [10002, 70000]}) == ["b=70000 is outside 1..65535"]
    assert port_problems({}, {"a..b": [0, 100]}) == ["a=0 is outside 1..65535"]
    assert port_problems({}, {"a..b": [200, 100]}) == ["a=200 must be below b=100"]
    assert port_problems({"x": "http"}) == ["x=http is outside 1..65535"]


def test_two_settings_on_one_port_and_a_port_on_ssh():
    problems = port_problems({"ray_cluster_port": 6379, "vllm_server_port": 6379, "ray_cluster_metrics_export_port": 22},
                             {}, {"the SSH port (ansible_port)": 22})
    assert problems == ["vllm_server_port=6379 is also ray_cluster_port",
                        "ray_cluster_metrics_export_port=22 is the SSH port (ansible_port)"]
