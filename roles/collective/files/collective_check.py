"""Prove that the fabric carries the model's collectives, before a model load that takes minutes.

One all-reduce across every GPU of the Ray cluster, placed as vLLM places its ranks (a placement group of one GPU
per rank, the driver's node first), in the serving image, each rank with its own node's environment; then each
node's link to the head, one node at a time, so that a slow node is named. With GPUs it runs NCCL and reads, from
NCCL's own log, which network each rank took (IB, Socket) and on which devices; without GPUs (the lab) Gloo over TCP.

Prints one JSON line. Runs inside the Ray head container (standard library, Ray and PyTorch):
    python3 - --world N [--size-mb M] [--iterations K] [--timeout S] < collective_check.py
Without Ray, --local N runs N processes on this host (a probe of one machine).
"""

import argparse
import datetime
import glob
import hashlib
import json
import os
import re
import socket
import sys
import time

NCCL_LOG_DIR = "/tmp/gpulab-collective"


def parse_nccl_log(text):
    """What NCCL says it chose, from its INFO lines: the network plugin ('IB', 'Socket', ...), the devices that
    plugin uses (as NCCL names them: 'mlx5_0:1/IB', 'eth0:10.0.0.1<0>') and the transports of its channels
    ('NET/IB', 'NET/Socket', 'P2P', 'SHM')."""
    network = None
    version = None
    devices = {}
    transports = set()
    for line in text.splitlines():
        found = re.search(r"NCCL version (\S+)", line)
        if found:
            version = found.group(1)
        found = re.search(r"NCCL INFO Using network (\S+)", line)
        if found:
            network = found.group(1)
        found = re.search(r"NCCL INFO NET/(\w+) ?: Using (.*)$", line)
        if found:
            listed = re.findall(r"\[\d+\](\S+?)(?=\s|;|$)", found.group(2))
            if listed:
                devices[found.group(1)] = listed
        found = re.search(r"via (NET/\w+|P2P|SHM|CollNet\w*)", line)
        if found:
            transports.add(found.group(1))
    return {"network": network, "devices": devices.get(network, []), "transports": sorted(transports),
            "version": version}


# NCCL's core library, not its plugins (libnccl-net.so, libnccl-tuner.so, ...).
NCCL_LIBRARY = re.compile(r"/libnccl\.so(\.\d+)*$")
# Where NCCL reads settings besides its environment: NCCL_CONF_FILE, else ~/.nccl.conf, then /etc/nccl.conf.
NCCL_CONF_FILES = ("~/.nccl.conf", "/etc/nccl.conf")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def nccl_version_text(torch):
    """The NCCL version PyTorch runs (a tuple in recent PyTorch, a number such as 2708 in older ones), or None."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a report, never a reason to fail the collective
        return None
    return ".".join(str(part) for part in version) if isinstance(version, (tuple, list)) else str(version)


def loaded_nccl(maps_text, version=None):
    """The NCCL this process loaded, from /proc/self/maps: {'path', 'version', 'sha256'}, path None when no libnccl
    is mapped (NCCL linked into PyTorch itself, or not loaded)."""
    paths = sorted({line.split(None, 5)[5].strip() for line in maps_text.splitlines()
                    if len(line.split(None, 5)) == 6 and NCCL_LIBRARY.search(line.split(None, 5)[5].strip())})
    found = {"path": None, "version": version, "sha256": None}
    if paths:
        found["path"] = paths[0] if len(paths) == 1 else ", ".join(paths)
        try:
            found["sha256"] = ":".join(_sha256(path) for path in paths)
        except OSError as exc:
            found["sha256"] = "unreadable (%s)" % exc.strerror
    return found


def nccl_settings(environ):
    """What the rank inherited that changes NCCL: its NCCL_* variables and the configuration files NCCL reads."""
    if environ.get("NCCL_CONF_FILE"):
        files = [environ["NCCL_CONF_FILE"]]
    else:
        files = [os.path.expanduser(path) for path in NCCL_CONF_FILES]
    conf = {}
    for path in files:
        try:
            with open(path) as handle:
                conf[path] = [line.strip() for line in handle if line.strip() and not line.lstrip().startswith("#")]
        except OSError:
            continue
    return {"env": {key: value for key, value in sorted(environ.items()) if key.startswith("NCCL_")}, "conf": conf}


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rank(rank, world, init_method, backend, size_bytes, iterations, peers, timeout_s):
    """One rank: the all-reduce, then, for each peer in peers, a ping-pong between rank 0 and that peer."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    joined = time.perf_counter() - started
    elements = max(1, size_bytes // 4)
    tensor = torch.ones(elements, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # warm-up: connections and buffers
    _sync(torch, device)
    started = time.perf_counter()
    for unused in range(iterations):
        dist.all_reduce(tensor)
    _sync(torch, device)
    seconds = time.perf_counter() - started
    algbw = elements * 4 * iterations / seconds
    result = {
        "rank": rank,
        "join_s": round(joined, 3),
        "allreduce_s": round(seconds / iterations, 6),
        # nccl-tests' bus bandwidth: what each link carries in a ring all-reduce.
        "busbw_gbps": round(algbw * 2 * (world - 1) / world * 8 / 1e9, 3),
        "links_gbps": {},
    }
    if backend == "nccl":
        result["torch_nccl"] = nccl_version_text(torch)
    for peer in peers:
        if rank in (0, peer):
            other = peer if rank == 0 else 0
            for round_ in range(iterations + 1):
                if round_ == 1:
                    _sync(torch, device)
                    started = time.perf_counter()
                if rank == 0:
                    dist.send(tensor, other)
                    dist.recv(tensor, other)
                else:
                    dist.recv(tensor, other)
                    dist.send(tensor, other)
            _sync(torch, device)
            seconds = time.perf_counter() - started
            result["links_gbps"][str(peer)] = round(2 * elements * 4 * iterations / seconds * 8 / 1e9, 3)
        dist.barrier()
    dist.destroy_process_group()
    return result


def free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def rank_environment(rank):
    """NCCL writes its INFO lines to a file of this rank's, read back after the run; nothing else changes."""
    os.makedirs(NCCL_LOG_DIR, exist_ok=True)
    path = os.path.join(NCCL_LOG_DIR, "rank%d.%d.log" % (rank, os.getpid()))
    os.environ.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": path})
    return path


def finish_rank(result, log_path, backend, keep_logs=None, inherited=None):
    if backend == "nccl":
        try:
            with open(log_path) as handle:
                text = handle.read()
        except OSError:
            text = ""
        result["nccl"] = parse_nccl_log(text)
        try:
            with open("/proc/self/maps") as handle:
                maps = handle.read()
        except OSError:
            maps = ""
        result["nccl"]["library"] = loaded_nccl(maps, result["nccl"]["version"] or result.get("torch_nccl"))
        result["nccl"]["inherited"] = inherited or {"env": {}, "conf": {}}
        if keep_logs:
            with open(os.path.join(keep_logs, "nccl_rank%d.log" % result["rank"]), "w") as handle:
                handle.write(text)
        for path in glob.glob(log_path + "*"):
            os.unlink(path)
    else:
        result["gloo_ifname"] = os.environ.get("GLOO_SOCKET_IFNAME")
    return result


class Rank:
    """A Ray actor holding one GPU of the placement group."""

    def describe(self):
        import torch

        ip = os.environ.get("VLLM_HOST_IP") or socket.gethostbyname(socket.gethostname())
        return {"ip": ip, "host": socket.gethostname(), "cuda": bool(torch.cuda.is_available()),
                "port": free_port(ip)}

    def run(self, rank, world, init_method, backend, size_bytes, iterations, peers, timeout_s):
        inherited = nccl_settings(os.environ)
        log_path = rank_environment(rank) if backend == "nccl" else None
        result = run_rank(rank, world, init_method, backend, size_bytes, iterations, peers, timeout_s)
        return finish_rank(result, log_path, backend, inherited=inherited)


def order_ranks(infos, head_ip):
    """vLLM's order: the driver's node first, then by node address; a node's ranks together."""
    return sorted(range(len(infos)), key=lambda index: (infos[index]["ip"] != head_ip, infos[index]["ip"], index))


def summarize(backend, world, size_bytes, iterations, infos, results, started):
    nodes = {}
    for info, result in zip(infos, results):
        node = nodes.setdefault(info["ip"], {"ip": info["ip"], "ranks": [], "network": None, "devices": [],
                                             "transports": [], "link_gbps": None})
        node["ranks"].append(result["rank"])
        if backend == "nccl":
            node["network"] = result["nccl"]["network"] or node["network"]
            node["devices"] = sorted(set(node["devices"]) | set(result["nccl"]["devices"]))
            node["transports"] = sorted(set(node["transports"]) | set(result["nccl"]["transports"]))
        else:
            node["network"] = "TCP"
            node["devices"] = [result.get("gloo_ifname") or "default"]
    links = results[0]["links_gbps"] if results else {}
    for info, result in zip(infos, results):
        if str(result["rank"]) in links:
            nodes[info["ip"]]["link_gbps"] = links[str(result["rank"])]
    return {
        "backend": backend,
        "world": world,
        "size_bytes": size_bytes,
        "iterations": iterations,
        "busbw_gbps": min(result["busbw_gbps"] for result in results) if results else None,
        "allreduce_s": max(result["allreduce_s"] for result in results) if results else None,
        "join_s": max(result["join_s"] for result in results) if results else None,
        "nodes": sorted(nodes.values(), key=lambda node: min(node["ranks"])),
        # Each rank's NCCL build and what it inherited: one build everywhere, or the collective fails naming both.
        "nccl_ranks": [dict(result["nccl"].get("library") or {}, rank=result["rank"], ip=info["ip"],
                            inherited=result["nccl"].get("inherited") or {"env": {}, "conf": {}})
                       for info, result in zip(infos, results)] if backend == "nccl" else [],
        "elapsed_s": round(time.perf_counter() - started, 2),
        "error": None,
    }


def run_ray(args, started):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False, configure_logging=False)
    head_ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
    bundles = [{"GPU": 1.0} for unused in range(args.world)]
    bundles[0]["node:" + head_ip] = 0.001
    group = placement_group(bundles, strategy="PACK")
    try:
        ready, unused = ray.wait([group.ready()], timeout=args.timeout)
        if not ready:
            # A node that passed the gate and then left: it registered, and the head lost its raylet.
            nodes = ray.nodes()
            alive = {node["NodeManagerAddress"] for node in nodes if node.get("Alive")}
            left = sorted({node["NodeManagerAddress"] for node in nodes if not node.get("Alive")} - alive)
            return {"error": "the placement group of %d GPUs (one per rank, as vLLM asks) was not ready within %d s; "
                             "Ray has %s GPU(s)%s" % (args.world, args.timeout, ray.cluster_resources().get("GPU", 0),
                                                      "; joined and then left Ray: %s" % ", ".join(left) if left else ""),
                    "late_nodes": left}
        actor = ray.remote(num_cpus=0, num_gpus=1)(Rank)
        actors = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index)).remote() for index in range(args.world)]
        describes = [item.describe.remote() for item in actors]
        unused, pending = ray.wait(describes, num_returns=len(describes), timeout=args.timeout)
        if pending:
            # A rank that never started: its node joined Ray, but the head cannot use it (its raylet unreachable).
            placed = ray.util.placement_group_table(group).get("bundles_to_node_id") or {}
            addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
            late = sorted({addresses.get(placed.get(describes.index(ref)), "an unknown node") for ref in pending})
            return {"error": "rank(s) placed on %s did not start within %d s, though the node is in Ray: the head's Ray "
                             "cannot reach that node's raylet (its node and object manager ports on the fabric)"
                             % (", ".join(late), args.timeout), "late_nodes": late}
        infos = ray.get(describes)
        order = order_ranks(infos, head_ip)
        actors = [actors[index] for index in order]
        infos = [infos[index] for index in order]
        backend = "nccl" if all(info["cuda"] for info in infos) else "gloo"
        init_method = "tcp://%s:%d" % (infos[0]["ip"], infos[0]["port"])
        first_of_node = {}
        for rank, info in enumerate(infos):
            first_of_node.setdefault(info["ip"], rank)
        peers = sorted(rank for ip, rank in first_of_node.items() if ip != infos[0]["ip"])
        refs = [item.run.remote(rank, args.world, init_method, backend, args.size_mb * 2 ** 20, args.iterations,
                                peers, args.timeout) for rank, item in enumerate(actors)]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=args.timeout + 30)
        if pending:
            late = sorted({infos[refs.index(ref)]["ip"] for ref in pending})
            return {"error": "rank(s) on %s did not finish the collective within %d s" % (", ".join(late), args.timeout),
                    "late_nodes": late, "backend": backend}
        try:
            results = ray.get(refs)
        except Exception as exc:  # noqa: BLE001 - a rank's own error is the finding
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            return {"error": "the collective failed: %s" % (lines[-1] if lines else type(exc).__name__), "backend": backend}
        return summarize(backend, args.world, args.size_mb * 2 ** 20, args.iterations, infos, results, started)
    finally:
        remove_placement_group(group)


def _local_rank(rank, args, init_method, backend, peers, queue):
    inherited = nccl_settings(os.environ)
    if args.as_hosts:
        # NCCL takes ranks with another host ID for other hosts: two ranks on one GPU then talk over its network
        # plugin (IB or Socket) as two nodes would, which a one-GPU machine cannot show otherwise.
        os.environ["NCCL_HOSTID"] = "gpulab-rank%d" % rank
    log_path = rank_environment(rank) if backend == "nccl" else None
    result = run_rank(rank, args.local, init_method, backend, args.size_mb * 2 ** 20, args.iterations, peers,
                      args.timeout)
    queue.put(finish_rank(result, log_path, backend, args.keep_logs, inherited))


def run_local(args, started):
    import multiprocessing

    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    init_method = "tcp://127.0.0.1:%d" % free_port("127.0.0.1")
    procs = [context.Process(target=_local_rank, args=(rank, args, init_method, backend, list(range(1, args.local)),
                                                       queue)) for rank in range(args.local)]
    for proc in procs:
        proc.start()
    results = sorted((queue.get(timeout=args.timeout + 30) for unused in procs), key=lambda item: item["rank"])
    for proc in procs:
        proc.join()
    infos = [{"ip": "127.0.0.1"} for unused in procs]
    summary = summarize(backend, args.local, args.size_mb * 2 ** 20, args.iterations, infos, results, started)
    summary["ranks"] = results
    return summary


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=60)
    parser.add_argument("--local", type=int, default=0)
    parser.add_argument("--as-hosts", action="store_true", help="--local: each rank as another host (NCCL_HOSTID)")
    parser.add_argument("--keep-logs", default=None, help="--local: keep each rank's NCCL log in this folder")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        found = run_local(args, started) if args.local else run_ray(args, started)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the role names the cause
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        found = {"error": "%s: %s" % (type(exc).__name__, lines[-1] if lines else "")}
    found.setdefault("elapsed_s", round(time.perf_counter() - started, 2))
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
