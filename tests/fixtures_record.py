"""Record the unit-test fixtures of gpulab.vllm from the running lab.

This is how every file under tests/unit/fixtures/ray and tests/unit/fixtures/vllm
was made; nothing there is written by hand. It needs the lab (make lab-up) and
the containers of the situation being recorded (see tests/unit/fixtures/README.md).

  ray NAME --docker-host unix:///run/gpulab-lab/node1/run/docker.sock --container fixture-ray-head
      runs the module's own GCS reader (and `ray status` beside it, for
      cross-checks) in the Ray head container; also records docker's error when
      the container is missing or stopped.
  vllm NAME --base-url http://10.210.0.11:8001 [--model tiny]
      sends the requests vllm_health sends and stores each raw exchange.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "collections"))

from ansible_collections.gpulab.vllm.plugins.module_utils import _ray_state  # noqa: E402

FIXTURES = REPO / "tests" / "unit" / "fixtures"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run(argv: list[str], timeout: float = 60) -> dict:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "elapsed_s": round(time.monotonic() - started, 4)}


def record_ray(args: argparse.Namespace) -> dict:
    docker = ["docker", "-H", args.docker_host]
    reader = _ray_state.reader_argv("python3", args.gcs_address, 5.0, docker_cli="docker", container=args.container)
    # reader_argv starts with the docker CLI name; point it at the node's daemon.
    exec_env = [item for pair in args.exec_env for item in ("-e", pair)]
    reader_run = run(docker + reader[1:2] + exec_env + reader[2:])
    status_run = run(docker + ["exec", args.container, "ray", "status"]) if args.ray_status else None
    return {
        "kind": "ray",
        "name": args.name,
        "recorded_at": now(),
        "situation": args.situation,
        "command": "docker exec %s%s python3 -c <GCS_READER_SCRIPT> %s 5" % (
            "".join("-e %s " % pair for pair in args.exec_env), args.container, args.gcs_address),
        "reader_run": reader_run,
        "ray_status_run": status_run,
    }


def exchange(method: str, url: str, body: dict | None, api_key: str | None, timeout: float) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    started = time.monotonic()
    record = {"method": method, "url": url, "request_body": body}
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            record.update(status=response.status, content_type=response.headers.get("Content-Type"),
                          body=response.read().decode("utf-8", "replace"), error=None)
    except urllib.error.HTTPError as exc:
        record.update(status=exc.code, content_type=exc.headers.get("Content-Type"),
                      body=exc.read().decode("utf-8", "replace"), error=None)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        record.update(status=None, content_type=None, body=None,
                      error="%s: %s" % (type(reason).__name__, reason))
    record["latency_s"] = round(time.monotonic() - started, 4)
    return record


def record_vllm(args: argparse.Namespace) -> dict:
    base = args.base_url.rstrip("/")
    model = args.model
    exchanges = [
        exchange("GET", base + "/health", None, args.api_key, 10),
        exchange("GET", base + "/v1/models", None, args.api_key, 10),
        exchange("GET", base + "/version", None, args.api_key, 10),
        exchange("POST", base + "/v1/completions",
                 {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}, args.api_key, 60),
        exchange("POST", base + "/v1/chat/completions",
                 {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                  "temperature": 0}, args.api_key, 60),
        exchange("GET", base + "/metrics", None, args.api_key, 10),
    ]
    if args.metrics_head is not None:
        for item in exchanges:
            if item["url"].endswith("/metrics") and item["body"]:
                # The full exposition is ~100 KB; keep the head, which is real and enough.
                item["body"] = "\n".join(item["body"].splitlines()[: args.metrics_head]) + "\n"
                item["truncated_to_lines"] = args.metrics_head
    return {
        "kind": "vllm",
        "name": args.name,
        "recorded_at": now(),
        "situation": args.situation,
        "base_url": base,
        "model": model,
        "api_key_used": bool(args.api_key),
        "exchanges": exchanges,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    ray = sub.add_parser("ray")
    ray.add_argument("name")
    ray.add_argument("--docker-host", required=True)
    ray.add_argument("--container", required=True)
    ray.add_argument("--gcs-address", default="auto")
    ray.add_argument("--situation", required=True, help="what the lab looked like, in words")
    ray.add_argument("--no-ray-status", dest="ray_status", action="store_false")
    ray.add_argument("--exec-env", action="append", default=[], metavar="KEY=VALUE",
                     help="environment of the reader's docker exec, e.g. to take a token away")
    vllm = sub.add_parser("vllm")
    vllm.add_argument("name")
    vllm.add_argument("--base-url", required=True)
    vllm.add_argument("--model", default="tiny")
    vllm.add_argument("--api-key")
    vllm.add_argument("--metrics-head", type=int, default=60)
    vllm.add_argument("--situation", required=True)
    args = parser.parse_args(argv)
    record = record_ray(args) if args.kind == "ray" else record_vllm(args)
    target = FIXTURES / args.kind / (args.name + ".json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print("recorded %s" % target.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
