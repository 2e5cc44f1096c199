#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ray_join_wait
short_description: Wait for a Ray worker container to join its head, or name why it stopped
version_added: 0.1.0
description:
  - Follows the log of a Ray worker's container from its last start, through the Docker Engine API on the node's
    socket, until Ray says its runtime started (C(Ray runtime started)), the container stops, or O(timeout) passes.
  - The followed log ends when the container stops, so a worker that cannot join (a token the head refuses, a raylet
    that cannot start) is named within a second of its stop instead of after the gate's whole timeout. No process is
    started per look; one connection streams the log (asked as HTTP/1.0, so the daemon sends it unchunked and closes
    it at the stop), read in slices with the collection's wait loop.
  - Lines written before the container's last start (a restarted container keeps them) do not count.
  - Fails with one line naming the node, the container, the head's address, the log's line that most likely says why
    and the fix (the token, or the node's Ray ports on the fabric when Ray never said it started).
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  container:
    description: Name of the Ray worker's container on the node where the module runs.
    type: str
    required: true
  node:
    description: The node's name, for the message (the inventory hostname).
    type: str
    required: true
  head:
    description: The Ray head's address the worker joins (V(10.0.0.1:6379)), for the message.
    type: str
    required: true
  timeout:
    description: Seconds to wait for Ray's word that it started.
    type: int
    default: 120
  node_manager_port:
    description: The worker's node manager port, named in the message when Ray never said it started.
    type: int
    required: true
  object_manager_port:
    description: The worker's object manager port, named in the message when Ray never said it started.
    type: int
    required: true
  docker_host:
    description: The node's Docker daemon, V(unix:///path/to/socket) or V(tcp://host:port).
    type: str
    default: unix:///var/run/docker.sock
notes:
  - Check mode waits for nothing and reports the container's state as it is.
"""

EXAMPLES = r"""
- name: Wait for this worker's Ray to start, or see it stop
  gpulab.vllm.ray_join_wait:
    container: gpulab-ray-worker
    node: "{{ inventory_hostname }}"
    head: 10.220.0.11:6379
    timeout: 120
    node_manager_port: 6381
    object_manager_port: 6382
"""

RETURN = r"""
joined:
  description: Whether Ray said its runtime started since the container's last start.
  returned: always
  type: bool
state:
  description: The container's status when the wait ended (V(running), V(exited), ...).
  returned: always
  type: str
seconds:
  description: How long the wait took.
  returned: always
  type: float
cause:
  description: The line of the worker's log that most likely says why it did not join; null when it joined.
  returned: always
  type: str
"""

import socket
import time
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpulab.vllm.plugins.module_utils import _node, _ray_join
from ansible_collections.gpulab.vllm.plugins.module_utils._wait import poll_until

# The longest one look waits for new log lines before the wait loop checks its deadline.
SLICE = 0.5


class Follower(object):
    """The container's log from `since` on, streamed on one connection; each probe reads what arrived.

    Asked as HTTP/1.0, so that the daemon sends the stream as it is (no chunked encoding) and closes the connection
    when the container stops; read from the socket itself with a timeout per read, which leaves nothing half-read in
    a buffer between two looks."""

    def __init__(self, docker_host, name, since, tty):
        self.frames = _node.LogFrames(tty)
        self.ended = False
        self.head = b""
        self.body = False
        self.name = name
        path = "/containers/%s/logs?follow=1&stdout=1&stderr=1%s" % (quote(name, safe=""), "&since=" + since if since else "")
        # The node read's connection to the daemon, its socket used as it is.
        conn = _node._connection(docker_host, 30)
        try:
            conn.connect()
            self.sock = conn.sock
            self.sock.sendall(("GET %s HTTP/1.0\r\nHost: docker\r\n\r\n" % path).encode())
        except OSError as exc:
            conn.close()
            raise _node.DockerError("following the log of %s: %s" % (name, exc or exc.__class__.__name__))

    def _take(self, data):
        if self.body:
            self.frames.feed(data)
            return
        self.head += data
        if b"\r\n\r\n" not in self.head:
            return
        head, rest = self.head.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if status.split(" ")[1:2] != ["200"]:
            raise _node.DockerError("following the log of %s answered %s" % (self.name, status))
        self.body = True
        self.frames.feed(rest)

    def probe(self, remaining):
        """Read for up to SLICE seconds (less near the deadline); the text so far and whether the stream ended."""
        deadline = time.monotonic() + min(SLICE, remaining or SLICE)
        while not self.ended and _ray_join.STARTED not in self.frames.text:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                break
            except OSError:
                data = b""
            if data:
                self._take(data)
            else:
                self.ended = True
        return {"text": self.frames.text, "ended": self.ended}

    def close(self):
        self.sock.close()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            container=dict(type="str", required=True),
            node=dict(type="str", required=True),
            head=dict(type="str", required=True),
            timeout=dict(type="int", default=120),
            node_manager_port=dict(type="int", required=True),
            object_manager_port=dict(type="int", required=True),
            docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] < 1:
        module.fail_json(msg="timeout must be at least 1 second, got %r" % params["timeout"])
    name = params["container"]

    def inspect():
        status, doc = _node.docker_get(params["docker_host"], "/containers/%s/json" % quote(name, safe=""), 30)
        if status == 404:
            module.fail_json(msg="%s on %s: no such container to wait for; re-run the deploy" % (name, params["node"]))
        if status != 200:
            raise _node.DockerError("inspecting %s answered HTTP %s" % (name, status))
        return doc or {}

    started = time.monotonic()
    try:
        doc = inspect()
        if module.check_mode:
            module.exit_json(changed=False, joined=False, state=(doc.get("State") or {}).get("Status"), seconds=0.0, cause=None)
        follower = Follower(params["docker_host"], name, _ray_join.since_of((doc.get("State") or {}).get("StartedAt")),
                            bool((doc.get("Config") or {}).get("Tty")))
        try:
            outcome = poll_until(follower.probe, lambda seen: _ray_join.STARTED in seen["text"], True, params["timeout"], 0.01,
                                 is_hopeless=lambda seen: seen["ended"])
        finally:
            follower.close()
        state = (inspect().get("State") or {}).get("Status")
    except _node.DockerError as exc:
        module.fail_json(msg="%s on %s: the node's Docker daemon did not answer the join wait: %s" % (name, params["node"], exc))
    joined = outcome.ready
    text = outcome.value["text"]
    if not joined and not text.strip():
        # Nothing streamed (a container that stopped before the stream began): its last lines, as Docker keeps them.
        try:
            text = _node.docker_logs(params["docker_host"], name, 200, 30)
        except _node.DockerError:
            text = ""
    cause = None if joined else _node.cause_line(text)
    where = dict(params, container=name)
    problem = _ray_join.join_problem(joined, state, text, cause, where)
    result = dict(changed=False, joined=joined, state=state, seconds=round(time.monotonic() - started, 3), cause=cause)
    if problem:
        module.fail_json(msg=problem, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
