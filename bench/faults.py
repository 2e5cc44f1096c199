# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fault matrix: each fault class our users lost hours to, seeded on the lab, and what the deploy says of it.

Each row seeds one fault on a lab where nothing runs (or, for the faults of a running server, on a cluster the
deploy just brought up), runs the deploy, and records how long the play took to stop, its last error line, whether
that line names the cause (the node and the component, by the row's patterns) and the fix, and which of the
collection's containers exist afterwards (none may exist past the stage that should have stopped the play).
The same rows run in CI as tests (the `test` of each row), with their messages asserted and no timing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import handflow  # noqa: E402

ROOT = benchlib.ROOT
LABCTL = ROOT / "lab" / "labctl.py"
ALL = ("gpulab-ray-head", "gpulab-ray-worker", "gpulab-vllm")
SERVER = ("gpulab-vllm",)
ERROR_LINE = re.compile(r"^\[ERROR\]: Task failed: (?:Module failed: |Action failed: )?(.*)$")
# A second token of the same length and alphabet as a real one, for the wrong-token row only.
WRONG_TOKEN = "gpulab-bench-wrong-token-0123456789abcdef"


def labctl(*args: str) -> None:
    subprocess.run([sys.executable, str(LABCTL), *args], check=True, capture_output=True, text=True, timeout=300)


def node(name: str) -> benchlib.Node:
    return {n.name: n for n in benchlib.lab_nodes(benchlib.read_inventory())}[name]


@dataclass
class Seeded:
    """What a seeded fault hands the deploy (extra variables, host variables) and how to take it away."""
    extra: dict = field(default_factory=dict)
    hostvars: dict = field(default_factory=dict)
    undo: Callable[[], None] = lambda: None
    # A fault that arms itself while the deploy runs (a watcher thread), stopped after it.
    during: threading.Thread | None = None
    stop: threading.Event | None = None
    # Seconds the seed waited, after the fault, for what the playbook reads: counted in the row's time.
    waited_s: float = 0.0


@dataclass
class Fault:
    key: str
    title: str
    # The stage that must stop the play, and where it sits in the deploy (for "before the model load").
    stage: str
    # Every pattern must match the last error line: the node, the component, the fix.
    expect: list[str]
    # Containers that must not exist when the play has stopped (nothing started past the failing stage).
    not_started: tuple[str, ...]
    # The test that asserts the same row in CI.
    test: str
    seed: Callable[[], Seeded]
    # A deploy that must succeed first (the faults of a running server, a model already on the nodes), not timed;
    # then the timed deploy starts from nothing running unless the fault lives in what runs.
    needs_serving: bool = False
    from_nothing: bool = True
    # Settings of that deploy (the supervisors on, for a fault that only they see while the cluster serves).
    serving_extra: dict = field(default_factory=dict)
    # What the row is allowed, as the issue sets it: 60 s, or the stall limit and its overhead.
    budget_s: float = 60.0
    # The deploy repairs this fault instead of failing: then the expectation is a line of the output, not an error.
    repaired: bool = False
    playbook: str = "deploy_qwen35.yml"
    # Lab images the row needs beyond the Ray and vLLM images (keys of `make lab-up LAB_IMAGES=...`).
    images: tuple[str, ...] = ()
    # The same fault under the hand flow (bench/handflow.py): how it changes the hand's containers, given what the
    # seed handed the deploy; None when the seed alone makes the fault. `hand_not`: why the row has no hand flow.
    hand_change: Callable | None = None
    hand_not: str = ""
    hand_serving_check: bool = False


# --------------------------------------------------------------------------- seeds

def seed_none() -> Seeded:
    return Seeded()


def seed_address_outside_subnet() -> Seeded:
    return Seeded(hostvars={"node2": {"fabric_address": "10.230.0.12"}})


def seed_cable_down() -> Seeded:
    labctl("link", "node2", "down")
    return Seeded(undo=lambda: labctl("link", "node2", "up"))


def _fabric_mtu(node_name: str, mtu: int) -> None:
    """The MTU of a node's fabric interface (the one holding its fabric address), set inside its namespace; the
    bridge's side stays at 1500."""
    lab = node(node_name)
    in_node = ["nsenter", "--net=%s" % lab.netns, "--"]
    found = subprocess.run(in_node + ["ip", "-o", "-4", "address", "show", "to", lab.fabric_ip + "/32"], check=True,
                           capture_output=True, text=True).stdout.split()
    subprocess.run(in_node + ["ip", "link", "set", "dev", found[1], "mtu", str(mtu)], check=True, capture_output=True)


def seed_mtu_mismatch() -> Seeded:
    """node2's fabric interface at 9000 beside node1's 1500, as after a NIC reset on one node."""
    _fabric_mtu("node2", 9000)
    return Seeded(undo=lambda: _fabric_mtu("node2", 1500))


def seed_ray_ports_dropped() -> Seeded:
    """Another tool's rule on node2 drops what the head sends to its raylet (Ray's node and object manager ports):
    node2's Ray container reaches the head's GCS, registers, and is then unreachable."""
    worker = node("node2")
    rule = ["-p", "tcp", "-m", "multiport", "--dports", "6381,6382", "-s", node("node1").fabric_ip, "-j", "DROP"]
    benchlib.in_netns(worker, ["iptables", "-w", "-t", "raw", "-I", "PREROUTING", *rule], check=True)
    return Seeded(undo=lambda: benchlib.in_netns(worker, ["iptables", "-w", "-t", "raw", "-D", "PREROUTING", *rule]))


def seed_ray_versions_differ() -> Seeded:
    """node2 on the seed's image (Ray 2.53), node1 on the Ray image (2.60). The seed's image is pulled onto node2 first,
    untimed, as every row's images are: the row times the diagnosis, not a first pull of 8 GB."""
    variables = benchlib.read_inventory()["all"]["vars"]
    benchlib.docker(node("node2"), "pull", "-q", variables["lab_vllm_seed_image"], timeout=1800)
    return Seeded(extra={"image_require_vllm": False, "gpulab_vllm_serve": False, "gate_expected_gpus": 2},
                  hostvars={"node1": {"image_ref": variables["lab_ray_image"]},
                            "node2": {"image_ref": variables["lab_vllm_seed_image"]}})


def seed_image_without_ray() -> Seeded:
    """The lab's base system image (Debian, no Python, no Ray), pushed to the lab registry as a serving image."""
    registry = benchlib.read_inventory()["all"]["vars"]["lab_registry"]
    local = "127.0.0.1:%s/gpulab/no-ray:bench" % registry.rsplit(":", 1)[1]
    subprocess.run(["docker", "tag", "gpulab-lab/bookworm:base", local], check=True, capture_output=True)
    pushed = subprocess.run(["docker", "push", local], check=True, capture_output=True, text=True).stdout
    digest = re.search(r"digest: (sha256:[0-9a-f]{64})", pushed).group(1)
    return Seeded(extra={"image_ref": "%s/gpulab/no-ray@%s" % (registry, digest)})


def seed_port_in_use() -> Seeded:
    code = ("import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            "s.bind(('0.0.0.0',6379));s.listen();time.sleep(3600)")
    holder = subprocess.Popen(["nsenter", "--net=%s" % node("node1").netns, "--", sys.executable, "-c", code])
    deadline = time.monotonic() + 5
    while ":6379 " not in benchlib.in_netns(node("node1"), ["ss", "-Htln"]).stdout:
        if time.monotonic() > deadline:
            holder.kill()
            raise RuntimeError("could not hold port 6379 on node1")
        time.sleep(0.1)
    return Seeded(undo=lambda: (holder.kill(), holder.wait()))


def seed_wrong_token() -> Seeded:
    """node2 given another token, in a secrets folder on its own disk (the lab's default folder is one for the whole
    machine, so one node's token could not differ from the others')."""
    return Seeded(hostvars={"node2": {"ray_cluster_auth_token": WRONG_TOKEN, "gpulab_secrets_dir": "/srv/gpulab-lab/secrets"}})


def seed_no_gpu_request() -> Seeded:
    return Seeded(extra={"vllm_server_device_requests": []})


def seed_throttled() -> Seeded:
    labctl("rate", "node2", "100mbit")
    return Seeded(undo=lambda: labctl("rate", "node2", "off"))


def seed_truncated_shard() -> Seeded:
    """node2's copy of the model from the deploy before, one shard cut short."""
    folder = ROOT / "build" / "lab" / "node-data" / "node2" / "models" / "tiny-llama"
    shard = sorted(folder.glob("*.safetensors"))[-1]
    with open(shard, "r+b") as handle:
        handle.truncate(1000)
    return Seeded()


def seed_dead_engine() -> Seeded:
    """The engine's process killed behind the live API process of the server the deploy before started. Over Ray the
    model's ranks are Ray actors in the Ray containers and no VLLM::Worker process runs in the server's container: its
    engine is VLLM::EngineCore, which drives them. A kill that finds nothing fails the row's seeding, not its verdict."""
    benchlib.docker(node("node1"), "exec", "gpulab-vllm", "pkill", "-KILL", "-f", "VLLM::EngineCore")
    return Seeded()


def seed_stalled_load() -> Seeded:
    """The server paused a few seconds into its start (it is loading): nothing new comes from it."""
    stop = threading.Event()

    def freeze() -> None:
        while not stop.is_set():
            state = benchlib.docker(node("node1"), "inspect", "-f", "{{.State.Running}}", "gpulab-vllm", check=False).stdout.strip()
            if state == "true":
                time.sleep(8)
                benchlib.docker(node("node1"), "pause", "gpulab-vllm", check=False)
                return
            time.sleep(0.5)

    watcher = threading.Thread(target=freeze, daemon=True)
    return Seeded(extra={"vllm_server_stall_timeout": 20, "gpulab_progress_interval": 5}, during=watcher, stop=stop,
                  undo=lambda: benchlib.docker(node("node1"), "unpause", "gpulab-vllm", check=False))


def seed_memory_under_floor() -> Seeded:
    """node2 read as a unified-memory node (node_unified_memory: the lab's nodes have no nvidia-smi to say so), its
    server's share small enough for the preflight's budget on this machine, and the memory guard's floors half a GiB
    under the machine's MemTotal (the lab's nodes share its kernel and its /proc/meminfo): once a rank of the model
    runs, MemAvailable is under both, as a load that outgrows a GB10 leaves it. The preflight still passes (a floor
    under MemTotal)."""
    total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
    floor = round(total_kib / 1024 / 1024 - 0.5, 1)
    return Seeded(extra={"vllm_server_memory_drop_gib": floor, "vllm_server_memory_stop_gib": floor,
                         "qwen35_gpu_memory_utilization": 0.05},
                  hostvars={"node2": {"node_unified_memory": "true"}})


def seed_fabric_link_down() -> Seeded:
    """node2's fabric cable pulled under a cluster that serves with the supervisors on: nothing fails in a play, so
    the diagnosis is status.yml's, from node2's supervisor's own read of its fabric. The seed waits (counted in the
    row's time) until node2's supervisor has written the change: the status run right after the pull could read its
    state a moment before its next look (every supervisor_interval, 5 s by default)."""
    started = time.monotonic()
    labctl("link", "node2", "down")
    state = ROOT / "build" / "lab" / "node-data" / "node2" / "supervisor" / "state.json"
    while time.monotonic() - started < 60:
        try:
            if not json.loads(state.read_text()).get("fabric", {"ok": True}).get("ok", True):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    return Seeded(undo=lambda: labctl("link", "node2", "up"), waited_s=round(time.monotonic() - started, 1))


# --------------------------------------------------------------------------- the rows

FAULTS = [
    Fault("address-outside-subnet", "fabric address outside the subnet", "preflight",
          [r"node2", r"10\.230\.0\.12", r"fabric_subnet|fabric_address"], ALL,
          "tests/integration/test_bad_inputs.py::test_bad_input_fails_before_any_change[fabric-address-outside-subnet]",
          seed_address_outside_subnet, hand_change=lambda specs, seeded: handflow.wrong_address(specs)),
    Fault("cable-down", "fabric cable down", "preflight",
          [r"node2: the fabric interface \S+ \(10\.220\.0\.12\) is down"], ALL,
          "tests/integration/test_bad_inputs.py::test_fabric_interface_down_fails_before_any_change", seed_cable_down),
    Fault("mtu-mismatch", "fabric interfaces that differ in MTU", "preflight",
          [r"the fabric interfaces differ in MTU \(node1 \S+ 1500, node2 \S+ 9000\)"], ALL,
          "tests/integration/test_bad_inputs.py::test_fabric_interfaces_that_differ_in_mtu_fail_before_any_change",
          seed_mtu_mismatch),
    Fault("worker-cannot-join", "a worker that reaches the head but cannot join Ray", "gate",
          [r"node2", r"10\.220\.0\.12|Ray ports", r"raylet|Ray ports"], SERVER,
          "tests/integration/test_faults.py::test_fault_is_named[worker-cannot-join]", seed_ray_ports_dropped),
    Fault("ray-versions-differ", "Ray versions that differ", "image",
          [r"Ray versions differ between nodes \(node1=[\d.]+, node2=[\d.]+\)", r"give every node the same image"], ALL,
          "tests/integration/test_bad_inputs.py::test_ray_versions_differ_fails_before_ray_starts", seed_ray_versions_differ,
          playbook="deploy.yml", images=("vllm-seed",), hand_change=lambda specs, seeded: handflow.worker_image(seeded.hostvars["node2"]["image_ref"])(specs)),
    Fault("image-without-ray", "an image without Ray", "image",
          [r"node1|node2", r"no-ray", r"python3", r"Python 3 with Ray", r"check image_ref"], ALL,
          "tests/integration/test_faults.py::test_fault_is_named[image-without-ray]", seed_image_without_ray,
          hand_change=lambda specs, seeded: handflow.image_without_ray(seeded.extra["image_ref"])(specs)),
    Fault("port-in-use", "a port in use", "preflight",
          [r"port\(s\) 6379 on node1 are already in use", r"choose other ports"], ALL,
          "tests/integration/test_bad_inputs.py::test_port_in_use_fails_before_any_change[6379-expected1]", seed_port_in_use),
    Fault("wrong-token", "a wrong Ray token on one worker", "gate",
          [r"node2", r"token"], SERVER,
          "tests/integration/test_faults.py::test_fault_is_named[wrong-token]", seed_wrong_token,
          hand_not="the hand flow runs Ray without a token"),
    Fault("no-gpu-request", "a server container started without a GPU request", "server",
          [r"gpulab-vllm exited with code", r"Failed to infer device type"], (),
          "tests/integration/test_gpu_contract.py::test_a_server_without_the_gpu_request_fails_as_on_a_real_host",
          seed_no_gpu_request, hand_change=lambda specs, seeded: handflow.no_gpu_request(specs)),
    Fault("collective-floor", "the collective below its bandwidth floor", "collective",
          [r"node2 \(10\.220\.0\.12\): its link to the head carried [\d.]+ Gbit/s; floor [\d.]+ Gbit/s"], SERVER,
          "tests/integration/test_fabric_lab.py::test_a_throttled_node_is_named_before_the_load", seed_throttled),
    Fault("truncated-shard", "a truncated model shard on one node", "weights",
          [r"node2: [^;]*?\.safetensors: truncated \(expected \d+ bytes, found 1000 bytes\)"], (),
          "tests/integration/test_weights.py::test_a_truncated_shard_is_named_and_repaired_from_a_verified_copy",
          seed_truncated_shard, needs_serving=True, repaired=True),
    # vLLM shuts its API server down seconds after its engine died: the deploy's re-run finds the server stopped, starts
    # it again and proves a completion. The probe's own verdict on the live API is asserted by the module's lab test.
    Fault("dead-engine", "a dead engine behind a live API process", "server",
          [r"gpulab-vllm started or restarted"], (),
          "tests/integration/test_serving_chain.py::test_a_dead_engine_is_named_and_the_server_started_again",
          seed_dead_engine, needs_serving=True, from_nothing=False, repaired=True, hand_serving_check=True),
    Fault("stalled-load", "a model load that stalls", "server",
          [r"vLLM's start stalled at stage [^:]+: nothing new from the server for \d+ s \(stall_timeout\)"], (),
          "tests/integration/test_load_progress.py::test_a_frozen_start_is_named_within_the_stall_limit",
          seed_stalled_load, budget_s=20 + 60),
    # A deploy from nothing to the load (about 45 s on the lab), then the guard's drop and stop and the server's exit.
    Fault("memory-under-floor", "a load that outgrows a unified-memory node", "server",
          [r"node2: the memory guard stopped the load at [\d.]+ GiB available \(MemAvailable\), under its floor of "
           r"[\d.]+ GiB \(vllm_server_memory_stop_gib\)", r"lower vllm_server_gpu_memory_utilization"], (),
          "tests/integration/test_faults.py::test_fault_is_named[memory-under-floor]", seed_memory_under_floor,
          budget_s=120.0,
          hand_not="by hand nothing watches a node's memory while the model loads: the kernel's OOM killer ends the "
                   "load, or a reboot does"),
    # While it serves: the supervisors' watch, read by the status playbook.
    Fault("fabric-link-down", "a fabric link down while the cluster serves", "serving",
          [r"node2: its fabric changed under the deployment \(since [0-9T:Z-]+\): \S+ link down \(operstate down, no carrier\)"],
          (), "tests/integration/test_serving_chain.py::test_the_supervisors_bring_the_cluster_back_without_a_play",
          seed_fabric_link_down, needs_serving=True, from_nothing=False, serving_extra={"supervisor_enabled": True},
          playbook="status.yml",
          hand_not="by hand nothing watches the fabric while it serves: the engine hangs on a collective or dies "
                   "with a Ray error that names no cable"),
]
BY_KEY = {fault.key: fault for fault in FAULTS}
# Where each stage sits: a fault named at a stage before "server" was named before any model load; "serving" is the
# supervisors' watch over a cluster that serves.
STAGES = ["preflight", "image", "weights", "ray", "gate", "collective", "server", "serving"]


def error_lines(output: str) -> list[str]:
    return [m.group(1).strip() for m in (ERROR_LINE.match(line) for line in output.splitlines()) if m]


def judge(fault: Fault, output: str, containers: list[str]) -> dict:
    """What a run said of its fault: the last error line, whether it names the cause and the fix (every pattern),
    and which containers exist past the stage that should have stopped it."""
    errors = error_lines(output)
    said = errors[-1] if errors else ""
    named_at = None
    if fault.repaired:
        # The line that names it is a task's message, which the output wraps: read it whole. When it came is the
        # play's own clock (profile_tasks) on the task that printed it.
        flat = " ".join(output.split())
        found = re.search(fault.expect[0], flat)
        named = bool(found) and all(re.search(pattern, flat) for pattern in fault.expect)
        if found:
            said = found.group(0)
            clocks = re.findall(r"\)\s+(\d+):(\d\d):(\d\d(?:\.\d+)?) \*", flat[:found.start()])
            if clocks:
                hours, minutes, seconds = clocks[-1]
                named_at = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    else:
        named = bool(said) and all(re.search(pattern, said) for pattern in fault.expect)
    past = sorted(name for name in containers if name in fault.not_started)
    return {"said": said, "named": named, "named_at": named_at, "started_past_stage": past, "errors": len(errors)}


def inventory_with(hostvars: dict, target: Path) -> Path:
    """A copy of the lab's inventory with these host variables added (the same group_vars), as a folder."""
    import yaml  # noqa: PLC0415  (the project's virtual environment)

    hosts = benchlib.read_inventory()
    for group in hosts["all"]["children"].values():
        for name, values in (group.get("hosts") or {}).items():
            values.update(hostvars.get(name, {}))
    target.mkdir(parents=True, exist_ok=True)
    (target / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (target / "hosts.yml").chmod(0o600)
    group_vars = target / "group_vars"
    if not group_vars.exists():
        group_vars.symlink_to(ROOT / "inventories" / "local_lab" / "group_vars")
    return target


def containers_now() -> list[str]:
    names = []
    for lab_node in benchlib.lab_nodes(benchlib.read_inventory()):
        names += benchlib.docker(lab_node, "ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    return names


def summary_row(fault: Fault, runs: list[dict]) -> dict:
    """One row of the matrix from its runs: median seconds to the stop, named in every run, nothing past the stage."""
    # A fault the deploy repairs is diagnosed when its line is printed, not when the whole deploy ends.
    seconds = sorted(run["named_at"] if run.get("named_at") is not None else run["seconds"] for run in runs)
    return {"key": fault.key, "title": fault.title, "stage": fault.stage, "runs": len(runs),
            "seconds": benchlib.summary(seconds) if seconds else None,
            "named": all(run["named"] for run in runs) if runs else False,
            "within_budget": all(value <= fault.budget_s for value in seconds) if runs else False,
            "before_load": STAGES.index(fault.stage) < STAGES.index("server"),
            "nothing_past_stage": all(not run["started_past_stage"] for run in runs) if runs else False,
            "said": runs[-1]["said"] if runs else "", "test": fault.test, "budget_s": fault.budget_s}


def summary_hand(fault: Fault, hands: list[dict]) -> dict:
    """The hand flow's side of a row: whether it stopped at all within the budget, after how long, and what it said."""
    if fault.hand_not:
        return {"ran": False, "why_not": fault.hand_not}
    if not hands:
        return {"ran": False, "why_not": "not run"}
    failed = [hand for hand in hands if hand["failed"]]
    seconds = [hand["seconds"] for hand in (failed or hands) if hand["seconds"] is not None]
    return {"ran": True, "failed": len(failed) == len(hands), "seconds": benchlib.summary(seconds),
            "said": (failed or hands)[-1]["said"], "runs": len(hands)}


if __name__ == "__main__":
    print(json.dumps([{"key": f.key, "title": f.title, "stage": f.stage, "test": f.test} for f in FAULTS], indent=1))
