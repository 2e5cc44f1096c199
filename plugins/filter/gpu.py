# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the GPU contract: what a node's containers are given, and what the image's probe
found in one of them (roles/image/files/probe_image.py, run with --gpu)."""

from __future__ import annotations

# An NGC image starts through this script (CUDA compatibility libraries, checks, banner).
NGC_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"

_DRIVER_TOO_OLD = ("driver version is insufficient", "forward compatibility", "unsupported display driver",
                   "cuda driver version", "driver/library version mismatch")


def gpu_requests(use_gpus, node: dict) -> list:
    """Docker device requests for a node: every GPU (as `--gpus all`), or none.

    use_gpus is true, false or auto (the node has /dev/nvidia0, read by node_facts)."""
    wanted = str(use_gpus).lower()
    if wanted == "auto":
        wanted = "true" if (node or {}).get("paths", {}).get("/dev/nvidia0") else "false"
    if wanted in ("true", "yes", "1"):
        return [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    return []


def entrypoint_prefix(entrypoint) -> list:
    """What must stay in front of the roles' own command: NGC's entrypoint script, else nothing."""
    if isinstance(entrypoint, str):
        entrypoint = [entrypoint]
    if entrypoint and entrypoint[0] == NGC_ENTRYPOINT:
        return [NGC_ENTRYPOINT]
    return []


def kernels_for(arch_list, capability: str) -> bool:
    """Whether PyTorch built for arch_list can run on a GPU of this compute capability ("12.1").

    A cubin for sm_XY runs on the same major version with a minor of Y or more; PTX (compute_XY)
    is compiled by the driver for XY and anything newer; "a"/"f" variants run only where they name.
    """
    major, minor = (int(part) for part in capability.split("."))
    for arch in arch_list or []:
        kind, unused_sep, number = arch.partition("_")
        specific = number[-1:] in ("a", "f")
        digits = number[:-1] if specific else number
        if not digits.isdigit() or len(digits) < 2:
            continue
        arch_major, arch_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and (arch_major == major and (arch_minor == minor if specific else arch_minor <= minor)):
            return True
        if kind == "compute" and not specific and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def gpu_problem(gpu: dict, host: str, image: str) -> str:
    """Empty when a container of image, started with a GPU request on host, can use its GPUs;
    else one line that says what is wrong and how to fix it."""
    errors = "; ".join(gpu.get("errors") or [])
    driver = gpu.get("driver") or {}
    torch = gpu.get("torch") or {}
    if gpu.get("count", 0) == 0:
        if errors and any(hint in errors.lower() for hint in _DRIVER_TOO_OLD):
            return (f"{host}: {image} cannot use the node's GPU: {errors} (the node's driver "
                    f"{driver.get('driver_version') or 'unknown'} supports CUDA {driver.get('cuda_version') or 'unknown'}, "
                    f"the image's PyTorch is built for CUDA {torch.get('cuda') or 'unknown'}); use an image built for this "
                    f"driver's CUDA or update the node's NVIDIA driver")
        if driver.get("gpus"):
            return (f"{host}: the driver lists {len(driver['gpus'])} GPU(s) but CUDA in {image} sees none"
                    f"{' (' + errors + ')' if errors else ''}; check CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES "
                    f"in the image and the inventory")
        return (f"{host}: a container of {image} started with a GPU request sees no GPU"
                f"{' (' + errors + ')' if errors else ''}; install the NVIDIA container toolkit on the node and "
                f"restart Docker (nvidia-ctk runtime configure --runtime=docker), or set ray_cluster_use_gpus: false "
                f"for a node without GPUs")
    arch_list = torch.get("arch_list") or []
    if arch_list:
        for device in gpu.get("devices") or []:
            capability = device.get("compute_capability")
            if capability and not kernels_for(arch_list, capability):
                sm = "sm_" + capability.replace(".", "")
                return (f"{host}: {image} has no GPU kernels for the node's {device.get('name') or 'GPU'} "
                        f"(compute capability {capability}, {sm}): its PyTorch {torch.get('torch') or ''} is built for "
                        f"{', '.join(arch_list)}; use an image built for {sm}")
    return ""


class FilterModule:
    def filters(self):
        return {"gpu_requests": gpu_requests, "entrypoint_prefix": entrypoint_prefix,
                "gpu_kernels_for": kernels_for, "gpu_problem": gpu_problem}
