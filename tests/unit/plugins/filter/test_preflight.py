"""The preflight's rules (plugins/filter/preflight.py) on the bad inputs of tests/integration/test_bad_inputs.py.

Each test is named after the bad-input case it stands for (tp-times-pp-exceeds-gpus: test_tp_times_pp_exceeds_gpus)
and gives the rule the case's extra variables over the lab inventory's values: the roles' defaults, the lab's
group_vars (inventories/local_lab/group_vars/all.yml), what lab/gpulab_lab/inventory.py writes into hosts.yml for a
lab with its model (2 nodes, node1 the head) and what playbooks/deploy_qwen35.yml sets. It asserts the same pieces of
the error line the lab test does. The lab's real values pass every rule (test_the_lab_inventory_passes_every_rule).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import load_fixture

from ansible_collections.gpulab.vllm.plugins.filter.preflight import (
    deploy_port_problems, deploy_settings_problems, gate_problems, gpu_fit_problems, image_problems, ray_problems, role_default,
    served_folder_problems, source_folder_problems, vllm_problems, weights_problems)
from ansible_collections.gpulab.vllm.plugins.module_utils._node import (
    absent_container, describe_file, node_memory, parse_proc_net_tcp, summarize_inspect)

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "lab"))

from gpulab_lab.config import LabConfig  # noqa: E402
from gpulab_lab.models import MODEL_NAME, MODELS  # noqa: E402

MEMORY_SETTING = "vllm_server_gpu_memory_utilization (qwen35_gpu_memory_utilization for deploy_qwen35)"
CFG = LabConfig.from_env({})
NODES = CFG.node_names
HEAD = NODES[0]


def _defaults(role: str) -> dict:
    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def lab_vars(**extra) -> dict:
    """The variables a deploy_qwen35 run on the lab's inventory sees, with extra as -e gives them (over everything)."""
    found = {}
    for role in ("gate", "image", "ray_cluster", "vllm_server", "weights"):
        found.update(_defaults(role))
    found.update(yaml.safe_load((REPO / "inventories" / "local_lab" / "group_vars" / "all.yml").read_text()))
    # hosts.yml (lab/gpulab_lab/inventory.py): the secrets are 64 hex characters; the lab's model folder on the controller.
    found.update({"ray_cluster_auth_token": "0" * 64, "vllm_server_api_key": "1" * 64,
                  "lab_model_dir": str(MODELS / "vllm" / MODEL_NAME),
                  # lab_vllm_image as `make lab-up` pins it by digest (the digest is the registry's; any 64 hex here).
                  "image_ref": CFG.image_ref("vllm").rsplit(":", 1)[0] + "@sha256:" + "ab" * 32})
    # group_vars' templates as they render on a lab with its model.
    found.update({"weights_source": "controller", "weights_source_path": found["lab_model_dir"],
                  "qwen35_model": found["weights_dir"]})
    found.update(extra)
    # playbooks/deploy_qwen35.yml's play variables (an -e of the same name wins over them).
    play = {"vllm_server_model": found["qwen35_model"], "vllm_server_tensor_parallel_size": 2,
            "vllm_server_pipeline_parallel_size": 1, "vllm_server_gpu_memory_utilization": found["qwen35_gpu_memory_utilization"],
            "gate_expected_gpus": 2}
    return {**found, **play, **extra}


def recorded_read(name: str) -> dict:
    """The part of a node read (gpulab_node) the rules look at, as the node read makes it from what
    tests/unit/fixtures/node/NAME.json recorded on the lab: its containers and its listening TCP ports."""
    record = load_fixture("node", name)
    containers = {container: summarize_inspect(answer["body"], record["label"]) if answer["status"] == 200 else absent_container()
                  for container, answer in record["docker"]["inspect"].items()}
    ports = set()
    for listing in ("proc_net_tcp", "proc_net_tcp6"):
        ports |= parse_proc_net_tcp(record[listing]["stdout"])
    return {"containers": containers, "listening_tcp_ports": sorted(ports)}


def _prefixed(values: dict, prefix: str) -> dict:
    return {name: value for name, value in values.items() if name.startswith(prefix)}


# Each rule as the preflight calls it, on one node of the lab.
def deploy_settings(values):
    return deploy_settings_problems(values.get("gpulab_progress_interval", 30), values.get("gpulab_client_env", "~"))


def gpu_fit(values, hosts=None, head_group="ray_head"):
    hosts = NODES if hosts is None else hosts
    return gpu_fit_problems(values["vllm_server_tensor_parallel_size"], values["vllm_server_pipeline_parallel_size"],
                            values.get("gate_expected_gpus"), hosts, [values.get("ray_cluster_num_gpus")] * len(hosts),
                            [{}] * len(hosts), head_group)


def served_folder(values):
    return served_folder_problems(values["vllm_server_model"], values["weights_source"], values["weights_dir"])


def deploy_ports(values, host=HEAD):
    added = {"vllm_server_port": values.get("vllm_server_port")} if host == HEAD else {}
    if values["weights_source"]:
        added["weights_port"] = values.get("weights_port")
    return deploy_port_problems(_prefixed(values, "ray_cluster_"), host, added, values.get("ansible_port", 22))


def gate(values):
    return gate_problems(values["gate_timeout"], values["gate_poll_interval"], values["gate_expected_gpus"],
                         values["gate_raylet_grace"])


def image(values, host=HEAD):
    return image_problems(values["image_ref"], values["image_allow_tag"], host, {})


def ray(values, host=HEAD, read=None):
    return ray_problems(_prefixed(values, "ray_cluster_"), host, host == HEAD, read, "gpulab-ray-head", values.get("ansible_port", 22))


def vllm(values, host=HEAD, read=None):
    return vllm_problems(_prefixed(values, "vllm_server_"), host, host == HEAD, read, MEMORY_SETTING)


def weights(values, host=HEAD):
    return weights_problems(_prefixed(values, "weights_"), host, values.get("weights_source_host") or HEAD, NODES)


RULES = [deploy_settings, gpu_fit, served_folder, deploy_ports, gate, image, ray, vllm, weights]


def one_line(problems: list, pieces: list) -> str:
    """The line the preflight fails with (the first problem), holding every piece the lab test expects."""
    assert problems, "no problem found"
    line = problems[0]
    for piece in pieces:
        assert piece in line, f"{piece!r} not in {line!r}"
    return line


@pytest.mark.parametrize("rule", RULES, ids=[rule.__name__ for rule in RULES])
@pytest.mark.parametrize("host", NODES)
def test_the_lab_inventory_passes_every_rule(rule, host):
    if rule in (deploy_settings, gpu_fit, served_folder, gate):
        assert rule(lab_vars()) == []
    else:
        assert rule(lab_vars(), host=host) == []


def test_role_default_reads_the_roles_defaults():
    assert role_default("ray_cluster_port", "ray_cluster") == _defaults("ray_cluster")["ray_cluster_port"]
    assert role_default("supervisor_dir", "supervisor") == _defaults("supervisor")["supervisor_dir"]
    with pytest.raises(KeyError):
        role_default("no_such_setting", "ray_cluster")


# playbooks/deploy.yml's rules across roles.
def test_tp_times_pp_exceeds_gpus():
    one_line(gpu_fit(lab_vars(vllm_server_tensor_parallel_size=4, gate_expected_gpus=4)),
             ["tensor parallel 4 x pipeline parallel 1 = 4 GPUs", "the inventory offers 2", "make tensor x pipeline"])


def test_tp_times_pp_differs_from_gate():
    one_line(gpu_fit(lab_vars(gate_expected_gpus=3)), ["= 2 GPUs", "the gate expects 3 (gate_expected_gpus)"])


def test_empty_workers_with_tp_2():
    one_line(gpu_fit(lab_vars(), hosts=[HEAD]), ["= 2 GPUs, but the inventory offers 1", "node1: 1"])


def test_gpus_counted_from_the_node_read_without_ray_cluster_num_gpus():
    # No ray_cluster_num_gpus: the GPU devices the node read found count. No recorded read holds a GPU device (the
    # lab's nodes have none): nodes without a read offer none, and a count given for one node is that node's.
    one_line(gpu_fit_problems(2, 1, None, NODES, [None, None], [{}, {}]),
             ["= 2 GPUs, but the inventory offers 0 (node1: 0, node2: 0)", "[ray_head]"])
    one_line(gpu_fit_problems(3, 1, None, NODES, [2, None], [{}, {}], "heads"), ["the inventory offers 2 (node1: 2, node2: 0)", "[heads]"])
    assert gpu_fit_problems(2, 1, None, NODES, [2, None], [{}, {}]) == []


def test_model_not_the_weights_folder():
    one_line(served_folder(lab_vars(qwen35_model="/models/tiny-llama")),
             ["vllm_server_model is \"/models/tiny-llama\", but weights_source=controller puts the model in "
              "/srv/gpulab-lab/models/tiny-llama",
              "set vllm_server_model (qwen35_model for deploy_qwen35) to /srv/gpulab-lab/models/tiny-llama"])
    # A folder inside the weights folder is served from it.
    assert served_folder(lab_vars(qwen35_model="/srv/gpulab-lab/models/tiny-llama/sub")) == []


def test_weights_port_on_a_ray_port():
    one_line(deploy_ports(lab_vars(weights_port=6379)), ["weights_port=6379 is also ray_cluster_port", "choose another weights_port"])


def test_vllm_port_on_a_ray_port():
    one_line(deploy_ports(lab_vars(vllm_server_port=6379)),
             ["vllm_server_port=6379 is also ray_cluster_port", "choose another vllm_server_port"])
    # The server's port is the head's only.
    assert deploy_ports(lab_vars(vllm_server_port=6379), host="node2") == []


def test_deploy_ports_not_given_are_the_roles_defaults():
    # Nothing given: every port is its role's default, which collides with nothing.
    assert deploy_port_problems({}, HEAD, {"vllm_server_port": None, "weights_port": None}) == []
    line = one_line(deploy_port_problems({}, HEAD, {"vllm_server_port": role_default("ray_cluster_port", "ray_cluster")}),
                    ["vllm_server_port=6379 is also ray_cluster_port"])
    assert line.startswith("ports on node1: ")
    # Ray's own collisions are the Ray role's to report, not this rule's.
    assert deploy_port_problems({"ray_cluster_metrics_export_port": 6381}, HEAD, {"vllm_server_port": None}) == []
    assert deploy_port_problems({}, HEAD, {}) == []


def test_progress_interval_not_a_number():
    one_line(deploy_settings(lab_vars(gpulab_progress_interval="often")),
             ["gpulab_progress_interval is \"often\"", "as a number (0 for none)"])


def test_client_file_relative():
    one_line(deploy_settings(lab_vars(gpulab_client_env="lab.env")), ["gpulab_client_env is \"lab.env\"", "give an absolute path (or ~/...)"])
    assert deploy_settings(lab_vars(gpulab_client_env="")) == []


# roles/gate/tasks/preflight.yml
def test_gate_timeout_zero():
    one_line(gate(lab_vars(gate_timeout=0)), ["gate_timeout=0", "must be greater than 0"])


def test_gate_interval_negative():
    one_line(gate(lab_vars(gate_poll_interval=-1)), ["gate_poll_interval=-1", "must be greater than 0"])


# roles/image/tasks/preflight.yml (the platform rule is platform_problem's: tests/unit/plugins/filter/test_platform.py)
def test_image_ref_malformed():
    one_line(image(lab_vars(image_ref="not an image!")), ["is not an image reference", "NAME:TAG"])


def test_image_tag_only():
    ref = CFG.image_ref("vllm")
    line = one_line(image(lab_vars(image_ref=ref)),
                    ["names a tag, which the registry can move to another build", "pin it by digest", "image_allow_tag: true"])
    assert "`docker inspect --format '{{index .RepoDigests 0}}' IMAGE`" in line
    assert image(lab_vars(image_ref=ref, image_allow_tag=True)) == []


# roles/ray_cluster/tasks/preflight.yml
def test_ray_token_missing():
    one_line(ray(lab_vars(ray_cluster_auth_token="")),
             ["ray_cluster_auth_token on node", "is empty", "ansible-vault encrypt_string", "ray_cluster_auth: false"])
    assert ray(lab_vars(ray_cluster_auth_token="", ray_cluster_auth=False)) == []


def test_ray_port_out_of_range():
    one_line(ray(lab_vars(ray_cluster_port=70000)), ["ray_cluster_port=70000 must be 1..65535"])


def test_worker_ports_inverted():
    one_line(ray(lab_vars(ray_cluster_min_worker_port=12000, ray_cluster_max_worker_port=11000)),
             ["ray_cluster_min_worker_port=12000 must be below", "ray_cluster_max_worker_port=11000"])


def test_worker_range_over_ssh():
    one_line(ray(lab_vars(ray_cluster_min_worker_port=20)),
             ["the SSH port (ansible_port) 22 lies inside ray_cluster_min_worker_port..ray_cluster_max_worker_port (20..10999)"])


def test_worker_port_out_of_range():
    one_line(ray(lab_vars(ray_cluster_max_worker_port=70000)), ["ray_cluster_max_worker_port=70000 is outside 1..65535"])


def test_ray_ports_collide():
    one_line(ray(lab_vars(ray_cluster_metrics_export_port=6381)),
             ["ray_cluster_node_manager_port=6381 is also ray_cluster_metrics_export_port"])


def test_dashboard_beyond_loopback():
    one_line(ray(lab_vars(ray_cluster_dashboard=True, ray_cluster_dashboard_host="0.0.0.0")),
             ["ray_cluster_dashboard_host=0.0.0.0 on node", "has no authentication", "ray_cluster_dashboard_public: true"])


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_ray_on_the_recorded_reads(node):
    # Nothing deployed: nothing holds Ray's ports. Deployed: Ray's own container holds them, which is no problem.
    assert ray(lab_vars(), host=node, read=recorded_read(f"{node}_nothing_deployed")) == []
    own = "gpulab-ray-head" if node == HEAD else "gpulab-ray-worker"
    values = lab_vars()
    assert ray_problems(_prefixed(values, "ray_cluster_"), node, node == HEAD, recorded_read(f"{node}_deployed"), own) == []


def test_ray_ports_in_use_by_another_container():
    # The recorded deployed head, with the Ray head container renamed (ray_cluster_head_container): the ports the
    # running gpulab-ray-head holds are another program's now.
    values = lab_vars()
    line = one_line(ray_problems(_prefixed(values, "ray_cluster_"), HEAD, True, recorded_read("node1_deployed"), "renamed-ray-head"),
                    ["port(s) 6379, 6381, 6382, 6383, 6384, 6385, 6386, 10001 on node1 are already in use",
                     "choose other ports (ray_cluster_port, ray_cluster_*_port)"])
    assert line.startswith("port(s) ")


# roles/vllm_server/tasks/preflight.yml
def test_extra_args_as_string():
    one_line(vllm(lab_vars(vllm_server_extra_args="--enforce-eager --max-num-seqs 4")),
             ["vllm_server_extra_args=", "must be a list of strings", "one item per word"])


def test_extra_args_not_an_option():
    one_line(vllm(lab_vars(vllm_server_extra_args=["enforce-eager"])), ["must be a list of strings starting with an option"])


def test_health_timeout_negative():
    one_line(vllm(lab_vars(vllm_server_health_timeout=-5)), ["health timeout and interval must be greater than 0"])


def test_api_key_too_short():
    one_line(vllm(lab_vars(vllm_server_api_key="short")),
             ["vllm_server_api_key on node1 is shorter than 16 characters", "vllm_server_auth: false"])


def test_model_empty():
    one_line(vllm(lab_vars(qwen35_model="")), ["vllm_server_model must name a model"])


def test_dev_mode():
    one_line(vllm(lab_vars(vllm_server_extra_env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"})),
             ["VLLM_SERVER_DEV_MODE in vllm_server_extra_env", "vllm_server_allow_unsafe: true"])
    assert vllm(lab_vars(vllm_server_extra_env={"VLLM_SERVER_DEV_MODE": "1"}, vllm_server_allow_unsafe=True)) == []


def test_trust_remote_code():
    one_line(vllm(lab_vars(vllm_server_extra_args=["--enforce-eager", "--trust-remote-code"])),
             ["--trust-remote-code in vllm_server_extra_args runs Python code from the model repository"])


def test_tokenizer_info_endpoint():
    one_line(vllm(lab_vars(vllm_server_extra_args=["--enable-tokenizer-info-endpoint"])),
             ["--enable-tokenizer-info-endpoint in vllm_server_extra_args"])


def test_client_cidr_malformed():
    one_line(vllm(lab_vars(vllm_server_client_cidrs=["office"])),
             ["vllm_server_client_cidrs on node1: office", "give networks in CIDR form"])


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_vllm_on_the_recorded_reads(node):
    # Nothing deployed: port 8000 is free. Deployed: the server's own container holds it, which is no problem.
    assert vllm(lab_vars(), host=node, read=recorded_read(f"{node}_nothing_deployed")) == []
    assert vllm(lab_vars(), host=node, read=recorded_read(f"{node}_deployed")) == []


def test_vllm_port_in_use_by_another_container():
    # The recorded deployed head, with the server's container renamed (vllm_server_container): the port the running
    # gpulab-vllm holds is another program's now. The workers do not serve.
    one_line(vllm(lab_vars(vllm_server_container="renamed-vllm"), read=recorded_read("node1_deployed")),
             ["port 8000 on node1 is already in use", "set vllm_server_port to a free port"])
    assert vllm(lab_vars(vllm_server_container="renamed-vllm"), host="node2", read=recorded_read("node1_deployed")) == []


def test_unified_memory_too_small():
    # The lab's nodes share the machine's kernel, so their /proc/meminfo is the machine's: the recorded one of a Debian
    # 12 VM without a GPU (tests/unit/fixtures/memory/SOURCES.md), read as the node read reads it with
    # node_unified_memory: true and no nvidia-smi (the lab's nodes have none). 0.99 of MemTotal with the head's other
    # processes exceeds MemAvailable on any machine.
    meminfo = (Path(__file__).resolve().parents[2] / "fixtures" / "memory" / "debian12_vm_no_gpu_meminfo.txt").read_text()
    read = {**recorded_read("node1_nothing_deployed"), "memory": node_memory(meminfo, None, "true")}
    one_line(vllm(lab_vars(qwen35_gpu_memory_utilization=0.99), read=read),
             ["node1: unified memory (the GPU's memory is the host's)", "GiB available (MemAvailable)",
              "vllm_server_gpu_memory_utilization (qwen35_gpu_memory_utilization for deploy_qwen35)"])
    # The lab's own setting (null: vLLM's default, 0.9) on the same machine read as not unified: no memory rule.
    assert vllm(lab_vars(), read={**read, "memory": node_memory(meminfo, None, "auto")}) == []


# roles/weights/tasks/preflight.yml
def test_weights_source_missing():
    values = lab_vars(weights_source_path="/no/such/model")
    one_line(source_folder_problems(values["weights_source_path"], values["weights_source"], HEAD),
             ["weights_source_path /no/such/model is not a folder on the controller", "point weights_source_path at the folder"])


def test_weights_source_folder_on_the_controller_and_on_a_node(tmp_path):
    # The lab's source: a folder on the controller (here, one of the test's own).
    assert source_folder_problems(str(tmp_path), "controller", HEAD) == []
    # A file is not a folder.
    (tmp_path / "model.safetensors").write_text("")
    one_line(source_folder_problems(str(tmp_path / "model.safetensors"), "controller", HEAD), ["is not a folder on the controller"])
    # On a node: its read's entry for the folder (the node read's describe_file of it) decides, else the stat's answer.
    assert source_folder_problems(str(tmp_path), "node", "node2", describe_file(str(tmp_path))) == []
    one_line(source_folder_problems("/no/such/model", "node", "node2", describe_file("/no/such/model")),
             ["weights_source_path /no/such/model is not a folder on node2; put the model there"])
    one_line(source_folder_problems(str(tmp_path / "model.safetensors"), "node", "node2", describe_file(str(tmp_path / "model.safetensors"))),
             ["is not a folder on node2"])
    # No entry in the read: the stat module's answer (none when the stat did not run: not there).
    assert source_folder_problems("/models/m", "node", "node2", {}, {"exists": True, "isdir": True}) == []
    one_line(source_folder_problems("/models/m", "node", "node2", {}, {}), ["is not a folder on node2"])
    # A hub source has no folder to look for.
    assert source_folder_problems("", "hub", "node1") == []


def test_weights_dir_relative():
    one_line(weights(lab_vars(weights_dir="models/tiny", qwen35_model="models/tiny")),
             ["weights_dir is \"models/tiny\"; give the absolute folder the model goes to on every node"])


def test_weights_hub_unpinned():
    values = lab_vars(weights_source="hub", weights_repo="gpulab/tiny-llama", weights_revision="main",
                      weights_image=lab_vars()["image_ref"])
    one_line(weights(values), ["weights_revision is \"main\", not a commit: pin the revision to its 40-hex commit",
                               "or set weights_allow_unpinned"])
    assert weights({**values, "weights_allow_unpinned": True}) == []
    assert weights({**values, "weights_revision": "0123456789abcdef0123456789abcdef01234567"}) == []


def test_weights_settings_out_of_range():
    line = one_line(weights(lab_vars(weights_port=80)), ["weights_port=80 must be in 1024..65534"])
    assert re.match("^weights settings on node1: ", line)


def test_the_memory_guards_floors():
    meminfo = (Path(__file__).resolve().parents[2] / "fixtures" / "memory" / "debian12_vm_no_gpu_meminfo.txt").read_text()
    read = {**recorded_read("node1_nothing_deployed"), "memory": node_memory(meminfo, None, "true")}
    assert vllm(lab_vars(vllm_server_memory_drop_gib=8, vllm_server_memory_stop_gib=3), read=recorded_read("node1_nothing_deployed")) == []
    # With the node's memory read, the floors are judged first (the server's share after them).
    one_line(vllm(lab_vars(vllm_server_memory_drop_gib=2, vllm_server_memory_stop_gib=3)),
             ["vllm_server_memory_drop_gib=2 and vllm_server_memory_stop_gib=3 on node1", "at most the drop floor"])
    one_line(vllm(lab_vars(vllm_server_memory_stop_gib="three")), ["vllm_server_memory_stop_gib=\"three\""])
    one_line(vllm(lab_vars(vllm_server_memory_drop_gib=30, vllm_server_memory_stop_gib=24), read=read),
             ["vllm_server_memory_stop_gib=24 on node1 is at or above the node's whole memory (23.5 GiB)"])
