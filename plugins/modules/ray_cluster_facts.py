#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ray_cluster_facts
short_description: Read the nodes, GPUs and failures of a Ray cluster, and optionally wait until it is complete
version_added: 0.1.0
description:
  - Reads the node table of a Ray cluster from its GCS (Global Control Store) and the autoscaler's last report,
    and returns them as the C(ray_cluster) fact.
  - Runs on the host of the Ray head. With O(container), the read runs inside that container with
    C(docker exec <container> python3 -c <reader>), so the container's Ray and its environment (for example
    C(RAY_AUTH_MODE) and C(RAY_AUTH_TOKEN_PATH) for token authentication) are used. Without O(container),
    the reader runs with the Python interpreter of the module, which must be able to import C(ray).
  - The reader asks the GCS over gRPC with Ray's own protocol definitions and does not import the C(ray)
    package itself, which keeps one read at a fraction of a second, several times faster than C(ray status).
  - With O(wait=true) it is the gate of a deployment. It polls until every node of O(expected_node_ips) is
    alive (or at least O(expected_nodes) nodes are alive), no node is pending, no address is listed twice
    among the alive nodes (an old Ray node not yet declared dead), none of O(absent_node_ips) is alive, and the
    cluster has at least O(expected_gpus) GPUs. A head container that is not running yet or a GCS that does not answer yet is
    polled again until O(wait_timeout). On timeout the module fails with one message naming the missing
    node addresses, the nodes that are alive and the GPU shortfall, and still returns the facts.
  - While waiting, the reader keeps its process and its connection to the GCS and reads again every
    O(wait_sleep) seconds inside the container, so the gate passes within about O(wait_sleep) of the last
    node's registration rather than after another C(docker exec) and Python start.
  - Pending nodes are the nodes the Ray autoscaler reports as pending or launching. A cluster made with
    C(ray start) on each host has no autoscaler launches, so RV(ansible_facts.ray_cluster.pending_nodes) is 0 there;
    a node that has not registered with the GCS yet appears in RV(ansible_facts.ray_cluster.missing_node_ips) instead.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  container:
    description:
      - Name or ID of the container that runs the Ray head on this host.
      - When not given, the reader runs with the module's own Python interpreter, outside any container.
    type: str
  gcs_address:
    description:
      - Address C(host:port) of the GCS.
      - V(auto) uses the address the Ray head recorded for itself (C(RAY_ADDRESS), else
        C($RAY_TMPDIR/ray_current_cluster), by default C(/tmp/ray/ray_current_cluster)) where the reader runs.
    type: str
    default: auto
  docker_cli:
    description:
      - Name or path of the Docker command line client used for C(docker exec).
    type: str
    default: docker
  expected_node_ips:
    description:
      - Addresses under which the nodes register with Ray (their C(--node-ip-address)).
      - Used to report RV(ansible_facts.ray_cluster.missing_node_ips) and RV(ansible_facts.ray_cluster.unexpected_node_ips), and by O(wait).
    type: list
    elements: str
    default: []
  expected_nodes:
    description:
      - Number of nodes that must be alive for O(wait) to succeed.
    type: int
  expected_gpus:
    description:
      - Number of GPUs, summed over alive nodes, that O(wait) requires.
    type: float
  absent_node_ips:
    description:
      - Addresses that no alive node may have for O(wait) to succeed.
      - For a worker whose Ray container stopped and is about to start again, while the GCS may still list its old
        Ray node as alive (its health checks take about 15 seconds to declare a node dead). A new Ray node that
        registers at the same address before then can be left without its GPUs in the GCS's view, so that no
        placement group that needs them is ever placed.
    type: list
    elements: str
    default: []
  raylet_grace:
    description:
      - With O(wait), each read also opens a TCP connection from the reader's host (the head's) to every alive
        node's raylet, as the GCS and the head's own tasks must. An alive node whose raylet refuses is one Ray is
        about to declare dead, and the wait goes on. One whose raylet stays silent otherwise (timed out, unreachable)
        for this many seconds, as behind a firewall that drops the head's packets to Ray's ports, ends the wait at
        once with a failure naming it (it registered, but nothing can be scheduled on it).
      - V(0) leaves the raylets untried.
    type: float
    default: 0
  node_names:
    description:
      - A name for each node's address (for example the inventory's host names), used in the message a failed
        O(wait) ends with.
    type: dict
    default: {}
  wait_timeout:
    default: 300
  wait_sleep:
    default: 0.5
extends_documentation_fragment:
  - gpulab.vllm.wait
  - gpulab.vllm.attributes
  - gpulab.vllm.attributes.facts
attributes:
  check_mode:
    support: full
    details: The module only reads; it behaves the same in check mode.
  diff_mode:
    support: none
  facts:
    support: full
notes:
  - With O(wait=true) it waits until the cluster meets O(expected_node_ips), O(expected_nodes) and O(expected_gpus)
    and no node is pending. Count the start of the head and of every worker in O(wait_timeout), pulling their image
    included. A poll is one gRPC call from a reader that keeps running, so sub-second O(wait_sleep) is cheap.
  - The container needs C(python3) with Ray 2.x on its C(PATH), as the Ray images of this collection have.
  - Token authentication is read from the reader's environment in Ray's own order, C(RAY_AUTH_TOKEN), then
    C(RAY_AUTH_TOKEN_PATH), then C(~/.ray/auth_token) when C(RAY_AUTH_MODE=token).
seealso:
  - module: gpulab.vllm.vllm_health
"""

EXAMPLES = r"""
- name: Read the Ray cluster from the head container
  gpulab.vllm.ray_cluster_facts:
    container: gpulab-ray-head

- name: Gate - wait until both nodes and their GPUs are in the cluster
  gpulab.vllm.ray_cluster_facts:
    container: gpulab-ray-head
    expected_node_ips:
      - 10.220.0.11
      - 10.220.0.12
    expected_gpus: 2
    wait: true
    wait_timeout: 120

- name: Show what the gate saw
  ansible.builtin.debug:
    msg: "{{ ray_cluster.alive_nodes }} nodes alive, {{ ray_cluster.gpus }} GPUs, missing {{ ray_cluster.missing_node_ips }}"

- name: Read a cluster from a host where Ray is importable
  gpulab.vllm.ray_cluster_facts:
    gcs_address: 10.220.0.11:6379
    expected_nodes: 2
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host's variables.
  returned: always
  type: dict
  contains:
    ray_cluster:
      description: State of the Ray cluster.
      returned: always
      type: dict
      contains:
        ray_version:
          description: Version of Ray where the reader ran; null if the cluster could not be read.
          type: str
          returned: always
          sample: 2.60.0
        gcs_address:
          description: GCS address that was read (as discovered when O(gcs_address=auto)).
          type: str
          returned: always
          sample: 10.220.0.11:6379
        alive_nodes:
          description: Number of nodes the GCS reports alive.
          type: int
          returned: always
          sample: 2
        dead_nodes:
          description: Number of nodes the GCS still remembers as dead.
          type: int
          returned: always
          sample: 0
        pending_nodes:
          description: Nodes the Ray autoscaler reports as pending or launching; 0 without an autoscaler.
          type: int
          returned: always
          sample: 0
        nodes:
          description: Every node the GCS knows, alive ones first, head first, then by address.
          type: list
          elements: dict
          returned: always
          contains:
            node_id:
              description: Ray node ID (hex).
              type: str
            node_ip:
              description: Address the node registered with.
              type: str
            alive:
              description: Whether the node is alive.
              type: bool
            is_head:
              description: Whether the node is the head.
              type: bool
            state:
              description: GCS node state, V(ALIVE) or V(DEAD).
              type: str
            resources:
              description: Total resources of the node (C(CPU), C(GPU), C(memory), C(object_store_memory) and custom ones).
              type: dict
            raylet_error:
              description:
                - With O(raylet_grace), what a TCP connection from the head to the node's raylet met (for example
                  V(timed out)); null when it answered or was not tried.
              type: str
            raylet_address:
              description: The node's raylet, C(host:port), as the GCS lists it.
              type: str
          sample:
            - node_id: 9d5b4a67115f1fcd08c752536243db0308e91a4293dc686f85049aa1
              node_ip: 10.220.0.11
              alive: true
              is_head: true
              state: ALIVE
              resources: {CPU: 2.0, GPU: 1.0, memory: 17511091405.0, object_store_memory: 7504753459.0}
        total_resources:
          description: Resources summed over alive nodes.
          type: dict
          returned: always
          sample: {CPU: 4.0, GPU: 2.0, memory: 35157497447.0, object_store_memory: 15067498905.0}
        gpus:
          description: GPUs summed over alive nodes.
          type: float
          returned: always
          sample: 2.0
        missing_node_ips:
          description: Addresses of O(expected_node_ips) with no alive node.
          type: list
          elements: str
          returned: always
          sample: [10.220.0.12]
        unexpected_node_ips:
          description: Addresses of alive nodes that are not in O(expected_node_ips); empty when that is not given.
          type: list
          elements: str
          returned: always
          sample: []
        failures:
          description:
            - Failures Ray records, dead nodes (from the GCS, with Ray's reason) and failed launches (from the autoscaler).
          type: list
          elements: dict
          returned: always
          contains:
            source:
              description: V(gcs) for a dead node, V(autoscaler) for a failed launch.
              type: str
            node_id:
              description: Ray node ID of the dead node; null for a failed launch.
              type: str
            node_ip:
              description: Address of the node.
              type: str
            reason:
              description: Ray's reason, for example V(UNEXPECTED_TERMINATION).
              type: str
            message:
              description: Ray's own explanation.
              type: str
          sample:
            - source: gcs
              node_id: 641d0b262a9d089d06e48a738fc77f270f4a2e559a8177fefcf5f540
              node_ip: 10.220.0.13
              reason: UNEXPECTED_TERMINATION
              message: health check failed due to missing too many heartbeats
        unreachable_raylets:
          description: With O(raylet_grace), the alive nodes whose raylet did not answer the head's last try.
          type: list
          elements: dict
          returned: always
          contains:
            node_id:
              description: Ray node ID (hex).
              type: str
            node_ip:
              description: Address of the node.
              type: str
            address:
              description: The raylet's C(host:port).
              type: str
            error:
              description: What the connection met, for example V(timed out) or V(Connection refused).
              type: str
            silent_s:
              description: Seconds it has been silent (not counted for a refusal).
              type: float
            silent_since:
              description: Since when it has been silent, in seconds since the epoch on the head's clock.
              type: float
            blocked:
              description: Whether it stayed silent for O(raylet_grace) seconds, which ended the wait.
              type: bool
          sample: []
        wait:
          description: What reading cost.
          type: dict
          returned: always
          contains:
            waited:
              description: Whether O(wait) was requested.
              type: bool
            elapsed:
              description: Seconds spent reading (and waiting).
              type: float
            polls:
              description: Number of reads.
              type: int
          sample: {waited: true, elapsed: 3.412, polls: 7}
"""

import socket
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpulab.vllm.plugins.module_utils import _ray_state
from ansible_collections.gpulab.vllm.plugins.module_utils._wait import poll_until, validate_wait_options

# Upper bound for one gRPC call; a wait shortens it to the time left.
RPC_TIMEOUT = 5.0


class RayClusterReader(object):
    """Reads the cluster once per call, through docker exec or the local interpreter."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.host = socket.gethostname()
        if self.params["container"]:
            self.where = "container %s on host %s" % (self.params["container"], self.host)
            self.docker = self._docker_path()
        else:
            self.where = "host %s" % self.host
            self.docker = None
        self.reads = 0
        # node ID -> since when (epoch) its raylet has been silent to the head, carried from read to read and slice to slice.
        self.silent = dict((self.params["wait_resume"] or {}).get("silent") or {})

    def _docker_path(self):
        path = self.module.get_bin_path(self.params["docker_cli"])
        if not path:
            self.module.fail_json(msg="Docker CLI %r not found on host %s: it is needed to read Ray in container %s"
                                      % (self.params["docker_cli"], self.host, self.params["container"]))
        return path

    def read(self, remaining):
        """Return (snapshot, None) or (None, ReaderError).

        While waiting, one reader run keeps reading in the container until the cluster looks ready or
        the time is nearly up (its own polls every wait_sleep seconds), so a poll costs one gRPC call,
        not a docker exec and a Python start; this loop only judges what it returns.
        """
        rpc_timeout = RPC_TIMEOUT if remaining is None else max(min(RPC_TIMEOUT, remaining), 0.2)
        until = None
        if remaining is not None:
            until = dict(ips=self.params["expected_node_ips"], nodes=self.params["expected_nodes"] or 0,
                         gpus=self.params["expected_gpus"] or 0, absent=self.params["absent_node_ips"],
                         raylet_grace=self.params["raylet_grace"], silent=self.silent,
                         interval=self.params["wait_sleep"],
                         # Leave time to report before the deadline.
                         **{"for": max(remaining - 2 * rpc_timeout, 0)})
        argv = _ray_state.reader_argv(
            "python3" if self.docker else sys.executable,
            self.params["gcs_address"], rpc_timeout, docker_cli=self.docker, container=self.params["container"], until=until)
        rc, out, err = self.module.run_command(argv, environ_update={"LC_ALL": "C"})
        try:
            snapshot = _ray_state.interpret_reader_run(rc, out, err, self.where)
        except _ray_state.ReaderError as exc:
            self.reads += 1
            return None, exc
        self.reads += snapshot.get("polls") or 1
        self.silent = dict((node["node_id"], node["raylet_silent_since"]) for node in snapshot.get("nodes") or []
                           if node.get("raylet_silent_since") is not None)
        return snapshot, None


def main():
    argument_spec = dict(
        container=dict(type="str"),
        gcs_address=dict(type="str", default="auto"),
        docker_cli=dict(type="str", default="docker"),
        expected_node_ips=dict(type="list", elements="str", default=[]),
        expected_nodes=dict(type="int"),
        expected_gpus=dict(type="float"),
        absent_node_ips=dict(type="list", elements="str", default=[]),
        raylet_grace=dict(type="float", default=0),
        node_names=dict(type="dict", default={}),
        wait=dict(type="bool", default=False),
        wait_timeout=dict(type="int", default=300),
        wait_sleep=dict(type="float", default=0.5),
        progress_interval=dict(type="float", default=30),
        wait_resume=dict(type="dict"),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params
    problem = validate_wait_options(params["wait_timeout"], params["wait_sleep"])
    if problem:
        module.fail_json(msg=problem)

    reader = RayClusterReader(module)
    expectations = dict(
        expected_node_ips=params["expected_node_ips"],
        expected_nodes=params["expected_nodes"],
        expected_gpus=params["expected_gpus"],
        absent_node_ips=params["absent_node_ips"],
    )

    def is_ready(result):
        snapshot, error = result
        if error is not None:
            # A permanent error (no ray, bad token) will not heal by waiting.
            return not error.transient
        facts = _ray_state.build_facts(snapshot, params["expected_node_ips"])
        return not _ray_state.unmet_conditions(facts, **expectations)

    def is_hopeless(result):
        # A raylet the head cannot reach for raylet_grace seconds: the node will not serve, however long the wait.
        return result[0] is not None and bool(result[0].get("blocked"))

    outcome = poll_until(reader.read, is_ready, params["wait"], params["wait_timeout"], params["wait_sleep"],
                         is_hopeless=is_hopeless, resume=params["wait_resume"])
    snapshot, error = outcome.value
    wait_info = dict(waited=outcome.waited, elapsed=outcome.elapsed, polls=max(reader.reads, outcome.polls))

    if error is not None:
        facts = _ray_state.empty_facts(
            None if params["gcs_address"] == "auto" else params["gcs_address"], params["expected_node_ips"],
            **wait_info)
        if params["wait"] and error.transient:
            msg = _ray_state.not_ready_message(
                facts, _ray_state.unmet_conditions(facts, **expectations), reader.where, last_error=error.message)
        else:
            msg = "Cannot read the Ray cluster (%s): %s" % (error.kind, error.message)
        module.fail_json(msg=msg, ansible_facts=dict(ray_cluster=facts))

    facts = _ray_state.build_facts(snapshot, params["expected_node_ips"], **wait_info)
    if params["wait"] and not outcome.ready and snapshot.get("blocked"):
        module.fail_json(msg=_ray_state.blocked_message(facts, reader.where, params["node_names"]), ansible_facts=dict(ray_cluster=facts))
    if params["wait"] and not outcome.ready:
        unmet = _ray_state.unmet_conditions(facts, **expectations)
        module.fail_json(msg=_ray_state.not_ready_message(facts, unmet, reader.where),
                         ansible_facts=dict(ray_cluster=facts))
    module.exit_json(changed=False, ansible_facts=dict(ray_cluster=facts))


if __name__ == "__main__":
    main()
