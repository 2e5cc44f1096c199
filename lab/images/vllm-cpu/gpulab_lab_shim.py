"""Lab-only shims that let vLLM's CPU build stand in for a GPU build across lab nodes, and keep
the rules a real GPU host enforces.

1. GPUs exist only where the container was started with a GPU request. The lab nodes' Docker
   daemons run a stand-in for the NVIDIA container hook (lab/gpu/) that writes a marker file
   into exactly those containers. With the marker, the CPU platform takes Ray's "GPU" resource
   as its device (the CPU build otherwise refuses the Ray executor; each lab node advertises
   its lab GPUs to Ray), so placement groups put one tensor-parallel rank per lab node, as on
   real hosts. Without it, vLLM finds no platform at all and stops with "Failed to infer
   device type", as it does in a container that the NVIDIA runtime gave no GPU.
2. The CPU build's tensor-parallel all-reduce uses a shared-memory segment and assumes every
   rank of a group runs on one machine. Lab nodes, like real ones, each have their own
   /dev/shm, so the shim makes it use torch.distributed (gloo over the fabric) instead, which
   is what crosses nodes.
3. NCCL's rule for its socket interface: when a worker sets up its process groups,
   NCCL_SOCKET_IFNAME must match an interface of its own node, or NCCL stops ("no socket
   interface found"). The lab does not run NCCL, so the shim applies that rule where NCCL
   would, and writes the fabric settings the worker runs with (names of the other variables,
   never their values) under /tmp/gpulab-lab/ for the tests to read.

4. vLLM 0.17's CPU build (the seed's version) needs two more to run its ranks as Ray actors: its
   platform would switch a multi-rank Ray backend to multiprocessing, and its worker has no device
   for the Ray compiled graph to set. With the marker the shim keeps Ray and gives the worker the
   CPU device, as a GPU worker has its GPU.

Real deployments never carry this file. It is loaded from gpulab_lab_shim.pth at every
interpreter start (Debian's own sitecustomize would shadow one of ours) and patches a module
only when vLLM imports it, so other processes pay nothing.
"""

import importlib.abc
import importlib.util
import json
import os
import socket
import sys

GPU_MARKER = "/etc/gpulab-lab/gpus.json"
WORKER_RECORDS = "/tmp/gpulab-lab"
# The settings that must be this node's own in every worker process.
FABRIC_VARIABLES = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                    "UCX_NET_DEVICES", "NCCL_IB_HCA", "OMPI_MCA_btl_tcp_if_include")


def _lab_gpus():
    try:
        with open(GPU_MARKER) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _platforms(module):
    if _lab_gpus() is None:
        print("gpulab lab: this container was started without a GPU request, so it has no GPU; "
              "vLLM finds no platform here, as on a real host", file=sys.stderr)
        module.builtin_platform_plugins["cpu"] = lambda: None


def _cpu_platform(module):
    if _lab_gpus() is None:
        return
    platform = module.CpuPlatform
    platform.ray_device_key = "GPU"
    # Older CPU builds (0.17) turn a Ray backend with more than one rank into their multiprocessing
    # one; with lab GPUs the ranks must stay Ray actors on the lab nodes, as on GPU hosts.
    original = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        parallel = vllm_config.parallel_config
        if parallel.distributed_executor_backend != "ray":
            return original(cls, vllm_config)
        parallel.distributed_executor_backend = None
        try:
            return original(cls, vllm_config)
        finally:
            parallel.distributed_executor_backend = "ray"

    platform.check_and_update_config = classmethod(check_and_update_config)


def _cpu_worker(module):
    # vLLM 0.17's CPU worker leaves its device unset; its Ray worker wrapper asserts one before each
    # compiled-graph step, which a GPU worker always has. 0.32 sets it.
    if _lab_gpus() is None:
        return
    original = module.CPUWorker.init_device

    def init_device(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if getattr(self, "device", None) is None:
            import torch
            self.device = torch.device("cpu")
        return result

    module.CPUWorker.init_device = init_device


def _cpu_communicator(module):
    module.CpuCommunicator._all_group_ranks_share_shm_group_name = lambda self: False


def _nccl_interface_matches(spec, names):
    """NCCL_SOCKET_IFNAME as NCCL reads it: a comma list of prefixes, exact names after '=',
    names to avoid after '^'."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    patterns = [item for item in spec.split(",") if item]

    def hit(name):
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [name for name in names if hit(name) != exclude]


def _check_and_record_fabric():
    names = [entry[1] for entry in socket.if_nameindex()]
    spec = os.environ.get("NCCL_SOCKET_IFNAME")
    if spec and not _nccl_interface_matches(spec, names):
        raise RuntimeError(
            "gpulab lab NCCL stand-in on %s: NCCL_SOCKET_IFNAME=%s matches no interface of this node (%s); "
            "NCCL stops here with 'no socket interface found'" % (socket.gethostname(), spec, ", ".join(names)))
    record = {
        "pid": os.getpid(),
        "node": socket.gethostname(),
        "fabric": {key: os.environ.get(key) for key in FABRIC_VARIABLES},
        "variables": sorted(os.environ),
    }
    try:
        os.makedirs(WORKER_RECORDS, exist_ok=True)
        with open(os.path.join(WORKER_RECORDS, "worker-%d.json" % os.getpid()), "w") as handle:
            json.dump(record, handle)
    except OSError as exc:
        print("gpulab lab: could not record the worker's fabric settings: %s" % exc, file=sys.stderr)


def _parallel_state(module):
    original = module.init_distributed_environment

    def init_distributed_environment(*args, **kwargs):
        _check_and_record_fabric()
        return original(*args, **kwargs)

    module.init_distributed_environment = init_distributed_environment


_PATCHES = {
    "vllm.platforms": _platforms,
    "vllm.platforms.cpu": _cpu_platform,
    "vllm.v1.worker.cpu_worker": _cpu_worker,
    "vllm.distributed.device_communicators.cpu_communicator": _cpu_communicator,
    "vllm.distributed.parallel_state": _parallel_state,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
