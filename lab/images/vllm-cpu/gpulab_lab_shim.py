"""Lab-only shims that let vLLM's CPU build run tensor parallelism over Ray across lab nodes.

1. The CPU build refuses `--distributed-executor-backend ray` because its platform
   declares no Ray device key. The lab starts every Ray node with `--num-gpus=1`,
   so mapping the CPU platform onto Ray's "GPU" resource lets placement groups
   place one tensor-parallel rank per lab node, as on real GPU hosts.
2. The CPU build's tensor-parallel all-reduce uses a shared-memory segment and
   assumes every rank of a group runs on one machine. Lab nodes, like real ones,
   each have their own /dev/shm, so the shim makes it use torch.distributed (gloo
   over the fabric) instead, which is what crosses nodes.

Real deployments never carry this file. It is loaded from gpulab_lab_shim.pth at
every interpreter start (Debian's own sitecustomize would shadow one of ours) and
patches a module only when vLLM imports it, so other processes pay nothing.
"""

import importlib.abc
import importlib.util
import sys


def _cpu_platform(module):
    module.CpuPlatform.ray_device_key = "GPU"


def _cpu_communicator(module):
    module.CpuCommunicator._all_group_ranks_share_shm_group_name = lambda self: False


_PATCHES = {
    "vllm.platforms.cpu": _cpu_platform,
    "vllm.distributed.device_communicators.cpu_communicator": _cpu_communicator,
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
