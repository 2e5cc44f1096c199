#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_health
short_description: Prove that a vLLM OpenAI-compatible server answers, serves the expected model and generates text
version_added: 0.1.0
description:
  - Probes a vLLM server in stages, in this order C(/health), C(/v1/models) (the expected model is served),
    C(/version), a real generation with a tiny O(max_tokens) (O(generation_api)), and optionally C(/metrics).
    The first stage that fails is RV(failed_stage).
  - A server that does not answer at all is not probed further. A server that answers but is unhealthy is
    still asked for a generation, because its error text says why (C(/health) answers a bare 503 when the
    engine is dead, the generation answers HTTP 500 "EngineCore encountered an issue").
  - The generation is on by default because C(/health) and C(/v1/models) can answer 200 while the engine
    is dead; only a generation shows that. It is skipped when the expected model is not served.
  - C(/version) and C(/metrics) are informational; their failure is reported in RV(probes) and fails nothing.
  - With O(wait=true) all the stages are retried every O(wait_sleep) seconds until the server is healthy or
    O(wait_timeout) has passed, for a server that is still loading its model.
  - On failure the module fails with one line naming the stage, the URL and the server's own error text,
    and still returns every probe result.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  base_url:
    description:
      - Base URL of the server, for example V(http://10.210.0.11:8000), without C(/v1).
    type: str
    required: true
  model:
    description:
      - Served model name that must be in C(/v1/models); also the model of the generation.
      - When not given, any served model will do and the generation uses the first one.
    type: str
  stall_timeout:
    description:
      - With O(wait=true) and O(container), fail once the server's start has not advanced (the same stage, the same
        last log line, the same probe result) for this many seconds, naming the stage, instead of waiting out
        O(wait_timeout). Judged on the controller between slices of O(progress_interval) seconds, so it takes effect
        at that granularity. V(0) never judges a stall.
    type: float
    default: 0
  first_start_stall_timeout:
    description:
      - The stall limit, in place of O(stall_timeout) when it is longer, while the server compiles (torch.compile)
        or captures CUDA graphs on the first start of its image on this host (RV(first_start)), as with no compile
        cache yet those phases can stay silent longer than any other stage. V(0) gives them O(stall_timeout) too.
    type: float
    default: 0
  image_id:
    description:
      - The ID of the server's image; with O(proven_images_file), what tells a first start from a later one.
    type: str
  proven_images_file:
    description:
      - A file on this host listing the images (O(image_id)) whose server answered a real completion here, one per line.
        An image it does not list makes RV(first_start) true; once the server is healthy the image is added to it
        (written beside it and renamed over it, mode 0644), which reports a change. Check mode writes nothing.
    type: path
  container:
    description:
      - Name of the Docker container that runs the server, on the host where the module runs.
      - While waiting, a container that is no longer running ends the wait at once with RV(failed_stage)
        V(server_exited) and the last error line of its log, instead of waiting out O(wait_timeout).
    type: str
  docker_host:
    description:
      - The Docker daemon that runs O(container), V(unix:///path/to/socket) or V(tcp://host:port); its state
        and, once it has exited, its log are read through the Engine API, with no process started per poll.
    type: str
    default: unix:///var/run/docker.sock
  api_key:
    description:
      - "API key of the server (vLLM's C(--api-key)), sent as C(Authorization: Bearer <key>)."
      - Never returned nor logged.
    type: str
  generation:
    description:
      - Whether to run a real generation. Leave it on; without it a dead engine looks healthy.
    type: bool
    default: true
  generation_api:
    description:
      - OpenAI endpoint of the generation, C(/v1/completions) or C(/v1/chat/completions).
    type: str
    choices: [completions, chat]
    default: completions
  prompt:
    description:
      - Prompt of the generation (the user message with O(generation_api=chat)).
    type: str
    default: Hello
  max_tokens:
    description:
      - Tokens to generate; keep it small, the probe only proves that the engine answers.
    type: int
    default: 4
  metrics:
    description:
      - Whether to also fetch C(/metrics).
    type: bool
    default: false
  request_timeout:
    description:
      - Timeout of each HTTP request in seconds. A wait shortens it to the time left.
    type: float
    default: 30
  wait_timeout:
    default: 900
  wait_sleep:
    default: 2
  validate_certs:
    description:
      - Whether to verify the server's TLS certificate for C(https) URLs.
    type: bool
    default: true
extends_documentation_fragment:
  - gpulab.vllm.wait
  - gpulab.vllm.attributes
attributes:
  check_mode:
    support: full
    details: >-
      The probes only read; the generation changes no state, so it runs in check mode too. The image is not added to
      O(proven_images_file) in check mode.
  diff_mode:
    support: none
notes:
  - With O(wait=true) it retries until the server is healthy, a real generation included. Large models take 15
    minutes and more to load; give O(wait_timeout) room for it.
  - Proxy settings of the environment are not used; the probe talks to the server directly.
seealso:
  - module: gpulab.vllm.ray_cluster_facts
"""

EXAMPLES = r"""
- name: Wait until the server answers a real completion
  gpulab.vllm.vllm_health:
    base_url: http://10.210.0.11:8000
    model: Qwen/Qwen3.5-27B
    wait: true
    wait_timeout: 1800
  register: __vllm_health

- name: Show the time to first token
  ansible.builtin.debug:
    msg: "{{ __vllm_health.vllm_version }} answered {{ __vllm_health.generated_text | to_json }} in {{ __vllm_health.time_to_first_token_s }}s"

- name: Probe with the chat API, an API key and metrics
  gpulab.vllm.vllm_health:
    base_url: https://vllm.example.internal
    model: tiny
    api_key: "{{ vllm_api_key }}"
    generation_api: chat
    metrics: true
"""

RETURN = r"""
last_log_line:
  description:
    - The last line the server's container wrote (trimmed to 300 characters), read when a wait with O(container) ends
      unhealthy; what the server was doing when the wait stopped. Absent otherwise.
  type: str
  returned: when O(wait=true), O(container) is given and the server is not healthy
  sample: "(APIServer pid=1) INFO 12-03 18:40:02 [loader.py:314] Loading weights took 2.41 seconds"
load:
  description:
    - Where the server is in its start, read from its log (the last 2000 lines) when a wait with O(container) ends
      unhealthy. C(stage) is one of V(starting), V(engine start), V(weights), V(weights loaded), V(compiling),
      V(memory profiling), V(graph capture), V(warmup done), V(API server starting), V(ready); C(detail) the line
      that set it (V(shard K of N) while weights load; in V(compiling) and V(graph capture), what vLLM says it compiles
      or captures, such as V(torch.compile, compiling the graph for compile range (1, 8192)) or
      V(capturing CUDA graphs (mixed prefill-decode, PIECEWISE), 30 of 67)); C(shards_done), C(shards_total); C(lines).
  type: dict
  returned: when O(wait=true), O(container) is given and the server is not healthy
  sample: {"stage": "weights", "detail": "shard 12 of 25", "shards_done": 12, "shards_total": 25, "lines": 431}
first_start:
  description:
    - Whether O(proven_images_file) did not list O(image_id) when the module read it, so that the first healthy
      start of this image on this host is still to come. Null without both options.
  type: bool
  returned: always
  sample: false
image_id:
  description: O(image_id), as given; null without it.
  type: str
  returned: always
  sample: sha256:0f5c2bd7c6a4
recorded_image:
  description:
    - Whether this call added O(image_id) to O(proven_images_file) (the server was healthy and the file did not list
      it).
  type: bool
  returned: always
  sample: true
healthy:
  description: Whether every stage passed.
  type: bool
  returned: always
  sample: true
failed_stage:
  description:
    - First stage that failed, null when healthy.
    - V(unreachable) no HTTP answer from C(/health); V(unhealthy) C(/health) or C(/v1/models) answered an error;
      V(model_missing) the expected model is not served; V(generation_failed) the generation did not produce text;
      V(server_exited) the watched O(container) stopped running.
    - The failure message names every failed stage in order, each with its URL and the server's own text.
  type: str
  returned: always
  sample: generation_failed
probes:
  description: Result of each probe that ran, keyed C(health), C(models), C(version), C(generation), C(metrics).
  type: dict
  returned: always
  contains:
    status:
      description: HTTP status, null when no answer came back.
      type: int
    latency_s:
      description: Seconds the request took.
      type: float
    ok:
      description: Whether the probe passed.
      type: bool
    error:
      description: What went wrong, with the server's own text; null when it passed.
      type: str
  sample:
    health: {status: 200, latency_s: 0.004, ok: true, error: null}
    models: {status: 200, latency_s: 0.006, ok: true, error: null}
    version: {status: 200, latency_s: 0.003, ok: true, error: null}
    generation: {status: 200, latency_s: 0.21, ok: true, error: null}
served_models:
  description: Model names listed by C(/v1/models).
  type: list
  elements: str
  returned: always
  sample: [tiny]
vllm_version:
  description: Version reported by C(/version).
  type: str
  returned: always
  sample: 0.32.0
time_to_first_token_s:
  description: Seconds the (non-streaming) generation request took; null when none ran.
  type: float
  returned: always
  sample: 0.21
generated_text:
  description: Text of the generation; null when none ran or it failed.
  type: str
  returned: always
  sample: " the the the"
waited:
  description: What the probing cost.
  type: dict
  returned: always
  contains:
    elapsed:
      description: Seconds spent probing (and waiting).
      type: float
    polls:
      description: Rounds of probes.
      type: int
  sample: {elapsed: 48.2, polls: 23}
"""

import os
import re
import tempfile
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpulab.vllm.plugins.module_utils import _node, _vllm_probe
from ansible_collections.gpulab.vllm.plugins.module_utils._wait import poll_until, validate_wait_options

# The shortest request timeout a wait hands to a request near its deadline.
MIN_REQUEST_TIMEOUT = 1.0


class VllmHealthCheck(object):
    """One round of probes per call, with the module's options."""

    def __init__(self, module):
        self.module = module
        self.params = module.params

    def container_exit(self):
        """Why the watched container is not running (with its last log lines), or None while it runs.

        Asked of the Docker Engine API on its socket: a poll while the model loads must not start a
        process, as the loading server wants every core there is.
        """
        name = self.params["container"]
        if not name:
            return None
        try:
            http_status, doc = _node.docker_get(self.params["docker_host"], "/containers/%s/json" % quote(name, safe=""), 10)
        except _node.DockerError:
            # The daemon did not answer this time: nothing is known, keep waiting for the server.
            return None
        if http_status == 404:
            return "container %s is not there (no such container)" % name
        state = (doc or {}).get("State") or {}
        status, exit_code = state.get("Status"), state.get("ExitCode")
        # A paused container is frozen, not gone: it may go on, and a stall limit judges it.
        if http_status != 200 or status in ("running", "created", "restarting", "paused"):
            return None
        try:
            logs = _node.docker_logs(self.params["docker_host"], name, 400, 10)
        except _node.DockerError:
            logs = ""
        return "container %s %s with code %s; %s" % (
            name, status, exit_code, _vllm_probe.last_error_line(logs) or "see docker logs %s" % name)

    def probe(self, remaining):
        report = self.probe_server(remaining)
        # The container is looked at only when the server does not answer well: is it still there to wait for?
        exited = None if report["healthy"] else self.container_exit()
        return _vllm_probe.exited_report(exited) if exited else report

    def probe_server(self, remaining):
        timeout = self.params["request_timeout"]
        if remaining is not None:
            timeout = max(min(timeout, remaining), MIN_REQUEST_TIMEOUT)

        def send(method, url, body):
            return _vllm_probe.http_exchange(method, url, body, api_key=self.params["api_key"], timeout=timeout,
                                             validate_certs=self.params["validate_certs"])

        return _vllm_probe.probe_server(
            send, self.params["base_url"], model=self.params["model"], generation=self.params["generation"],
            generation_api=self.params["generation_api"], prompt=self.params["prompt"],
            max_tokens=self.params["max_tokens"], metrics=self.params["metrics"])


def read_proven_images(path):
    """The images path lists; None without a path, an empty list when the file is not there yet."""
    if not path:
        return None
    try:
        with open(path) as handle:
            return _vllm_probe.proven_images(handle.read())
    except FileNotFoundError:
        return []


def write_proven_images(path, images):
    """Write the list beside path and rename it over path: a reader sees the old list or the new one, whole."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".proven_images.", dir=folder)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(_vllm_probe.proven_images_text(images))
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main():
    argument_spec = dict(
        base_url=dict(type="str", required=True),
        model=dict(type="str"),
        api_key=dict(type="str", no_log=True),
        generation=dict(type="bool", default=True),
        generation_api=dict(type="str", default="completions", choices=["completions", "chat"]),
        prompt=dict(type="str", default="Hello"),
        max_tokens=dict(type="int", default=4, no_log=False),
        metrics=dict(type="bool", default=False),
        request_timeout=dict(type="float", default=30),
        wait=dict(type="bool", default=False),
        wait_timeout=dict(type="int", default=900),
        wait_sleep=dict(type="float", default=2),
        progress_interval=dict(type="float", default=30),
        stall_timeout=dict(type="float", default=0),
        first_start_stall_timeout=dict(type="float", default=0),
        image_id=dict(type="str"),
        proven_images_file=dict(type="path"),
        wait_resume=dict(type="dict"),
        validate_certs=dict(type="bool", default=True),
        container=dict(type="str"),
        docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params
    problem = validate_wait_options(params["wait_timeout"], params["wait_sleep"])
    if problem is None and params["request_timeout"] <= 0:
        problem = "request_timeout must be greater than 0, got %r" % params["request_timeout"]
    if problem is None and params["max_tokens"] < 1:
        problem = "max_tokens must be at least 1, got %r" % params["max_tokens"]
    if problem is None and not params["base_url"].startswith(("http://", "https://")):
        problem = "base_url must start with http:// or https://, got %r" % params["base_url"]
    if problem:
        module.fail_json(msg=problem)

    proven = read_proven_images(params["proven_images_file"]) if params["image_id"] else None
    first_start = None if proven is None else params["image_id"] not in proven

    check = VllmHealthCheck(module)
    outcome = poll_until(check.probe, lambda report: report["healthy"], params["wait"],
                         params["wait_timeout"], params["wait_sleep"],
                         is_hopeless=lambda report: report["failed_stage"] == "server_exited", resume=params["wait_resume"])
    report = outcome.value
    result = dict(
        changed=False,
        healthy=report["healthy"],
        failed_stage=report["failed_stage"],
        probes=report["probes"],
        served_models=report["served_models"],
        vllm_version=report["vllm_version"],
        time_to_first_token_s=report["time_to_first_token_s"],
        generated_text=report["generated_text"],
        waited=dict(elapsed=round(outcome.elapsed, 3), polls=outcome.polls),
        first_start=first_start,
        image_id=params["image_id"],
        recorded_image=False,
    )
    if report["healthy"] and first_start and not module.check_mode:
        try:
            write_proven_images(params["proven_images_file"], proven + [params["image_id"]])
        except OSError as exc:
            module.fail_json(msg="the server answered, but %s could not be written: %s"
                             % (params["proven_images_file"], exc), **result)
        result.update(changed=True, recorded_image=True)
    if not report["healthy"] and params["container"] and params["wait"]:
        # Where the server is in its start (weights shard k of N, memory profiling, graph capture, ...) and what it
        # says last: the progress a waiting play shows, and how it tells a load that advances from one that stalls.
        try:
            text = re.sub(r"\x1b\[[0-9;]*m", "", _node.docker_logs(params["docker_host"], params["container"], 2000, 10))
            lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
            result["last_log_line"] = lines[-1][:300] if lines else None
            result["load"] = _vllm_probe.load_progress(text)
        except _node.DockerError:
            result["last_log_line"] = None
    if not report["healthy"]:
        module.fail_json(msg=_vllm_probe.failure_message(report, params["base_url"], outcome.as_dict()), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
