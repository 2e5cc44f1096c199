# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Ray worker's join, read from its container's log as it is written: the decisions of gpulab.vllm.ray_join_wait.

Private to gpulab.vllm. The log comes from the Docker Engine API (GET /containers/NAME/logs?follow=1), which streams
what the container writes from its last start until it stops: the stream ending is the container stopping, seen at
once; the node read's LogFrames puts its frames back together as they arrive.
"""

from __future__ import annotations

import calendar
import re
import time

# Ray's own line once `ray start` has its raylet running and registered with the head.
STARTED = "Ray runtime started"

_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def since_of(started_at):
    """Docker's StartedAt ('2026-12-07T13:59:42.123456789Z') as the Engine API's `since` ('1796652782.123456789'): the
    log from this start of the container on, without the lines of the starts before it. None when it is unreadable
    or the zero time of a container never started."""
    found = _RFC3339.match(started_at or "")
    if not found or found.group(1).startswith("0001-"):
        return None
    seconds = calendar.timegm(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S"))
    zone = found.group(3)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return "%d.%s" % (seconds, (found.group(2) or "0")[:9].ljust(9, "0"))


def join_problem(joined, state, log_text, cause, where):
    """None when the worker joined; else one line naming the node, the container, the head, what the log says and
    the fix.

    joined: Ray said it started since this start; state: the container's status after the wait ('running',
    'exited', ...); cause: the log's line that most likely says why (the collection's cause_line), or None;
    where: {'container', 'node', 'head', 'timeout', 'node_manager_port', 'object_manager_port'}."""
    if joined:
        return None
    stopped = state != "running"
    lines = [line for line in (log_text or "").splitlines() if line.strip()]
    said = cause or (lines[-1].strip() if lines else "its log is empty")
    if len(said) > 300:
        said = said[:297] + "..."
    what = ("stopped before it joined" if stopped else
            "did not say that its Ray started within %s s of joining" % where["timeout"])
    hint = ""
    if re.search(r"(?i)auth|token|unauthenticated", log_text or ""):
        hint = "; a token the head refuses means ray_cluster_auth_token differs on this node"
    elif not stopped:
        hint = ("; check that the head reaches this node's Ray ports on the fabric (ray_cluster_node_manager_port %s, "
                "ray_cluster_object_manager_port %s): another firewall or a raw-table rule may drop them"
                % (where["node_manager_port"], where["object_manager_port"]))
    return "%s on %s %s the Ray head at %s (state=%s): %s; read `docker logs %s` on %s%s" % (
        where["container"], where["node"], what, where["head"], state, said, where["container"], where["node"], hint)
