"""Lab stand-in for the NVIDIA container toolkit's OCI prestart hook.

dockerd registers its "nvidia" device driver only when a program of this name is on
its PATH, and then adds it as a prestart hook to every container started with a GPU
request (`--gpus`, or `device_requests` in community.docker), and to no other. The
real hook mounts the driver's libraries and device nodes into the container; without
them nothing in the container can use a GPU. This stand-in puts a lab GPU marker
(/etc/gpulab-lab/gpus.json) into the container's root file system instead: the lab
images read it as "a GPU is here" (lab/images/*/gpulab_lab_shim.py) and see none
without it, as on a real host. Each lab node's dockerd is given it (lab/labctl.py)
with the node's GPU count and memory kind in its environment, which the hook
inherits. Never installed on a real host.
"""

import json
import os
import sys

MARKER = "etc/gpulab-lab/gpus.json"


def fail(message):
    print("gpulab lab nvidia hook: " + message, file=sys.stderr)
    return 1


def main(argv):
    if argv[1:2] != ["prestart"]:
        return fail("only the prestart stage is supported, got %r" % argv[1:])
    state = json.load(sys.stdin)
    bundle = state["bundle"]
    with open(os.path.join(bundle, "config.json")) as handle:
        spec = json.load(handle)
    root = spec["root"]["path"]
    if not os.path.isabs(root):
        root = os.path.join(bundle, root)
    env = dict(item.split("=", 1) for item in spec.get("process", {}).get("env", []) if "=" in item)
    wanted = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if wanted in ("", "void", "none"):
        return 0
    count = int(os.environ.get("GPULAB_LAB_GPUS", "1"))
    if wanted == "all":
        indices = list(range(count))
    else:
        try:
            indices = [int(item) for item in wanted.split(",")]
        except ValueError:
            return fail("NVIDIA_VISIBLE_DEVICES=%s: the lab names GPUs by index only" % wanted)
        if any(index < 0 or index >= count for index in indices):
            return fail("unknown device %s: this lab node has %d GPU(s)" % (wanted, count))
    node = os.environ.get("GPULAB_LAB_NODE", "lab")
    marker = {
        "node": node,
        "unified_memory": os.environ.get("GPULAB_LAB_UNIFIED_MEMORY") == "1",
        "gpus": [{"index": index, "uuid": "GPU-gpulab-lab-%s-%d" % (node, index), "name": "gpulab lab GPU"}
                 for index in indices],
    }
    path = os.path.join(root, MARKER)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(marker, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
