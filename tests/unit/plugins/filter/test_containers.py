"""The stamp of a container's settings, and the node read's answer to whether a running container carries it."""

from __future__ import annotations

import copy

import pytest

from conftest import load_fixture
from ansible_collections.gpulab.vllm.plugins.filter.containers import STAMP_LABEL, container_carries, container_stamp
from ansible_collections.gpulab.vllm.plugins.module_utils import _node


def recorded_settings(container: str) -> dict:
    """The settings of a container the roles started on the lab, in the shape the roles stamp, read back from its
    recorded `docker inspect` (node1_stamped)."""
    body = load_fixture("node", "node1_stamped")["docker"]["inspect"][container]["body"]
    config, host = body["Config"], body["HostConfig"]
    return {
        "name": container, "image": config["Image"], "entrypoint": config["Entrypoint"], "command": config["Cmd"],
        "network_mode": host["NetworkMode"], "ipc_mode": host["IpcMode"], "shm_size": host["ShmSize"],
        "ulimits": ["%s:%s:%s" % (u["Name"], u["Soft"], u["Hard"]) for u in host.get("Ulimits") or []],
        "devices": host.get("Devices") or [], "device_requests": host.get("DeviceRequests") or [],
        "volumes": host["Binds"], "env": dict(item.split("=", 1) for item in config["Env"]),
        "restart_policy": host["RestartPolicy"]["Name"],
    }


HEAD_SETTINGS = recorded_settings("gpulab-ray-head")


def test_the_same_settings_give_the_same_stamp_in_any_key_order():
    reordered = dict(reversed(list(HEAD_SETTINGS.items())))
    reordered["env"] = dict(reversed(list(HEAD_SETTINGS["env"].items())))
    assert container_stamp(reordered) == container_stamp(copy.deepcopy(HEAD_SETTINGS))
    assert container_stamp(HEAD_SETTINGS).startswith("sha256:") and len(container_stamp(HEAD_SETTINGS)) == 7 + 64


@pytest.mark.parametrize("change", [
    lambda s: s["env"].update(NCCL_SOCKET_IFNAME="eth0"),
    lambda s: s["env"].pop(sorted(s["env"])[0]),
    lambda s: s["env"].update(NCCL_IB_HCA="mlx5_0"),
    lambda s: s["command"].append("--num-cpus=2"),
    lambda s: s["command"].reverse(),
    lambda s: s.update(image=s["image"] + "0"),
    lambda s: s["device_requests"].clear(),
    lambda s: s["ulimits"].pop(),
    lambda s: s["volumes"].append("/srv/models:/srv/models"),
    lambda s: s.update(shm_size=s["shm_size"] * 2),
])
def test_any_change_gives_another_stamp(change):
    changed = copy.deepcopy(HEAD_SETTINGS)
    change(changed)
    assert container_stamp(changed) != container_stamp(HEAD_SETTINGS)


def recorded_containers(name):
    record = load_fixture("node", name)
    return {c: _node.summarize_inspect(doc["body"], record["label"]) if doc["status"] == 200 else _node.absent_container()
            for c, doc in record["docker"]["inspect"].items()}


@pytest.mark.parametrize("container", ["gpulab-ray-head", "gpulab-vllm"])
def test_a_deployed_container_carries_its_stamp(container):
    read = recorded_containers("node1_stamped")[container]
    stamp = read["labels"][STAMP_LABEL]
    assert read["running"] and stamp.startswith("sha256:")
    assert container_carries(read, stamp, read["image_id"])
    # Other settings, another image, or a container that does not run: Docker must be asked.
    assert not container_carries(read, container_stamp(HEAD_SETTINGS), read["image_id"])
    assert not container_carries(read, stamp, "sha256:" + "0" * 64)
    assert not container_carries(read, stamp, "")
    stopped = dict(read, running=False, status="exited")
    assert not container_carries(stopped, stamp, read["image_id"])


def test_containers_without_a_stamp_are_asked_about():
    # Made before the stamp existed (node1_deployed), or not there at all.
    before = recorded_containers("node1_deployed")
    for container in ("gpulab-ray-head", "gpulab-vllm"):
        read = before[container]
        assert read["running"] and STAMP_LABEL not in read["labels"]
        assert not container_carries(read, container_stamp(HEAD_SETTINGS), read["image_id"])
    assert not container_carries(recorded_containers("node2_deployed")["gpulab-ray-head"], "sha256:x", "sha256:x")
    assert not container_carries(None, "sha256:x", "sha256:x")
