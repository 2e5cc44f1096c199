# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verdict of playbooks/status.yml: what each node, the Ray cluster and the server are, cross-checked.

Ray keeps a node whose container is gone "alive" until its own heartbeat timeout (a minute or more), so the
containers are read beside Ray's table and win: a node whose Ray container is not running is lost at once.
A container that stopped says why (OOM, a signal, an exit code, the last error line of its log).
"""

from __future__ import annotations

import base64
import json

from ansible_collections.gpulab.vllm.plugins.filter.firewall import firewall_drift
from ansible_collections.gpulab.vllm.plugins.module_utils._node import cause_line, stop_reason


def _addresses(node: dict) -> list:
    network = node.get("network") or {}
    found = []
    for name in network.get("interfaces") or []:
        ipv4 = (network.get(name.replace("-", "_").replace(".", "_").replace(":", "_")) or {}).get("ipv4") or {}
        if ipv4.get("address"):
            found.append(ipv4["address"])
    return found


def _container(node: dict, name: str) -> dict:
    found = (node.get("containers") or {}).get(name) or {"exists": False, "running": False}
    state = "running" if found.get("running") else (found.get("status") or "absent") if found.get("exists") else "absent"
    return {"name": name, "state": state, "exit_code": found.get("exit_code") if found.get("exists") else None,
            "reason": None if found.get("running") else stop_reason(found) if found.get("exists") else None}


def _firewall(node: dict, expected: bool) -> dict:
    v4 = node.get("iptables") or {}
    if v4.get("GPULAB-INPUT") is None:
        return {"state": "none", "drift": [], "expected": expected}
    drift = [f"IPv4 {item}" for item in firewall_drift(v4)]
    if node.get("ip6tables") is not None:
        drift += [f"IPv6 {item}" for item in firewall_drift(node["ip6tables"])]
    return {"state": "drift" if drift else "in place", "drift": drift, "expected": expected}


def cluster_status(reads: dict, head: str, ray: dict | None, vllm: dict | None, expect: dict) -> dict:
    """The status of a deployment.

    reads: by host, in inventory order, what node_facts read there ({'node': gpulab_node} or {'error': why}),
    or None for a host that was not reached. ray, vllm: the head's ray_cluster_facts and vllm_health results (a
    failed one carries msg). expect: ray_head_container, ray_worker_container, vllm_container, endpoint,
    firewall (whether the deploy keeps a firewall), serve (True, False, or None to infer it from the containers).
    """
    ray = ray or {}
    vllm = vllm or {}
    cluster = (ray.get("ansible_facts") or {}).get("ray_cluster") if not ray.get("msg") else None
    ray_nodes = (cluster or {}).get("nodes") or []
    head_read = (reads.get(head) or {}).get("node") or {}
    head_containers = head_read.get("containers") or {}
    anything = any(((read or {}).get("node") or {}).get("containers", {}).get(name, {}).get("exists")
                   for read in reads.values()
                   for name in (expect["ray_head_container"], expect["ray_worker_container"]))
    serve = expect.get("serve")
    if serve is None:
        serve = bool((head_containers.get(expect["vllm_container"]) or {}).get("exists"))
    deployment = ("serving" if serve else "ray_only") if anything or serve else "none"

    problems, nodes = [], []
    for host, read in reads.items():
        role = "head" if host == head else "worker"
        row = {"host": host, "role": role, "reachable": read is not None and "node" in read,
               "error": None if read is None else read.get("error"), "containers": [], "ray": {"state": "unknown"},
               "image": None, "firewall": None}
        if not row["reachable"]:
            row["error"] = row["error"] or "not reached"
            problems.append(f"{host}: not read ({row['error']})")
            nodes.append(row)
            continue
        node = read["node"]
        images = list((node.get("images") or {}).values())
        row["image"] = (images[0].get("id") or None) if images and images[0].get("present") else None
        ray_name = expect["ray_head_container"] if role == "head" else expect["ray_worker_container"]
        ray_container = _container(node, ray_name)
        row["containers"].append(ray_container)
        if role == "head" and (serve or (head_containers.get(expect["vllm_container"]) or {}).get("exists")):
            row["containers"].append(_container(node, expect["vllm_container"]))
        addresses = _addresses(node)
        seen = [item for item in ray_nodes if item.get("node_ip") in addresses]
        alive = [item for item in seen if item.get("alive")]
        ray_node = alive[0] if alive else seen[0] if seen else None
        if ray_container["state"] != "running":
            # Whatever Ray still says: a node without its Ray container runs nothing.
            state = "lost" if ray_container["state"] != "absent" or deployment != "none" else "absent"
        elif cluster is None:
            state = "unknown"
        elif ray_node is None:
            state = "not joined"
        else:
            state = "alive" if ray_node.get("alive") else "dead"
        row["ray"] = {"state": state, "node_ip": (ray_node or {}).get("node_ip"),
                      "gpus": ((ray_node or {}).get("resources") or {}).get("GPU") if state == "alive" else None,
                      "ray_says": None if ray_node is None else ("alive" if ray_node.get("alive") else "dead")}
        if deployment != "none":
            for container in row["containers"]:
                if container["state"] != "running":
                    problems.append(f"{host}: {container['name']} " + (
                        "is not there" if container["state"] == "absent" else container["reason"]))
            if state == "lost" and row["ray"]["ray_says"] == "alive":
                problems.append(f"{host}: lost (Ray still counts it alive until its heartbeat times out)")
            elif state in ("not joined", "dead"):
                said = "has no node at " + ", ".join(addresses) if state == "not joined" else "marks it dead"
                problems.append(f"{host}: its Ray container runs, but Ray {said}")
        row["firewall"] = _firewall(node, bool(expect.get("firewall", True)))
        if row["firewall"]["state"] == "drift":
            problems.append(f"{host}: firewall drift ({'; '.join(row['firewall']['drift'])}); re-run the deploy to repair it")
        elif row["firewall"]["state"] == "none" and row["firewall"]["expected"] and deployment != "none":
            problems.append(f"{host}: no gpulab firewall (GPULAB-INPUT); re-run the deploy to restore it")
        nodes.append(row)

    ray_view = {"readable": cluster is not None, "error": ray.get("msg") if cluster is None else None}
    if cluster is not None:
        ray_view.update({key: cluster.get(key) for key in ("alive_nodes", "dead_nodes", "pending_nodes", "gpus", "ray_version")})
    elif deployment != "none":
        problems.append(f"Ray: not readable on {head} ({ray.get('msg') or 'not asked'})")

    if not serve:
        vllm_view = {"state": "none", "reason": "a Ray-only deployment" if deployment == "ray_only" else "nothing deployed"}
    elif vllm.get("healthy"):
        vllm_view = {"state": "answers", "version": vllm.get("vllm_version"), "models": vllm.get("served_models") or [],
                     "generated_text": vllm.get("generated_text"), "endpoint": expect.get("endpoint")}
    else:
        server = _container(head_read, expect["vllm_container"]) if head_read else {"state": "unknown", "reason": None}
        reason = server["reason"] if server["state"] not in ("running", "unknown") else None
        if server["state"] == "absent":
            reason = f"its container {expect['vllm_container']} is not there"
        vllm_view = {"state": "down", "stage": vllm.get("failed_stage") or "not reached",
                     "reason": reason or vllm.get("msg") or "not asked", "endpoint": expect.get("endpoint")}
        problems.append(f"vLLM: down at {expect.get('endpoint')} ({vllm_view['stage']}: {vllm_view['reason']})")

    if deployment == "none":
        verdict = "not deployed"
    elif not problems:
        verdict = "serving" if serve else "ray ready"
    elif serve and vllm_view["state"] == "answers":
        verdict = "degraded"
    else:
        verdict = "down"
    ok = verdict in ("serving", "ray ready")
    summary = {"serving": f"serving: vLLM answers at {expect.get('endpoint')}",
               "ray ready": "ray ready: every node alive in Ray, no vLLM server (a Ray-only deployment)",
               "not deployed": "not deployed: no gpulab container on any node"}.get(verdict) or \
        f"{verdict}: " + "; ".join(problems)
    return {"verdict": verdict, "ok": ok, "deployment": deployment, "summary": summary, "problems": problems,
            "nodes": nodes, "ray": ray_view, "vllm": vllm_view}


def _supervisor(state: dict) -> dict:
    return {"phase": state.get("phase"), "detail": state.get("phase_detail") or "", "since": state.get("phase_since"),
            "restarts": state.get("restarts") or {}, "last_event": state.get("last_event"),
            "watchdog": state.get("watchdog"), "fabric": state.get("fabric"), "collective": state.get("collective")}


def with_supervisors(status: dict, reads: dict) -> dict:
    """The status with each node's supervisor (its state.json, read by slurp: {host: result}) as 'supervisors'.

    A node whose supervisor found its fabric changed under the deployment (link, MTU, an RDMA port, the GID NCCL
    takes) is a problem named first, with the change and since when: the status is not ok while it lasts, even in
    the moments before the supervisor has stopped that node's part of the gang."""
    supervisors = {}
    for host, read in (reads or {}).items():
        content = (read or {}).get("content")
        if not content:
            continue
        try:
            supervisors[host] = _supervisor(json.loads(base64.b64decode(content)))
        except (ValueError, TypeError):
            supervisors[host] = {"phase": "unreadable", "detail": "its state.json is not JSON", "restarts": {}}
    out = dict(status, supervisors=supervisors)
    changed = ["%s: its fabric changed under the deployment (since %s): %s"
               % (host, (sup.get("fabric") or {}).get("since"), "; ".join(sup["fabric"].get("changes") or []))
               for host, sup in supervisors.items() if sup.get("fabric") and not sup["fabric"].get("ok", True)]
    if changed:
        verdict = "degraded" if status.get("verdict") in ("serving", "ray ready") else status.get("verdict")
        problems = changed + list(status.get("problems") or [])
        out.update(ok=False, verdict=verdict, problems=problems, summary="%s: %s" % (verdict, "; ".join(problems)))
    return out


class FilterModule:
    def filters(self):
        return {"cluster_status": cluster_status, "first_failure": first_failure, "redact": redact, "cause_line": cause_line,
                "with_supervisors": with_supervisors}


# The deploy's stages in order, and what in a status says each one failed.
STAGES = ("node read", "image", "firewall", "ray_cluster", "gate", "vllm_server", "vllm_health")


def first_failure(status: dict, expected_gpus: int | None = None) -> dict:
    """The first stage of the deploy that a status (cluster_status) shows failing, as {'stage', 'where', 'why'};
    stage 'none' when the cluster serves (or, Ray only, is ready) as deployed, 'nothing deployed' when nothing is."""
    if status["deployment"] == "none":
        return {"stage": "nothing deployed", "where": None, "why": status["summary"]}
    rows = status["nodes"]
    for row in rows:
        if not row["reachable"]:
            return {"stage": "node read", "where": row["host"], "why": row["error"]}
    images = {row["image"] for row in rows}
    for row in rows:
        if row["image"] is None:
            return {"stage": "image", "where": row["host"], "why": "the deployed image is not on this node"}
    if len(images) > 1:
        return {"stage": "image", "where": ", ".join(row["host"] for row in rows),
                "why": "the nodes hold different images: " + ", ".join(f"{row['host']} {row['image'][7:19]}" for row in rows)}
    for row in rows:
        if row["firewall"] and row["firewall"]["state"] == "drift":
            return {"stage": "firewall", "where": row["host"], "why": "; ".join(row["firewall"]["drift"])}
    for row in rows:
        ray = row["containers"][0]
        if ray["state"] != "running":
            return {"stage": "ray_cluster", "where": row["host"],
                    "why": f"{ray['name']} " + ("is not there" if ray["state"] == "absent" else ray["reason"])}
    if not status["ray"]["readable"]:
        return {"stage": "gate", "where": rows[0]["host"], "why": f"Ray is not readable: {status['ray']['error']}"}
    for row in rows:
        if row["ray"]["state"] != "alive":
            return {"stage": "gate", "where": row["host"], "why": f"its Ray node is {row['ray']['state']}"}
    gpus = status["ray"].get("gpus") or 0
    if expected_gpus and float(gpus) < float(expected_gpus):
        return {"stage": "gate", "where": rows[0]["host"], "why": f"Ray offers {gpus} GPU(s) of {expected_gpus}"}
    if status["vllm"]["state"] == "down":
        server = next((c for c in rows[0]["containers"][1:]), None)
        if server is None or server["state"] != "running":
            return {"stage": "vllm_server", "where": rows[0]["host"], "why": status["vllm"]["reason"]}
        return {"stage": "vllm_health", "where": rows[0]["host"], "why": f"{status['vllm']['stage']}: {status['vllm']['reason']}"}
    return {"stage": "none", "where": None, "why": status["summary"]}


def redact(text, secrets) -> str:
    """text with every secret of `secrets` (a dict: name -> value) replaced by <redacted NAME>, and the values of
    settings whose name says they are secret (TOKEN, KEY, PASSWORD, SECRET) replaced too."""
    import re  # noqa: PLC0415 - only this filter needs it

    out = str(text)
    for name, value in sorted((secrets or {}).items(), key=lambda item: -len(str(item[1] or ""))):
        if value and len(str(value)) >= 8:
            out = out.replace(str(value), f"<redacted {name}>")

    def hide(match):
        name, value = match.group(1), match.group(2)
        # Where a secret lives (RAY_AUTH_TOKEN_PATH=/run/...) is not the secret, and helps a diagnosis.
        if value.startswith("<redacted") or name.upper().endswith(("_PATH", "_FILE", "_DIR", "_MODE")):
            return match.group(0)
        return f"{name}=<redacted>"

    return re.sub(r"(?i)\b([A-Z0-9_]*(?:TOKEN|API_KEY|APIKEY|PASSWORD|SECRET)[A-Z0-9_]*)=([^\s\"',]+)", hide, out)
