# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory guard of a unified-memory node (a DGX Spark's GB10) while the model loads.

On such a node the GPU's memory is the host's: a load that takes more than the node has does not fail with a CUDA
error, it runs the host out of memory, and the kernel's OOM killer (or a reboot) ends it, with sshd and Docker in the
way. The deploy starts this watch on each unified-memory node just before the server starts, in the background:

    watch  --state DIR --drop-gib 8 --stop-gib 3 --seconds 1900 --containers gpulab-vllm gpulab-ray-worker

It reads MemAvailable twice a second. It acts only while a rank of the model runs on the node (a process whose
title starts with one of --ranks: vLLM's Ray worker actors, `ray::RayWorkerWrapper` or `ray::RayWorkerProc` by
version); before that the deploy's preflight has already held the server's share to what the node has. Under the drop
floor it writes back dirty pages and drops the clean page cache once (vm.drop_caches=1: the cache a weight copy left
counts against a GB10's load). Under the stop floor, once the cache is dropped, it kills the node's server and Ray
containers: the rank dies, the engine fails at once, the load ends while the node still answers, and the deploy
names memory as the cause. `finish` ends the watch and prints what it saw (DIR/verdict.json), the
lowest MemAvailable, any drop and any stop, as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1024 ** 3


def mem_available(text: str):
    """MemAvailable in bytes from /proc/meminfo's text, None where the kernel gives none."""
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            try:
                return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
            except (IndexError, ValueError):
                return None
    return None


def decide(available, drop_at: float, stop_at: float, dropped: bool) -> str:
    """'drop', 'stop' or '' for one reading: the cache is dropped once before anything is stopped."""
    if available is None:
        return ""
    if available < drop_at and not dropped:
        return "drop"
    if available < stop_at and dropped:
        return "stop"
    return ""


def rank_running(proc: str, prefixes) -> bool:
    """Whether a process whose title (its command line) starts with one of prefixes runs (under proc, /proc)."""
    wanted = tuple(prefix.encode() for prefix in prefixes)
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as handle:
                title = handle.read(256)
        except OSError:
            continue
        if title.startswith(wanted):
            return True
    return False


def _read(path: str):
    try:
        with open(path) as handle:
            return mem_available(handle.read())
    except OSError:
        return None


def _write(path: str, verdict: dict) -> None:
    partial = path + ".partial"
    with open(partial, "w") as handle:
        json.dump(verdict, handle)
    os.replace(partial, path)


def watch(args) -> int:
    os.makedirs(args.state, mode=0o700, exist_ok=True)
    stop_file = os.path.join(args.state, "finish")
    verdict_file = os.path.join(args.state, "verdict.json")
    if os.path.exists(stop_file):
        os.unlink(stop_file)
    drop_at, stop_at = args.drop_gib * GIB, args.stop_gib * GIB
    verdict = {"drop_bytes": int(drop_at), "stop_bytes": int(stop_at), "lowest_bytes": None, "dropped": None,
               "stopped": None, "armed": None, "started": time.time(), "ended": None}
    _write(verdict_file, verdict)
    deadline = time.monotonic() + args.seconds
    reason = "deadline"
    while time.monotonic() < deadline:
        if os.path.exists(stop_file):
            reason = "finished"
            break
        if verdict["armed"] is None:
            if not rank_running(args.proc, args.ranks):
                time.sleep(args.interval)
                continue
            verdict["armed"] = time.time()
        available = _read(args.meminfo)
        if available is not None and (verdict["lowest_bytes"] is None or available < verdict["lowest_bytes"]):
            verdict["lowest_bytes"] = available
        action = decide(available, drop_at, stop_at, verdict["dropped"] is not None)
        if action == "drop":
            try:
                subprocess.run(["sync"], check=False)
            except OSError:
                pass
            try:
                with open(args.drop_caches, "w") as handle:
                    handle.write("1\n")
                done = ""
            except OSError as exc:
                done = str(exc.strerror or exc)
            verdict["dropped"] = {"at": time.time(), "before_bytes": available, "after_bytes": _read(args.meminfo),
                                  "error": done}
            _write(verdict_file, verdict)
        elif action == "stop":
            killed = []
            for name in args.containers:
                try:
                    if subprocess.run(["docker", "kill", name], capture_output=True, check=False).returncode == 0:
                        killed.append(name)
                except OSError:
                    pass  # no docker command: nothing of ours runs here to kill
            verdict["stopped"] = {"at": time.time(), "available_bytes": available, "containers": killed}
            reason = "stopped"
            break
        time.sleep(args.interval)
    verdict["ended"] = reason
    _write(verdict_file, verdict)
    return 0


def finish(args) -> int:
    """End the watch (it ends within one reading) and print its verdict, which stays for a later look (the next watch
    starts a new one)."""
    verdict_file = os.path.join(args.state, "verdict.json")
    if not os.path.exists(verdict_file):
        print(json.dumps({"ended": None, "missing": True}))
        return 0
    with open(os.path.join(args.state, "finish"), "w") as handle:
        handle.write("finish\n")
    verdict = {}
    for unused in range(int(args.wait / 0.1) + 1):
        with open(verdict_file) as handle:
            verdict = json.load(handle)
        if verdict.get("ended"):
            break
        time.sleep(0.1)
    print(json.dumps(verdict))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab_memory_guard")
    parser.add_argument("mode", choices=["watch", "finish"])
    parser.add_argument("--state", required=True)
    parser.add_argument("--drop-gib", type=float, default=8.0)
    parser.add_argument("--stop-gib", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=1900.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--wait", type=float, default=3.0)
    parser.add_argument("--containers", nargs="*", default=[])
    parser.add_argument("--ranks", nargs="*", default=["ray::RayWorker"])
    parser.add_argument("--proc", default="/proc")
    parser.add_argument("--meminfo", default="/proc/meminfo")
    parser.add_argument("--drop-caches", default="/proc/sys/vm/drop_caches")
    args = parser.parse_args(argv)
    return watch(args) if args.mode == "watch" else finish(args)


if __name__ == "__main__":
    sys.exit(main())
