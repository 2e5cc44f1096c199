# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weights copy against a raw stream on one machine with cores to spare (no Docker, no lab): what the copy's own
code reaches when the CPU does not bound it. Loopback, the weights role's own server and the module's own copier.

    copy_vs_raw.py OUT.json [--shards 8] [--shard-mb 512] [--runs 3]

Prints and writes one JSON object: the machine's cores, sha256 speed on one core, the raw stream (one connection
and four at once, read into nothing) and the copy with its proof at 1, 2, 4 and 8 streams, medians of --runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collection_path(base: Path) -> Path:
    """A folder in which `ansible_collections.gpulab.vllm` is this tree (the module's code imports itself that way)."""
    link = base / "ansible_collections" / "gpulab" / "vllm"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(ROOT)
    return base


def raw_get(port: int, name: str, token: str) -> int:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(("GET /%s HTTP/1.0\r\nAuthorization: Bearer %s\r\n\r\n" % (name, token)).encode())
    total, buf = 0, bytearray(4 << 20)
    while True:
        count = sock.recv_into(buf)
        if not count:
            break
        total += count
    sock.close()
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mb", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpulab-copy-"))
    sys.path.insert(0, str(collection_path(work / "collections")))
    from ansible_collections.gpulab.vllm.plugins.module_utils import _weights_fetch  # noqa: E402 pylint: disable=import-outside-toplevel

    source, token = work / "src", "bench-token-%d" % os.getpid()
    source.mkdir()
    (work / "token").write_text(token)
    files = {}
    for index in range(args.shards):
        name = "model-%05d-of-%05d.safetensors" % (index + 1, args.shards)
        digest = hashlib.sha256()
        with open(source / name, "wb") as out:
            for unused in range(args.shard_mb // 4):
                block = os.urandom(4 << 20)
                out.write(block)
                digest.update(block)
        files[name] = {"size": (source / name).stat().st_size, "sha256": digest.hexdigest()}
    total_mb = sum(entry["size"] for entry in files.values()) / 1048576
    sample = os.urandom(256 << 20)
    started = time.monotonic()
    hashlib.sha256(sample).hexdigest()
    sha_mb_s = 256 / (time.monotonic() - started)
    port = 18600 + os.getpid() % 1000
    server = subprocess.Popen([sys.executable, str(ROOT / "roles" / "weights" / "files" / "weights_server.py"), "--bind", "127.0.0.1",
                               "--port", str(port), "--root", str(source), "--token-file", str(work / "token"),
                               "--pid-file", str(work / "pid"), "--idle", "600"], stderr=subprocess.DEVNULL)
    try:
        for unused in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        for name in files:  # the page cache holds the source, as on the lab's node
            raw_get(port, name, token)
        result = {"cpus": os.cpu_count(), "model_mb": round(total_mb), "sha256_one_core_mb_s": round(sha_mb_s), "raw": {}, "copy": {}}
        for streams in (1, 4):
            times = []
            for unused in range(args.runs):
                names = list(files)
                started = time.monotonic()
                threads = [threading.Thread(target=lambda part: [raw_get(port, n, token) for n in part], args=(names[i::streams],))
                           for i in range(streams)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                times.append(time.monotonic() - started)
            result["raw"][str(streams)] = round(total_mb / statistics.median(times))
        for streams in (1, 2, 4, 8):
            times = []
            for unused in range(args.runs):
                dest = work / "dst"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                started = time.monotonic()
                copier = _weights_fetch.Copier(str(dest), "http://127.0.0.1:%d" % port, token, files, streams=streams).run()
                times.append(time.monotonic() - started)
                if copier.errors or copier.left:
                    raise SystemExit("the copy failed: %s" % copier.errors)
            result["copy"][str(streams)] = round(total_mb / statistics.median(times))
        result["copy_over_raw_one_stream"] = round(max(result["copy"].values()) / result["raw"]["1"], 2)
    finally:
        server.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
