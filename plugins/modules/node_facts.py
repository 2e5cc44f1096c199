#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Read what the deployment needs to know about a node, in one round trip
version_added: 0.2.0
description:
  - Reads, on the node where it runs, everything the roles of this collection decide on before they change
    anything; one module run instead of one per question, which is most of the time a re-run on a healthy
    cluster takes.
  - Whether the images of O(images) are on the node, and for which platform each was built.
  - The platform the node's Docker daemon pulls for (its own OS and architecture).
  - With O(ask_registry), the platforms the registry has for an image (through the node's Docker daemon, with the
    credentials the node's docker client would send), before anything is pulled.
  - The collection's containers (those that carry the O(label)) and any container named in O(containers),
    from the Docker Engine API on O(docker_host); whether each exists and runs, its image ID and labels.
  - The network interfaces with their IPv4 addresses and link state (from C(ip -j address show)), in the shape of
    Ansible's gathered network facts, so that a role needs no fact gathering.
  - The TCP ports that listen on the node (from C(/proc/net/tcp) and C(/proc/net/tcp6) of the node's network
    namespace).
  - Whether each of O(paths) exists and the matches of each of O(globs).
  - The RDMA devices with their ports (state, link layer, rate, GIDs and the interface of each), and the network
    interfaces that sit on an RDMA device, from the node's sysfs (O(sysfs)); the fabric role maps the fabric
    interface to its own HCA ports with them.
  - The rules of each of O(iptables_chains) as C(iptables -S) prints them, so that a role can tell whether its
    rules are already in place without changing anything.
  - Owner, group, mode and whether the content matches a given SHA-1 for each of O(files); the checksum is an
    input, never an output, so that a secret file can be checked without its checksum appearing anywhere.
  - The node's memory from O(meminfo) (total, free, available, page cache) and the GPUs C(nvidia-smi) lists, with
    whether their memory is the host's (unified, as on a DGX Spark's GB10, whose driver reports no memory of the GPU's
    own); the memory rules of the deploy decide on it.
  - Reads only; it never changes the node.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  docker_host:
    description:
      - The Docker daemon to ask, V(unix:///path/to/socket) or V(tcp://host:port) (plain HTTP).
    type: str
    default: unix:///var/run/docker.sock
  label:
    description:
      - Every container that carries this label is read, whatever its name.
    type: str
    default: org.gpulab.vllm.role
  containers:
    description:
      - Further container names to read; a name that no container has is reported in RV(ansible_facts.gpulab_node.containers)
        with C(exists=false).
    type: list
    elements: str
    default: []
  images:
    description:
      - Image references (C(name:tag) or C(name@sha256:...)) whose presence on the node to report, with their
        image ID and platform; nothing is pulled.
      - A reference the daemon refuses (not a reference at all) is reported absent, with the daemon's words.
    type: list
    elements: str
    default: []
  ask_registry:
    description:
      - When to ask the registry for the platforms of an image of O(images), through the node's Docker daemon
        (C(GET /distribution/REF/json)), so that the daemon's own registry settings apply (mirrors, insecure
        registries, certificates).
      - The credentials are those the node's docker client would send (C($DOCKER_CONFIG/config.json) or
        C(~/.docker/config.json) of the user the module runs as, its credential helpers included); the daemon keeps
        none of its own. They are never returned.
      - V(never) asks nothing. V(absent) asks for an image the node lacks. V(always) also asks for an image the node
        has by tag, since a pull fetches whatever the tag names now; an image the node has by digest is never asked
        for again.
      - A registry that cannot answer does not fail the module; its words are in RV(ansible_facts.gpulab_node.images).
    type: str
    choices: [never, absent, always]
    default: never
  paths:
    description:
      - Paths whose existence to report, for example device nodes.
    type: list
    elements: path
    default: [/dev/nvidia0, /dev/infiniband]
  globs:
    description:
      - Shell patterns whose matches to report, for example the GPU device nodes.
    type: list
    elements: str
    default: ['/dev/nvidia[0-9]*']
  sysfs:
    description:
      - Where the node's sysfs is mounted; the RDMA devices are read from C(class/infiniband) and C(class/net) below it.
    type: path
    default: /sys
  iptables_chains:
    description:
      - Chains of the C(filter) table to list. A chain that does not exist is reported as V(null).
    type: list
    elements: str
    default: []
  ip6tables_chains:
    description:
      - Chains of the IPv6 C(filter) table to list, as for O(iptables_chains). Without ip6tables, or on a kernel without
        IPv6 filtering, the result is V(null) instead of a failure.
    type: list
    elements: str
    default: []
  files:
    description:
      - Files (or folders) to describe.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file or folder.
        type: path
        required: true
      sha1:
        description:
          - The SHA-1 the file's content should have; the C(matches) field of the file in RV(ansible_facts.gpulab_node.files)
            tells whether it has. Never logged.
        type: str
      digest:
        description:
          - Return the file's SHA-1 as C(sha1) (null for a folder or a file that is absent), so that a role can tell
            whether the file already holds what it would write. Only for files that hold no secret.
        type: bool
        default: false
  meminfo:
    description:
      - The kernel's memory report to read.
    type: path
    default: /proc/meminfo
  unified_memory:
    description:
      - Whether the node's GPU memory is the host's. V(auto) decides from C(nvidia-smi --query-gpu=name,memory.total)
        (a GPU without memory of its own to report, C([N/A]), as GB10's); V(true) or V(false) says so for a node whose
        driver reads otherwise.
    type: str
    choices: [auto, 'true', 'false']
    default: auto
  stopped_log_lines:
    description:
      - For each container read that exists and is not running, read the last this many lines of its log and report
        the line that most likely names why it ended (C(last_error)). V(0) reads no log.
    type: int
    default: 0
  timeout:
    description:
      - Seconds to wait for the Docker daemon (for each request, the registry's answer through it included) and for
        C(iptables).
    type: float
    default: 10
extends_documentation_fragment:
  - gpulab.vllm.attributes
  - gpulab.vllm.attributes.facts
attributes:
  check_mode:
    support: full
    details: The module never changes anything; it behaves the same in check mode.
  diff_mode:
    support: none
  facts:
    support: full
"""

EXAMPLES = r"""
- name: Read the node once, before any role decides anything
  gpulab.vllm.node_facts:
    iptables_chains: [INPUT, GPULAB-INPUT]
    ip6tables_chains: [INPUT, GPULAB-INPUT]
    files:
      - path: /etc/gpulab-ray/ray_token
        sha1: "{{ ray_cluster_auth_token | hash('sha1') }}"

- name: Skip the port check when the Ray head already runs
  ansible.builtin.assert:
    that: 6379 not in gpulab_node.listening_tcp_ports
  when: not (gpulab_node.containers['gpulab-ray-head'].running | default(false))
"""

RETURN = r"""
ansible_facts:
  description: The node as read.
  returned: always
  type: complex
  contains:
    gpulab_node:
      description: What was read.
      type: complex
      contains:
        containers:
          description:
            - By container name; C(exists), C(running), C(status) (Docker's state), C(image_id), C(labels),
              C(role) (the value of O(label)), C(started_at), C(exit_code), C(finished_at), C(oom_killed), C(error) (the
              daemon's words when it could not start it, else null), C(restart_count), C(last_error) (see
              O(stopped_log_lines); else null).
          type: dict
          sample: {"gpulab-ray-head": {"exists": true, "running": true, "status": "running", "image_id": "sha256:4c1e...",
                   "labels": {"org.gpulab.vllm.role": "ray-head"}, "role": "ray-head", "started_at": "2026-12-02T15:20:41Z",
                   "exit_code": 0, "finished_at": "0001-01-01T00:00:00Z", "oom_killed": false, "error": null,
                   "restart_count": 0, "last_error": null}}
        network:
          description:
            - C(interfaces), the interface names; and by interface (key as in Ansible's facts, C(eth0_100) for C(eth0.100))
              C(device), C(active) (administratively up), C(carrier), C(mtu), C(macaddress), C(ipv4) (C(address), C(prefix))
              when it has an IPv4 address, C(ipv4_secondaries).
          type: dict
          sample: {"interfaces": ["lo", "enp1s0f0np0"], "enp1s0f0np0": {"device": "enp1s0f0np0", "active": true, "carrier": true,
                   "mtu": 1500, "macaddress": "5e:0a:77:1c:02:11", "ipv4": {"address": "10.220.0.12", "prefix": "24"},
                   "ipv4_secondaries": []}}
        images:
          description:
            - By reference of O(images), C(present), C(id), C(repo_digests), C(entrypoint) (a list), and the platform the
              node's copy was built for, C(os), C(architecture), C(variant) (null when absent).
            - C(error), the daemon's words when it refuses the reference, else null.
            - C(registry), null when the registry was not asked (O(ask_registry)); else C(digest) and C(media_type) of
              what the reference names there, C(platforms) (a list of C(os), C(architecture), C(variant); one per image
              of an image index; null when the daemon could not tell, as Docker 20.10 for an OCI image manifest) and
              C(error) (the registry's or the daemon's words on one line, or null).
          type: dict
          sample: {"nvcr.io/nvidia/vllm:26.02-py3": {"present": false, "id": null, "repo_digests": [], "entrypoint": [],
                   "os": null, "architecture": null, "variant": null, "error": null,
                   "registry": {"digest": "sha256:71725d...", "media_type": "application/vnd.oci.image.index.v1+json",
                                "platforms": [{"os": "linux", "architecture": "amd64", "variant": null},
                                              {"os": "linux", "architecture": "arm64", "variant": "v8"}], "error": null}}}
        platform:
          description:
            - The platform the node's Docker daemon pulls for, C(os) and C(architecture) as OCI names them (C(amd64),
              C(arm64)), from C(GET /version); a DGX Spark is C(linux)/C(arm64).
          type: dict
          sample: {"os": "linux", "architecture": "arm64"}
        listening_tcp_ports:
          description: TCP ports in the LISTEN state on any address, sorted.
          type: list
          elements: int
          sample: [22, 6379, 10001]
        paths:
          description: By path of O(paths), whether it exists.
          type: dict
          sample: {"/dev/nvidia0": false, "/dev/infiniband": false}
        globs:
          description: By pattern of O(globs), the matching paths, sorted.
          type: dict
          sample: {"/dev/nvidia[0-9]*": []}
        rdma_devices:
          description: Names of the RDMA devices, sorted.
          type: list
          elements: str
          sample: ["mlx5_0", "mlx5_1"]
        rdma:
          description:
            - C(devices), by RDMA device name, C(pci) (its PCI address), C(node_guid), C(sys_image_guid) and C(ports),
              by port number, C(state) (V(ACTIVE), V(DOWN), ...), C(phys_state), C(link_layer) (V(Ethernet) for RoCE,
              V(InfiniBand)), C(rate) and C(gids), each non-zero GID with its C(index), C(gid), C(type)
              (V(RoCE v2), V(IB/RoCE v1)) and C(netdev) (the interface it belongs to, or null).
            - C(netdevs), by interface name, for the interfaces whose device has RDMA devices, C(pci), C(dev_port)
              and C(rdma_devices).
          type: dict
          sample: {"devices": {"rocep1s0f1": {"pci": "0000:01:00.1", "ports": {"1": {"state": "ACTIVE", "link_layer": "Ethernet"}}}},
                   "netdevs": {"enp1s0f1np1": {"pci": "0000:01:00.1", "dev_port": 0, "rdma_devices": ["rocep1s0f1"]}}}
        iptables:
          description:
            - By chain of O(iptables_chains), its rules as C(iptables -S CHAIN) prints them, or V(null) when it does not exist.
            - Read from one listing of the C(filter) table.
          type: dict
          sample: {"GPULAB-RAY": ["-N GPULAB-RAY", "-A GPULAB-RAY -i lo -p tcp -j ACCEPT"]}
        ip6tables:
          description: By chain of O(ip6tables_chains), as RV(ansible_facts.gpulab_node.iptables); null without IPv6 filtering.
          type: dict
        controller_address:
          description:
            - The address the controller's SSH connection comes from, as this node sees it (C(SSH_CLIENT) of the module's
              process or, under become, of the login shell above it); null over another connection.
          type: str
          sample: 10.210.0.1
        files:
          description:
            - By path of O(files), C(exists), C(isdir), C(mode) (octal string), C(uid), C(gid) and C(matches) (null without
              O(files[].sha1)); with O(files[].digest), C(sha1).
          type: dict
          sample: {"/etc/gpulab-ray/ray_token": {"exists": true, "isdir": false, "mode": "0600", "uid": 0, "gid": 0, "matches": true}}
        memory:
          description:
            - From O(meminfo), in bytes (null where the kernel prints no such field), C(total) (MemTotal), C(free)
              (MemFree), C(available) (MemAvailable), C(cached) (Cached), C(buffers), C(dirty), C(swap_total),
              C(swap_free).
            - C(gpus), the GPUs C(nvidia-smi) lists, each C(name) and C(memory_total_mib) (null where the driver reports
              none), or null without C(nvidia-smi) on the node; C(nvidia_smi_error), its words when it failed, else null.
            - C(unified), whether the GPUs' memory is the host's; C(unified_from), what decided it (V(nvidia-smi),
              V(no nvidia-smi) or V(setting), see O(unified_memory)).
          type: dict
          sample: {"total": 130663165952, "free": 8167014400, "available": 121411960832, "cached": 110595489792,
                   "buffers": 1048576, "dirty": 0, "swap_total": 0, "swap_free": 0,
                   "gpus": [{"name": "NVIDIA GB10", "memory_total_mib": null}], "nvidia_smi_error": null,
                   "unified": true, "unified_from": "nvidia-smi"}
"""

import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpulab.vllm.plugins.module_utils._node import (
    DockerError,
    add_link_speeds,
    add_stop_causes,
    controller_address,
    describe_file,
    docker_config_path,
    docker_containers,
    docker_images,
    docker_platform,
    listening_ports,
    node_memory,
    parse_gpu_query,
    parse_ip_address_json,
    read_docker_config,
    read_rdma,
    registry_credentials,
    split_iptables_listing,
)


def credentials_reader(module):
    """credentials_for(REF) for docker_images: the node's docker client config, read at the first image the
    registry is asked about, and its credential helpers run as the docker CLI runs them."""
    config = []

    def ask_helper(name, server):
        helper = module.get_bin_path("docker-credential-" + name)
        if helper is None:
            return None
        rc, out, unused_err = module.run_command([helper, "get"], data=server, binary_data=True)
        try:
            return json.loads(out) if rc == 0 else None
        except ValueError:
            return None

    def credentials_for(ref):
        if not config:
            config.append(read_docker_config(docker_config_path()))
        return registry_credentials(ref, config[0], ask_helper)

    return credentials_for


def list_chains(module, tool, chains, timeout, required=True):
    """The chains' rules as `TOOL -S` prints them, from one listing of the filter table. Without the tool (or, for
    ip6tables, a kernel without IPv6 filtering) an optional listing is null."""
    if not chains:
        return {}
    binary = module.get_bin_path(tool)
    if binary is None:
        if not required:
            return None
        module.fail_json(msg="%s_chains was given but this node has no %s command; install iptables or leave "
                             "%s_chains empty" % (tool, tool, tool))
    rc, out, err = module.run_command([binary, "-w", str(int(timeout)), "-S"])
    if rc != 0:
        if not required:
            return None
        lines = (err or out).strip().splitlines() or ["no output"]
        module.fail_json(msg="%s -S failed on this node: %s; check that %s works here" % (tool, lines[-1], tool))
    return split_iptables_listing(out, chains)


def read_memory(module, meminfo, unified):
    """The node's memory and GPUs (node_memory), nvidia-smi asked when the node has it."""
    try:
        with open(meminfo) as handle:
            text = handle.read()
    except OSError as exc:
        module.fail_json(msg="cannot read %s on this node: %s; node_facts reads the node's memory there (meminfo)"
                             % (meminfo, exc.strerror or exc))
    gpus, error = None, None
    smi = module.get_bin_path("nvidia-smi")
    if smi is not None:
        rc, out, err = module.run_command([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
        if rc == 0:
            gpus = parse_gpu_query(out)
        else:
            gpus = []
            error = ((err or out).strip().splitlines() or ["exit %d" % rc])[-1]
    memory = node_memory(text, gpus, unified)
    memory["nvidia_smi_error"] = error
    return memory


def main():
    module = AnsibleModule(
        argument_spec=dict(
            docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
            label=dict(type="str", default="org.gpulab.vllm.role"),
            containers=dict(type="list", elements="str", default=[]),
            images=dict(type="list", elements="str", default=[]),
            ask_registry=dict(type="str", choices=["never", "absent", "always"], default="never"),
            paths=dict(type="list", elements="path", default=["/dev/nvidia0", "/dev/infiniband"]),
            globs=dict(type="list", elements="str", default=["/dev/nvidia[0-9]*"]),
            sysfs=dict(type="path", default="/sys"),
            iptables_chains=dict(type="list", elements="str", default=[]),
            ip6tables_chains=dict(type="list", elements="str", default=[]),
            files=dict(type="list", elements="dict", default=[], options=dict(
                path=dict(type="path", required=True),
                sha1=dict(type="str", no_log=True),
                digest=dict(type="bool", default=False),
            )),
            meminfo=dict(type="path", default="/proc/meminfo"),
            unified_memory=dict(type="str", choices=["auto", "true", "false"], default="auto"),
            stopped_log_lines=dict(type="int", default=0),
            timeout=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    params = module.params
    node = {}
    try:
        node["containers"] = add_stop_causes(params["docker_host"], docker_containers(
            params["docker_host"], params["label"], params["containers"], params["timeout"]),
            params["stopped_log_lines"], params["timeout"])
        node["platform"] = docker_platform(params["docker_host"], params["timeout"])
        node["images"] = docker_images(params["docker_host"], params["images"], params["timeout"], params["ask_registry"],
                                       credentials_reader(module))
    except DockerError as exc:
        module.fail_json(msg="cannot read the containers from the Docker daemon at %s: %s; start Docker on this node "
                             "(systemctl start docker) or point docker_host at its socket" % (params["docker_host"], exc))
    ip = module.get_bin_path("ip")
    if ip is None:
        module.fail_json(msg="this node has no ip command, which node_facts reads the interfaces with; install iproute2")
    rc, out, err = module.run_command([ip, "-j", "address", "show"])
    if rc != 0:
        module.fail_json(msg="ip -j address show failed on this node: %s; install iproute2 4.14 or newer" % (err or out).strip()[-200:])
    node["network"] = add_link_speeds(parse_ip_address_json(out), params["sysfs"])
    node["listening_tcp_ports"] = listening_ports()
    node["paths"] = dict((path, os.path.exists(path)) for path in params["paths"])
    node["globs"] = dict((pattern, sorted(glob.glob(pattern))) for pattern in params["globs"])
    node["rdma"] = read_rdma(params["sysfs"])
    node["rdma_devices"] = sorted(node["rdma"]["devices"])
    node["iptables"] = list_chains(module, "iptables", params["iptables_chains"], params["timeout"])
    node["ip6tables"] = list_chains(module, "ip6tables", params["ip6tables_chains"], params["timeout"], required=False)
    # The address this node sees the controller connect from (OpenSSH's SSH_CLIENT); null over another connection.
    node["controller_address"] = controller_address()
    node["files"] = dict((item["path"], describe_file(item["path"], item.get("sha1"), item.get("digest"))) for item in params["files"])
    node["memory"] = read_memory(module, params["meminfo"], params["unified_memory"])
    module.exit_json(changed=False, ansible_facts={"gpulab_node": node})


if __name__ == "__main__":
    main()
