# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Probe a vLLM OpenAI-compatible server, stage by stage.

Private to gpulab.vllm. ``/health`` and ``/v1/models`` answer 200 while the
engine is dead (seen in the lab: every completion then fails with HTTP 500
"EngineCore encountered an issue"), so a probe is only healthy once a real
generation has answered.

The transport (``http_exchange``) is the only part that touches the network;
``probe_server`` takes any callable with the same signature, which is how the
unit tests replay exchanges recorded from the lab.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse
import socket
import time

from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url
from ansible_collections.gpulab.vllm.plugins.module_utils import _node

STAGE_UNREACHABLE = "unreachable"
STAGE_UNHEALTHY = "unhealthy"
STAGE_MODEL_MISSING = "model_missing"
STAGE_GENERATION_FAILED = "generation_failed"

GENERATION_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Longest server text kept in a message or a probe's error.
_ERROR_TEXT_LIMIT = 400


def key_belongs(url):
    """Whether a request to url may carry the API key: only the OpenAI-style routes under /v1/."""
    return urlparse(url).path.startswith("/v1/")


def http_exchange(method, url, body=None, api_key=None, timeout=30.0, validate_certs=True,
                  opener=open_url, clock=time.monotonic):
    """One HTTP request. Never raises for HTTP or network errors.

    Returns a dict: status (int or None), body (text or None), latency_s, error
    (text when no HTTP answer came back, else None).
    """
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body)
        headers["Content-Type"] = "application/json"
    # The key goes only to the API's own routes (/v1/...), and never across a redirect: /health and /version need
    # none, and a redirect could hand it to another server.
    keyed = bool(api_key) and key_belongs(url)
    if keyed:
        headers["Authorization"] = "Bearer %s" % api_key
    started = clock()
    result = {"status": None, "body": None, "latency_s": None, "error": None}
    try:
        response = opener(url, data=data, headers=headers, method=method, timeout=timeout,
                          validate_certs=validate_certs, use_proxy=False,
                          follow_redirects="none" if keyed else "safe")
        result["status"] = response.getcode()
        result["body"] = to_text(response.read(), errors="surrogate_or_replace")
    except HTTPError as exc:
        result["status"] = exc.code
        try:
            result["body"] = to_text(exc.read(), errors="surrogate_or_replace")
        except Exception:  # pylint: disable=broad-except
            result["body"] = ""
    except (URLError, socket.timeout, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        result["error"] = "%s: %s" % (type(reason).__name__, to_text(reason))
    except Exception as exc:  # pylint: disable=broad-except
        # http.client raises its own classes (RemoteDisconnected, BadStatusLine).
        result["error"] = "%s: %s" % (type(exc).__name__, to_text(exc))
    result["latency_s"] = round(clock() - started, 4)
    return result


def server_error_text(body, limit=_ERROR_TEXT_LIMIT):
    """The server's own explanation from an error body, on one line."""
    text = None
    try:
        document = json.loads(body) if body else None
    except ValueError:
        document = None
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict):
            text = error.get("message")
        elif isinstance(error, str):
            text = error
        if text is None:
            text = document.get("message") or document.get("detail")
    if text is None:
        text = body or ""
    text = " ".join(to_text(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _probe_record(exchange, ok, error=None):
    return {
        "status": exchange["status"],
        "latency_s": exchange["latency_s"],
        "ok": bool(ok),
        "error": error,
    }


def _describe_failure(method, url, exchange):
    if exchange["status"] is None:
        return "%s %s got no answer: %s" % (method, url, exchange["error"])
    text = server_error_text(exchange["body"])
    return "%s %s answered HTTP %d%s" % (method, url, exchange["status"], ": " + text if text else "")


def _json_body(exchange):
    try:
        return json.loads(exchange["body"] or "")
    except ValueError:
        return None


def generation_request(generation_api, model, prompt, max_tokens):
    """Path and body of the smallest real generation."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if generation_api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return GENERATION_PATHS[generation_api], body


def generated_text_of(generation_api, document):
    """Text of the first choice, or None if the answer has none."""
    try:
        choice = document["choices"][0]
        if generation_api == "chat":
            return choice["message"]["content"]
        return choice["text"]
    except (KeyError, IndexError, TypeError):
        return None


def new_report():
    return {
        "healthy": False,
        "failed_stage": None,
        "error": None,
        "probes": {},
        "served_models": [],
        "vllm_version": None,
        "time_to_first_token_s": None,
        "generated_text": None,
    }


def probe_server(send, base_url, model=None, generation=True, generation_api="completions", prompt="Hello",
                 max_tokens=4, metrics=False):
    """Run the probes in order; the first failing stage is the report's ``failed_stage``.

    ``send(method, url, body)`` returns what ``http_exchange`` returns.
    A server that answers but is unhealthy is still asked for a generation:
    its ``/health`` says only "503", the generation's error says why. The
    report's ``error`` is one line: what was expected, what came back, where.
    """
    base = base_url.rstrip("/")
    report = new_report()
    probes = report["probes"]
    problems = []

    def record(name, exchange, stage=None, problem=None):
        probes[name] = _probe_record(exchange, problem is None, problem)
        if problem is not None:
            problems.append(problem)
            if report["failed_stage"] is None:
                report["failed_stage"] = stage

    url = base + "/health"
    health = send("GET", url, None)
    if health["status"] is None:
        record("health", health, STAGE_UNREACHABLE, _describe_failure("GET", url, health))
        return _finish(report, problems)
    record("health", health, STAGE_UNHEALTHY, None if health["status"] == 200 else _describe_failure("GET", url, health))

    url = base + "/v1/models"
    models = send("GET", url, None)
    served = _served_models(models)
    if served is None:
        if models["status"] == 200:
            problem = "GET %s answered 200 without a model list: %s" % (url, server_error_text(models["body"]))
        else:
            problem = _describe_failure("GET", url, models)
        record("models", models, STAGE_UNHEALTHY, problem)
    elif model and model not in served:
        record("models", models, STAGE_MODEL_MISSING, "GET %s: expected model %r is not served; served: %s" % (
            url, model, ", ".join(served) if served else "none"))
    elif not served:
        record("models", models, STAGE_MODEL_MISSING, "GET %s: the server serves no model" % url)
    else:
        record("models", models)
    report["served_models"] = served or []

    # The version is information, not health: a failure here fails nothing.
    url = base + "/version"
    version = send("GET", url, None)
    version_document = _json_body(version) if version["status"] == 200 else None
    if isinstance(version_document, dict) and version_document.get("version"):
        report["vllm_version"] = to_text(version_document["version"])
        probes["version"] = _probe_record(version, True)
    else:
        probes["version"] = _probe_record(version, False, _describe_failure("GET", url, version))

    if model:
        # Generating with a model the server does not list would only repeat model_missing.
        generation_model = model if served is None or model in served else None
    else:
        generation_model = served[0] if served else None
    if generation and generation_model:
        path, body = generation_request(generation_api, generation_model, prompt, max_tokens)
        url = base + path
        answer = send("POST", url, body)
        report["time_to_first_token_s"] = answer["latency_s"]
        text = generated_text_of(generation_api, _json_body(answer)) if answer["status"] == 200 else None
        if text is None:
            if answer["status"] == 200:
                problem = "POST %s answered 200 without a generated choice: %s" % (
                    url, server_error_text(answer["body"]))
            else:
                problem = _describe_failure("POST", url, answer)
            record("generation", answer, STAGE_GENERATION_FAILED, problem)
        else:
            report["generated_text"] = text
            record("generation", answer)

    if metrics:
        url = base + "/metrics"
        exposition = send("GET", url, None)
        ok = exposition["status"] == 200
        probes["metrics"] = _probe_record(exposition, ok, None if ok else _describe_failure("GET", url, exposition))

    return _finish(report, problems)


def _served_models(exchange):
    document = _json_body(exchange) if exchange["status"] == 200 else None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        return None
    return [entry.get("id") for entry in document["data"] if isinstance(entry, dict) and entry.get("id")]


def _finish(report, problems):
    report["healthy"] = not problems
    report["error"] = "; then ".join(problems) if problems else None
    return report


def exited_report(reason):
    """The report for a server whose container is no longer running: no probe can help."""
    report = new_report()
    report["failed_stage"] = "server_exited"
    report["error"] = reason
    return report


def last_error_line(log_text, limit=_ERROR_TEXT_LIMIT):
    """The line of a server's log that most likely names the cause of a crash, trimmed; None when there is none."""
    return _node.cause_line(log_text, limit)


def failure_message(report, base_url, wait=None):
    """One line for fail_json."""
    text = "vLLM at %s" % base_url
    if wait and wait.get("waited"):
        text += " not healthy after %.1fs (%d polls)" % (wait["elapsed"], wait["polls"])
    return "%s: stage %s: %s" % (text, report["failed_stage"], report["error"])


# The stages of a vLLM server's start, in order, with the log line that says each has begun (vLLM's own words;
# the V1 engine prints them from the API server and the engine core processes alike). The last one seen wins.
# The compile lines: vLLM's compilation backend names its cache folder and the Dynamo transform once Dynamo has traced
# the model, says which graph it caches (then compiles the graph's pieces, silently) and what that took, or that it
# loaded them from its cache; torch.compile's total ends the phase ("takes" up to 0.2x, "took" in later releases).
_LOAD_STAGES = (
    ("engine start", re.compile(r"Initializing a V1 LLM engine|Waiting for init message|vLLM API server version")),
    ("weights", re.compile(r"Starting to load model|Loading model from scratch|Loading safetensors checkpoint shards")),
    ("weights loaded", re.compile(r"Loading weights took|Model loading took")),
    ("compiling", re.compile(r"torch\.compile (?:takes|took) [\d.]+ s in total|for vLLM's torch\.compile"
                             r"|Compiling a graph for|Dynamo bytecode transform time|Cache the graph (?:of|for)"
                             r"|Directly load the compiled graph")),
    ("memory profiling", re.compile(r"Memory profiling takes|Available KV cache memory|KV cache size"
                                    r"|Profiling CUDA graph memory")),
    ("graph capture", re.compile(r"Capturing CUDA graph|Graph capturing finished")),
    ("warmup done", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("API server starting", re.compile(r"Starting vLLM API server|Starting vLLM server on|Available routes are")),
    ("ready", re.compile(r"Application startup complete")),
)
_SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)")
_LOAD_ORDER = dict((stage, index) for index, (stage, _pattern) in enumerate(_LOAD_STAGES))
_LOAD_ORDER["starting"] = -1

# The stages in which vLLM compiles: torch.compile (Dynamo, then Inductor's kernels) and the CUDA graphs it captures,
# which a first start on a node (no compile cache yet) spends the longest in without a new line.
COMPILE_STAGES = ("compiling", "graph capture")

# What vLLM says it compiles or captures, each as (its line, the words of the progress line); no colon in the words,
# so that a message that quotes them stays one "stage S: ..." clause.
_COMPILE_WORDS = (
    (re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile"), "torch.compile, cache %s"),
    (re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"), "torch.compile, Dynamo transform took %s s"),
    (re.compile(r"Cache the graph (?:of|for) (.+?) for later use"), "torch.compile, compiling the graph for %s"),
    (re.compile(r"Compiling a graph for (.+?) takes ([\d.]+) s"), "torch.compile, compiled the graph for %s in %s s"),
    (re.compile(r"Directly load the compiled graph\(?s?\)? for (.+?) from the cache, took ([\d.]+) s"),
     "torch.compile, loaded the graphs for %s from the cache in %s s"),
    (re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"), "torch.compile took %s s in total"),
    (re.compile(r"Capturing CUDA graph(?:s| shapes)(?: \(([^)]*)\))?:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)"), None),
    (re.compile(r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB"), "CUDA graphs captured in %s s, %s GiB"),
)


def _compile_words(line):
    """What a compile or capture line of vLLM's says, in the progress line's words; None for another line."""
    for pattern, words in _COMPILE_WORDS:
        found = pattern.search(line)
        if found is None:
            continue
        if words is None:
            kind, done, total = found.groups()
            return "capturing CUDA graphs%s, %s of %s" % (" (%s)" % kind if kind else "", done, total)
        return words % found.groups()
    return None


def load_progress(log_text):
    """Where a starting server is, read from its log: {'stage', 'detail', 'shards_done', 'shards_total',
    'lines'}; stage 'starting' before any known line. 'detail' is the line that set the stage (or the latest shard
    count, or what vLLM compiles or captures), trimmed; 'lines' counts the log's lines, so that a caller can tell a log
    that grows from one that stalls."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log_text or "")
    # tqdm redraws a bar with carriage returns: each redraw counts as a line of its own.
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    found = {"stage": "starting", "detail": None, "shards_done": None, "shards_total": None, "lines": len(lines)}
    for line in lines:
        for stage, pattern in _LOAD_STAGES:
            if pattern.search(line) and _LOAD_ORDER[stage] >= _LOAD_ORDER.get(found["stage"], -1):
                found["stage"], found["detail"] = stage, line[:200]
                if stage in COMPILE_STAGES:
                    found["detail"] = (_compile_words(line) or line)[:200]
        shards = _SHARDS.search(line)
        if shards:
            found["shards_done"], found["shards_total"] = int(shards.group(2)), int(shards.group(3))
    if found["stage"] == "weights" and found["shards_total"]:
        found["detail"] = "shard %s of %s" % (found["shards_done"], found["shards_total"])
    return found


def load_words(load):
    """The stage of a start as the progress line and the stall message say it: the weights with their shard count,
    a compile phase as 'compiling (what vLLM says it compiles or captures)', any other stage by its name."""
    if not load:
        return None
    stage, detail = load.get("stage"), load.get("detail")
    if stage == "weights" and detail:
        return "weights (%s)" % detail
    if stage in COMPILE_STAGES:
        return "compiling (%s)" % (detail or stage)
    return stage


def stall_limit(stage, first_start, stall_timeout, first_start_stall_timeout):
    """Which stall limit judges a start now: {'seconds', 'option'}, option being the module option it came from.

    A first start of the image on this node (no compile cache yet) gets first_start_stall_timeout while vLLM compiles
    or captures graphs, when that is the longer one; every other stage, and every later start, gets stall_timeout.
    A stall_timeout of 0 judges no stall at all."""
    stall_timeout = float(stall_timeout or 0)
    first_start_stall_timeout = float(first_start_stall_timeout or 0)
    if stall_timeout <= 0:
        return {"seconds": 0.0, "option": "stall_timeout"}
    if first_start and stage in COMPILE_STAGES and first_start_stall_timeout > stall_timeout:
        return {"seconds": first_start_stall_timeout, "option": "first_start_stall_timeout"}
    return {"seconds": stall_timeout, "option": "stall_timeout"}


def proven_images(text):
    """The image IDs a proven-images file lists (one per line; '#' starts a comment)."""
    images = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and line not in images:
            images.append(line)
    return images


def proven_images_text(images):
    """A proven-images file listing images, in their order."""
    return "# Images whose vLLM server answered a real completion on this node (gpulab.vllm.vllm_health)\n" + "".join(
        "%s\n" % image for image in images)
