# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's rules: every input the deploy and its roles take, checked before any node is changed.

Each *_problems filter returns a list of problem lines (empty: fine), one line each saying what is wrong, where,
and how to fix it; the preflight tasks assert that the list is empty and fail with its first line. The rules were
Jinja in playbooks/deploy.yml's first play and in roles/*/tasks/preflight.yml; here they are unit-tested
(tests/unit/plugins/filter/test_preflight.py) on the bad inputs the lab's test_bad_inputs.py gives the playbook.

A value is read as the Jinja it replaces read it: `| int` is 0 for what is not a number, `| float` 0.0, a setting
tested as a truth value is Python's (and Jinja's) truth of it.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache

import yaml
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpulab.vllm.plugins.filter.fabric import cidr_problem
from ansible_collections.gpulab.vllm.plugins.filter.memory import memory_problem
from ansible_collections.gpulab.vllm.plugins.filter.platform import platform_problem
from ansible_collections.gpulab.vllm.plugins.filter.ports import port_problems

# The collection's root: this file is plugins/filter/preflight.py in it, in a checkout and in an installed collection.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER_RANGE = "ray_cluster_min_worker_port..ray_cluster_max_worker_port"
SSH = "the SSH port (ansible_port)"
# Ray's ports on the head only, then on every node.
RAY_HEAD_PORTS = ("ray_cluster_port", "ray_cluster_client_server_port")
RAY_NODE_PORTS = ("ray_cluster_node_manager_port", "ray_cluster_object_manager_port", "ray_cluster_runtime_env_agent_port",
                  "ray_cluster_dashboard_agent_grpc_port", "ray_cluster_dashboard_agent_listen_port", "ray_cluster_metrics_export_port")
LOOPBACK = ("127.0.0.1", "::1", "localhost")
GPU_DEVICES = "/dev/nvidia[0-9]*"


def _int(value, default=0):
    """Jinja's `| int`: a number, a string of one (a float's whole part), else default."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return default


def _float(value, default=0.0):
    """Jinja's `| float`."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _json(value) -> str:
    """Ansible's `| to_json` of a setting."""
    return json.dumps(value)


def _match(pattern: str, value) -> bool:
    """Jinja's `is match`: from the start of a string; nothing else matches."""
    return isinstance(value, str) and re.match(pattern, value) is not None


def _is_list(value) -> bool:
    """Jinja's `is sequence and is not string`."""
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (str, bytes))


@lru_cache(maxsize=None)
def _defaults(role: str) -> dict:
    with open(os.path.join(_ROOT, "roles", role, "defaults", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def role_default(name: str, role: str):
    """The default a role of this collection gives one of its variables (its defaults/main.yml), so that a rule
    outside the role does not repeat it: `supervisor_dir | default('supervisor_dir' | gpulab.vllm.role_default('supervisor'))`."""
    defaults = _defaults(role)
    if name not in defaults:
        raise KeyError(f"the {role} role has no default for {name}")
    return defaults[name]


def _given(settings: dict, name: str, role: str):
    """A setting as given, or its role's default where it was not (None)."""
    value = (settings or {}).get(name)
    return role_default(name, role) if value is None else value


def deploy_settings_problems(progress_interval, client_env) -> list:
    """The deploy's own settings: the seconds between progress lines, the controller file a client sources."""
    problems = []
    if not re.match(r"^[0-9]+([.][0-9]*)?$", str(progress_interval)):
        problems.append(f"gpulab_progress_interval is {_json(progress_interval)}; give the seconds between two progress lines "
                        "of a long wait as a number (0 for none)")
    if not (isinstance(client_env, str) and (client_env == "" or re.match("[/~]", client_env))):
        problems.append(f"gpulab_client_env is {_json(client_env)}; give an absolute path (or ~/...) for the client file the "
                        "deploy writes on the controller, or '' to write none")
    return problems


def gpu_fit_problems(tensor_parallel, pipeline_parallel, gate_expected, hosts: list, num_gpus: list, reads: list,
                     head_group: str = "ray_head") -> list:
    """The model's parallelism, the gate's GPU count and the GPUs the nodes offer Ray agree.

    hosts: the play's nodes; num_gpus: each one's ray_cluster_num_gpus (None where not given: then the GPU devices
    its read (gpulab_node) found count); gate_expected: gate_expected_gpus, None for the parallelism's product."""
    needed = _int(tensor_parallel) * _int(pipeline_parallel)
    gate = needed if gate_expected is None else gate_expected
    gpus = [_int(given) if given is not None else len(((read or {}).get("globs") or {}).get(GPU_DEVICES) or [])
            for given, read in zip(num_gpus, reads)]
    offered = sum(gpus)
    if needed == _int(gate) and needed <= offered:
        return []
    if needed != _int(gate):
        other = f"the gate expects {gate} (gate_expected_gpus)"
    else:
        other = "the inventory offers %d (%s)" % (offered, ", ".join(f"{host}: {count}" for host, count in zip(hosts, gpus)))
    return [f"tensor parallel {tensor_parallel} x pipeline parallel {pipeline_parallel} = {needed} GPUs, but {other}; "
            f"make tensor x pipeline parallel size equal to the GPUs of the nodes in [{head_group}] and the workers group"]


def served_folder_problems(model, weights_source, weights_dir) -> list:
    """With the weights role putting the model on the nodes, the server serves that folder (offline, a hub name
    would not load). The folder's trailing slashes are read as deploy.yml's other rules read them."""
    if not weights_source or (str(model) + "/").startswith(re.sub("/*$", "/", str(weights_dir))):
        return []
    return [f"vllm_server_model is {_json(model)}, but weights_source={weights_source} puts the model in {weights_dir} on "
            f"every node; set vllm_server_model (qwen35_model for deploy_qwen35) to {weights_dir}"]


def deploy_port_problems(ray: dict, host: str, added: dict, ssh_port=22) -> list:
    """The ports the deploy adds to Ray's on a node are none of Ray's, of each other's, or SSH's.

    ray: Ray's ports and worker range as given ({variable: value}, None where not given: the ray_cluster role's
    default); added: {'vllm_server_port': ..., 'weights_port': ...}, each only where it applies (the server's on the
    head, the copy servers' where the weights role runs), None for its role's default. weights_port brings the port
    after it (a node's source folder)."""
    if not added:
        return []
    ports = {}
    if "vllm_server_port" in added:
        ports["vllm_server_port"] = _given(added, "vllm_server_port", "vllm_server")
    if "weights_port" in added:
        ports["weights_port"] = _given(added, "weights_port", "weights")
        ports["weights_port+1"] = _int(ports["weights_port"]) + 1
    names = list(ports)
    ports.update({name: _given(ray, name, "ray_cluster") for name in RAY_HEAD_PORTS + RAY_NODE_PORTS})
    low, unused, high = WORKER_RANGE.partition("..")
    found = [problem for problem in port_problems(ports, {WORKER_RANGE: [_given(ray, low, "ray_cluster"), _given(ray, high, "ray_cluster")]},
                                                  {SSH: ssh_port})
             if any(name in problem for name in names)]
    if not found:
        return []
    text = " ".join(found)
    fix = [name for name in dict.fromkeys(name.replace("+1", "") for name in names) if name in text]
    return [f"ports on {host}: {'; '.join(found)}; choose another {' or '.join(fix)}"]


def gate_problems(timeout, poll_interval, expected_gpus, raylet_grace) -> list:
    """The gate's settings: its wait and poll interval above 0, the GPU count and the raylet's grace 0 or more."""
    if _int(timeout) > 0 and _float(poll_interval) > 0 and _int(expected_gpus) >= 0 and _float(raylet_grace) >= 0:
        return []
    return [f"gate settings: gate_timeout={timeout} and gate_poll_interval={poll_interval} must be greater than 0, "
            f"gate_expected_gpus={expected_gpus} and gate_raylet_grace={raylet_grace} must be 0 or more"]


def image_problems(image_ref, allow_tag, host: str, node: dict | None = None) -> list:
    """The image reference: a reference at all, pinned by digest (a tag is a name a registry can move to another
    build) unless a tag is allowed, and, with the node's read, one the node's platform can run."""
    problems = []
    if not _match(r"^[a-zA-Z0-9][a-zA-Z0-9._:/@+-]*$", image_ref):
        problems.append(f"image_ref={_json(image_ref)} on {host} is not an image reference; set it to NAME:TAG or NAME@sha256:DIGEST")
    if not (allow_tag or re.search("@sha256:[0-9a-f]{64}$", str(image_ref))):
        problems.append(f"image_ref={image_ref} on {host} names a tag, which the registry can move to another build; pin it by "
                        "digest (NAME@sha256:..., which `docker inspect --format '{{index .RepoDigests 0}}' IMAGE` prints on a "
                        "node that has it), or set image_allow_tag: true to trust the tag")
    platform = platform_problem(node, image_ref, host) if node else ""
    if platform:
        problems.append(platform)
    return problems


def _running(read: dict, container: str) -> bool:
    return bool((((read or {}).get("containers") or {}).get(container) or {}).get("running"))


def ray_problems(settings: dict, host: str, head: bool, read: dict | None = None, own_container: str = "",
                 ssh_port=22) -> list:
    """The Ray settings of one node: its ports, GPUs, extra arguments, token, dashboard, and (with the node's read)
    the ports another program holds. settings: the ray_cluster_* variables, by name."""
    get = (settings or {}).get
    problems = []
    num_gpus = get("ray_cluster_num_gpus")
    if not (0 < _int(get("ray_cluster_port")) < 65536 and (num_gpus is None or _int(num_gpus) >= 0)
            and _is_list(get("ray_cluster_extra_args"))):
        # Ansible's type check would take a string for a list of one item: said here instead.
        problems.append(f"Ray settings on {host}: ray_cluster_port={get('ray_cluster_port')} must be 1..65535, "
                        f"ray_cluster_num_gpus={num_gpus} must be 0 or more, ray_cluster_extra_args must be a list of strings")
    token = get("ray_cluster_auth_token") or ""
    if get("ray_cluster_auth") and len(token) < 16:
        problems.append(f"ray_cluster_auth_token on {host} is {'shorter than 16 characters' if token else 'empty'} while Ray "
                        "token authentication is on; set it from Ansible Vault (ansible-vault encrypt_string "
                        "\"$(openssl rand -hex 32)\" --name ray_cluster_auth_token), or set ray_cluster_auth: false to run "
                        "Ray without authentication")
    # Two settings on one port, or a port of Ray's over SSH (or SSH inside the worker range, which an earlier
    # release's firewall covered), would fail late or cut the operator off the node.
    names = (RAY_HEAD_PORTS if head else ()) + RAY_NODE_PORTS
    low, unused, high = WORKER_RANGE.partition("..")
    ports = port_problems({name: get(name) for name in names}, {WORKER_RANGE: [get(low), get(high)]}, {SSH: ssh_port})
    if ports:
        problems.append(f"Ray's ports on {host}: {'; '.join(ports)}; choose other ports (ray_cluster_*_port, {WORKER_RANGE})")
    # The dashboard has no authentication: anyone who reaches it can run code on the cluster.
    dashboard_host = get("ray_cluster_dashboard_host")
    if get("ray_cluster_dashboard") and not get("ray_cluster_dashboard_public") and dashboard_host not in LOOPBACK:
        problems.append(f"ray_cluster_dashboard_host={dashboard_host} on {host} would serve Ray's dashboard, which has no "
                        "authentication, beyond loopback; keep it on 127.0.0.1 and reach it through an SSH tunnel "
                        "(ssh -L 8265:127.0.0.1:8265 HEAD), or set ray_cluster_dashboard_public: true to accept the risk")
    # Ports in use count only with a node read, and not while this node's own Ray container holds them.
    if read and not _running(read, own_container):
        listening = set(read.get("listening_tcp_ports") or [])
        taken = sorted({_int(get(name)) for name in names} & listening)
        if taken:
            problems.append(f"port(s) {', '.join(str(port) for port in taken)} on {host} are already in use by another program, "
                            "and Ray needs them; stop that program or choose other ports (ray_cluster_port, ray_cluster_*_port)")
    return problems


def _unsafe(extra_args, extra_env) -> list:
    """What opens more than the key guards: dev routes that reset, sleep or run code on the engine, the chat
    template and tokenizer internals, code from the model's repository run with the server's rights."""
    args = [arg for arg in extra_args if isinstance(arg, str)] if _is_list(extra_args) else []
    dev_mode = str((extra_env or {}).get("VLLM_SERVER_DEV_MODE", "0")).lower() not in ("0", "false", "")

    def given(option):
        return any(re.match(option + "(=|$)", arg) for arg in args)

    return ((["VLLM_SERVER_DEV_MODE in vllm_server_extra_env turns on routes that reset, sleep and call into the engine"]
             if dev_mode else [])
            + (["--enable-tokenizer-info-endpoint in vllm_server_extra_args serves the tokenizer and its chat template"]
               if given("--enable-tokenizer-info-endpoint") else [])
            + (["--trust-remote-code in vllm_server_extra_args runs Python code from the model repository in the server"]
               if given("--trust-remote-code") else [])
            + (["--api-key in vllm_server_extra_args would put the key on the command line; set vllm_server_api_key"]
               if given("--api-key") else []))


def vllm_problems(settings: dict, host: str, head: bool, read: dict | None = None,
                  memory_setting: str = "vllm_server_gpu_memory_utilization") -> list:
    """The vLLM server's settings on one node: model, sizes, port, health wait, extra arguments, client networks,
    key, what is unsafe, and (with the head's read) its port in use and, on unified memory, its memory.
    settings: the vllm_server_* variables, by name."""
    get = (settings or {}).get
    problems = []
    model, port = get("vllm_server_model"), get("vllm_server_port")
    tp, pp = get("vllm_server_tensor_parallel_size"), get("vllm_server_pipeline_parallel_size")
    if not (model and _int(tp) >= 1 and _int(pp) >= 1 and 0 < _int(port) < 65536
            and _int(get("vllm_server_health_timeout")) > 0 and _float(get("vllm_server_health_interval")) > 0):
        problems.append(f"vLLM settings: vllm_server_model must name a model (it is {_json(model)}), tensor/pipeline parallel "
                        f"sizes ({tp}/{pp}) must be 1 or more, vllm_server_port={port} must be 1..65535, health timeout and "
                        "interval must be greater than 0")
    args = get("vllm_server_extra_args")
    if not (_is_list(args) and not isinstance(args, dict) and all(isinstance(arg, str) for arg in args)
            and (len(args) == 0 or re.match("^--?[A-Za-z]", args[0]))):
        problems.append(f"vllm_server_extra_args={_json(args)} must be a list of strings starting with an option, one item per "
                        "word, e.g. ['--speculative-config', '{\"method\": \"ngram\"}']")
    bad_cidrs = [f"{cidr}: {cidr_problem(cidr)}" for cidr in get("vllm_server_client_cidrs") or [] if cidr_problem(cidr)]
    if bad_cidrs:
        problems.append(f"vllm_server_client_cidrs on {host}: {'; '.join(bad_cidrs)}; give networks in CIDR form, "
                        "e.g. ['10.10.0.0/16', 'fd00::/64']")
    key = get("vllm_server_api_key") or ""
    if get("vllm_server_auth") and len(key) < 16:
        problems.append(f"vllm_server_api_key on {host} is {'shorter than 16 characters' if key else 'empty'} while the API key "
                        "is required; set it from Ansible Vault (ansible-vault encrypt_string \"$(openssl rand -hex 32)\" "
                        "--name vllm_server_api_key), or set vllm_server_auth: false to serve without a key")
    unsafe = _unsafe(args, get("vllm_server_extra_env"))
    if unsafe and not get("vllm_server_allow_unsafe"):
        problems.append(f"{'; '.join(unsafe)} on {host}; remove it, or set vllm_server_allow_unsafe: true to accept what it opens")
    # Ports in use count only on the head with a node read, and not while the server's own container holds them.
    if (head and read and not _running(read, get("vllm_server_container"))
            and _int(port) in (read.get("listening_tcp_ports") or [])):
        problems.append(f"port {port} on {host} is already in use by another program, and the vLLM server needs it; stop that "
                        "program or set vllm_server_port to a free port")
    # The memory guard's floors (roles/vllm_server/files/gpulab_memory_guard.py), where they are given.
    if "vllm_server_memory_stop_gib" in (settings or {}):
        drop, stop = get("vllm_server_memory_drop_gib"), get("vllm_server_memory_stop_gib")
        total = ((read or {}).get("memory") or {}).get("total")
        if not (_float(stop, -1.0) > 0 and _float(drop, -1.0) >= _float(stop, -1.0)):
            problems.append(f"vllm_server_memory_drop_gib={_json(drop)} and vllm_server_memory_stop_gib={_json(stop)} on {host}: "
                            "give the memory guard's floors in GiB, the stop floor above 0 and at most the drop floor "
                            "(8 and 3 by default)")
        elif total and _float(stop) * 1024 ** 3 >= float(total):
            problems.append(f"vllm_server_memory_stop_gib={_json(stop)} on {host} is at or above the node's whole memory "
                            f"({float(total) / 1024 ** 3:.1f} GiB): the memory guard would stop every load; give a floor "
                            "of a few GiB (3 by default)")
    # On unified memory (GB10) the server's share is the host's memory (plugins/filter/memory.py).
    memory = memory_problem(read or {}, host, get("vllm_server_gpu_memory_utilization"), head, memory_setting)
    if memory:
        problems.append(memory)
    return problems


def weights_problems(settings: dict, host: str, source_host: str, play_hosts: list) -> list:
    """Where the model comes from and where it goes, and the copy's settings, on one node (with weights_source
    given). settings: the weights_* variables, by name; source_host: the node that holds or fetches the source."""
    get = (settings or {}).get
    source, path, weights_dir = get("weights_source"), get("weights_source_path"), get("weights_dir")
    revision = get("weights_revision")
    found = []
    if not _match("/", weights_dir):
        found.append(f"weights_dir is {_json(weights_dir)}; give the absolute folder the model goes to on every node")
    if source != "hub" and not _match("/", path):
        found.append(f"weights_source_path is {_json(path)}; give the absolute folder the model is in on "
                     + ("the controller" if source == "controller" else str(source_host)))
    if source in ("node", "hub") and source_host not in play_hosts:
        found.append(f"weights_source_host {source_host} is not one of this play's nodes ({', '.join(play_hosts)}); name the node "
                     "that " + ("fetches from the hub" if source == "hub" else f"holds {path}"))
    if source == "hub" and not _match("^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$", get("weights_repo")):
        found.append(f"weights_repo is {_json(get('weights_repo'))}; name the hub repository as ORG/NAME")
    if source == "hub" and not (_match("^[0-9a-f]{40}$", revision)
                                or (boolean(get("weights_allow_unpinned"), strict=False) and revision)):
        found.append(f"weights_revision is {_json(revision)}, not a commit: pin the revision to its 40-hex commit (the hub "
                     "lists it), or set weights_allow_unpinned to take whatever the name points at")
    if source == "hub" and not get("weights_image"):
        found.append("weights_image is empty; name an image with huggingface_hub (the deploy playbook passes the serving image)")
    if re.sub("/+$", "", str(weights_dir)) in ("", "/"):
        found.append("weights_dir is the root folder; give the model a folder of its own")
    problems = [f"weights on {host}: {'; '.join(found)}"] if found else []
    port, streams = get("weights_port"), get("weights_streams")
    timeout, idle, margin = get("weights_timeout"), get("weights_server_idle"), get("weights_free_margin_mb")
    if not (1024 <= _int(port) < 65535 and 1 <= _int(streams) <= 64 and _int(timeout) > 0 and _int(idle) > 0
            and _int(margin) >= 0):
        problems.append(f"weights settings on {host}: weights_port={port} must be in 1024..65534 (the port after it serves a "
                        f"node's source folder), weights_streams={streams} in 1..64, weights_timeout={timeout} and "
                        f"weights_server_idle={idle} above 0, weights_free_margin_mb={margin} 0 or more")
    return problems


def source_folder_problems(path, source, holder: str, known: dict | None = None, found: dict | None = None) -> list:
    """The weights' source folder is there: on the controller (looked at here, in the controller's process), or on
    the node that holds it (holder), as its read (known: its entry of gpulab_node.files) or a stat of it (found:
    the stat module's `stat`) says."""
    if source == "controller":
        there = os.path.isdir(str(path))
    elif source == "node":
        there = bool((known or {}).get("isdir")) if "exists" in (known or {}) else bool((found or {}).get("isdir"))
    else:
        return []
    if there:
        return []
    where = "the controller" if source == "controller" else holder
    return [f"weights_source_path {path} is not a folder on {where}; put the model there, or point weights_source_path "
            "at the folder that holds it"]


class FilterModule:
    def filters(self):
        return {
            "role_default": role_default,
            "deploy_settings_problems": deploy_settings_problems,
            "gpu_fit_problems": gpu_fit_problems,
            "served_folder_problems": served_folder_problems,
            "deploy_port_problems": deploy_port_problems,
            "gate_problems": gate_problems,
            "image_problems": image_problems,
            "ray_problems": ray_problems,
            "vllm_problems": vllm_problems,
            "weights_problems": weights_problems,
            "source_folder_problems": source_folder_problems,
        }
