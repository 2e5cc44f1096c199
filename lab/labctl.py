"""The lab in a box: several simulated GPU hosts on one Linux machine.

Each lab node is a network namespace with two interfaces, like a real lab host:
a management one (default route, SSH) and a fabric one named like a ConnectX
port (the RoCE/InfiniBand link). Every node runs its own Docker daemon and its
own sshd; a registry on the machine serves the lab images to every node.

    labctl.py up       bring the lab up (idempotent)
    labctl.py down     remove everything the lab made (safe to run twice)
    labctl.py status   print the lab's state as JSON
    labctl.py images   build and push the lab images only
    labctl.py build [IMAGE[=FILE]...]   build lab images without a lab, starting only its registry, and push each
                   (every wheel set downloads at once first; IMAGE=FILE touches FILE once IMAGE is pushed; with
                   a lab up, each image is pulled onto its nodes right after its push, while the next one builds)
    labctl.py link NODE up|down   plug or pull a node's fabric cable (failure drills)
    labctl.py docker NODE start|stop   start or stop a node's Docker daemon
    labctl.py input NODE drop|accept   harden a node (INPUT policy DROP; loopback, replies, SSH admitted) or open it
    labctl.py rdma NODE FIXTURE|off   show a node a recorded sysfs tree (tests/unit/fixtures/sysfs) with its HCAs
    labctl.py rate NODE RATE|off   throttle what a node sends on its fabric link (a tc rate: 200mbit) or lift it
    labctl.py hub up|down          a Hugging Face hub mirror (olah) on the management gateway serving the lab model
    labctl.py disk NODE SIZE|off   give a node a small file system (tmpfs, e.g. 2M) where its model folder lives, or its own again

Parameters come from the environment: NODES, FABRIC_SUBNET, MGMT_SUBNET,
FABRIC_IF (one name for every node, or one per node), GPUS_PER_NODE,
UNIFIED_MEMORY_NODES, LAB_REGISTRY_PORT, LAB_IMAGES (which images to build).
Must run as root.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# The lab's modules live beside this file; it also runs loaded by path (the benchmark does).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpulab_lab.common import RUN, LabError, netns_path, node_dirs  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.config import LAB_IMAGES, LabConfig  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.images import ensure_base_image, ensure_image, image_is_current, prefetch_wheels, wait_for_pulls  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.lifecycle import check_build_prerequisites, current_config, down, status, up  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab import hub  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.models import model_folder, set_disk  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.network import present_sysfs, set_fabric_link, set_fabric_rate, set_input_policy  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.registry import start_registry  # noqa: E402  pylint: disable=wrong-import-position
from gpulab_lab.nodes import start_node_docker, stop_node_docker  # noqa: E402  pylint: disable=wrong-import-position

# What the benchmark and the tests use from the lab, by these names.
__all__ = ["main", "netns_path", "node_dirs"]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    try:
        verb = argv[0]
        if verb == "up":
            images = [k for k in os.environ.get("LAB_IMAGES", "ray vllm").split() if k]
            unknown = [k for k in images if k not in LAB_IMAGES]
            if unknown:
                raise LabError(f"LAB_IMAGES names unknown image(s) {unknown}; choose from {sorted(LAB_IMAGES)}")
            up(LabConfig.from_env(), images)
        elif verb == "down":
            down()
        elif verb == "status":
            print(json.dumps(status(), indent=2))
        elif verb == "images":
            cfg = current_config()
            ensure_base_image()
            for key in argv[1:] or list(LAB_IMAGES):
                ensure_image(cfg, key)
        elif verb == "build":
            unknown = [k.split("=")[0] for k in argv[1:] if k.split("=")[0] not in LAB_IMAGES]
            if unknown:
                raise LabError(f"unknown image(s) {unknown}; choose from {sorted(LAB_IMAGES)}")
            check_build_prerequisites()
            cfg = LabConfig.from_env()
            # The registry's copy says whether an image is up to date (lab-down stops it again).
            RUN.mkdir(parents=True, exist_ok=True)
            start_registry(cfg)
            keys = [k.split("=", 1)[0] for k in argv[1:]] or list(LAB_IMAGES)
            marks = dict(k.split("=", 1) for k in argv[1:] if "=" in k)
            # Every wheel set the build needs downloads at once, beside the base image and the first builds.
            prefetch_wheels([key for key in keys if not image_is_current(cfg, key)])
            ensure_base_image()
            # Each pushed as soon as it is built, while the next one builds: `up` then finds them in the registry.
            for key in keys:
                ensure_image(cfg, key)
                if key in marks:
                    Path(marks[key]).touch()
            wait_for_pulls()
        elif verb == "link" and len(argv) == 3 and argv[2] in ("up", "down"):
            set_fabric_link(current_config(), argv[1], argv[2])
        elif verb == "input" and len(argv) == 3 and argv[2] in ("drop", "accept"):
            set_input_policy(current_config(), argv[1], argv[2])
        elif verb == "rdma" and len(argv) == 3:
            present_sysfs(current_config(), argv[1], argv[2])
        elif verb == "hub" and len(argv) == 2 and argv[1] in ("up", "down"):
            if argv[1] == "up":
                cfg = current_config()
                print(json.dumps(hub.start(cfg, model_folder(cfg))))
            else:
                hub.stop()
        elif verb == "disk" and len(argv) == 3:
            set_disk(current_config(), argv[1], argv[2])
        elif verb == "rate" and len(argv) == 3:
            set_fabric_rate(current_config(), argv[1], argv[2])
        elif verb == "docker" and len(argv) == 3 and argv[2] in ("start", "stop"):
            cfg = current_config()
            if argv[1] not in cfg.node_names:
                raise LabError(f"no lab node named {argv[1]!r}; the lab has {cfg.node_names}")
            (start_node_docker if argv[2] == "start" else lambda c, n: stop_node_docker(n))(cfg, argv[1])
        else:
            print(__doc__)
            return 2
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
