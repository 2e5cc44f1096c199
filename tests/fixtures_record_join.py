"""Record what a node's Docker Engine answers while a Ray worker joins (or fails to): tests/unit/fixtures/join.

    .venv/bin/python tests/fixtures_record_join.py NAME --docker-host unix:///run/gpulab-lab/node2/run/docker.sock \
        --container gpulab-ray-worker --situation "..." [--timeout 60]

Start (or restart) the worker's container right before: this follows its log from its last start exactly as
gpulab.vllm.ray_join_wait asks for it (GET /containers/NAME/logs?follow=1&stdout=1&stderr=1&since=..., HTTP/1.0),
keeps every byte of the answer as it came (the status line, the headers, then each read with its time from the
first), until Ray's "Ray runtime started" or the stream's end, then `docker inspect` again. The container's
environment values are dropped from the inspect documents and the lab's folders in them written as a real node's
(tests/fixtures_record.py's scrub_paths); nothing else is changed.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import socket
import sys
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "collections"))

from ansible_collections.gpulab.vllm.plugins.module_utils import _node, _ray_join  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from fixtures_record import scrub_paths  # noqa: E402  pylint: disable=wrong-import-position


def inspect(host: str, name: str) -> dict:
    status, doc = _node.docker_get(host, "/containers/%s/json" % quote(name, safe=""), 30)
    if status != 200:
        raise SystemExit("inspect %s: HTTP %s" % (name, status))
    (doc.get("Config") or {})["Env"] = []
    # The lab's node folders as a real node's (the roles' default folder, Docker's data root).
    return json.loads(scrub_paths(json.dumps(doc)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--docker-host", required=True)
    parser.add_argument("--container", required=True)
    parser.add_argument("--situation", required=True)
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)
    before = inspect(args.docker_host, args.container)
    since = _ray_join.since_of(before["State"]["StartedAt"])
    path = "/containers/%s/logs?follow=1&stdout=1&stderr=1%s" % (quote(args.container, safe=""), "&since=" + since if since else "")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(args.docker_host[len("unix://"):])
    sock.sendall(("GET %s HTTP/1.0\r\nHost: docker\r\n\r\n" % path).encode())
    started, reads, frames, raw, ended = time.monotonic(), [], _node.LogFrames(bool(before["Config"].get("Tty"))), b"", False
    while time.monotonic() - started < args.timeout:
        sock.settimeout(max(0.1, args.timeout - (time.monotonic() - started)))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            break
        if not data:
            ended = True
            break
        reads.append({"at_s": round(time.monotonic() - started, 3), "bytes": base64.b64encode(data).decode()})
        raw += data
        if b"\r\n\r\n" in raw:
            frames = _node.LogFrames(bool(before["Config"].get("Tty")))
            frames.feed(raw.split(b"\r\n\r\n", 1)[1])
            if _ray_join.STARTED in frames.text:
                break
    sock.close()
    record = {"name": args.name, "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "situation": args.situation, "request": path, "inspect_before": before, "reads": reads,
              "stream_ended": ended, "inspect_after": inspect(args.docker_host, args.container)}
    target = ROOT / "tests" / "unit" / "fixtures" / "join" / (args.name + ".json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1) + "\n")
    after = record["inspect_after"]["State"]["Status"]
    print("%s: %d reads, %d bytes, ended=%s, state after: %s" % (target, len(reads), len(raw), ended, after))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
