# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""make bench: time to ready against the floor, gate reaction, no-op re-run, scale, facts latency, model copies.

    bench/run.py [--runs 3] [--steps ready,noop,facts,scale,weights,faults] [--scale 2,4,8] [--variants NAME,...]
                 [--faults KEY,...]
    bench/run.py --report        render bench/results/RESULTS.md again from results.json

Runs on the lab (`make lab-up`, which `make bench` does first). Everything the playbooks run is a
snapshot of the collection taken when the benchmark starts (bench/results/tree), so edits made to
the working tree meanwhile do not mix into the numbers. Every timed run starts from nothing
running (teardown playbook first, not timed); playbook and floor alternate within each round
(F P, P F, F P, ...) so that both see the same machine. Results: bench/results/results.json and
RESULTS.md; logs and per-task timelines of every run in bench/results/logs/.
Variants are measured beside the snapshot: a patch under bench/patches/ (NAME) applied to a copy
of it, or an earlier commit of the collection (rev:COMMIT), e.g. the one before a change.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import faults  # noqa: E402
import handflow  # noqa: E402
import pictures  # noqa: E402
import report  # noqa: E402
import timeline  # noqa: E402

ROOT = benchlib.ROOT
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
# The pictures are committed beside docs/performance.md.
PICTURES = ROOT / "docs" / "images"
LOGS = RESULTS / "logs"
VENV_BIN = ROOT / ".venv" / "bin"
# What the playbooks need from the collection; copied at the start, so the run measures one tree.
TREE_PARTS = ["galaxy.yml", "meta", "plugins", "roles", "playbooks"]
RAY_ONLY = {"image_ref": "{{ lab_ray_image }}", "image_require_vllm": False, "gpulab_vllm_serve": False}
PLAYBOOK_TIMEOUT = 1800
# The model the weights step copies: random shards on node1's own disk.
NODE_DATA = ROOT / "build" / "lab" / "node-data"
RUN = Path("/run/gpulab-lab")
WEIGHTS_SHARDS = 8
WEIGHTS_SHARD_MB = 128


def log(msg: str) -> None:
    print("bench: %s" % msg, flush=True)


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def calibration() -> float:
    """Seconds one core takes for a fixed piece of work (SHA-256 of 256 MiB, then a Python loop): timed just before each
    run, it shows how fast the shared machine was at that moment, so runs of different hours can be told apart."""
    started = time.perf_counter()
    digest, block = hashlib.sha256(), bytes(1 << 20)
    for unused in range(256):
        digest.update(block)
    total = 0
    for i in range(2_000_000):
        total += i * i
    return round(time.perf_counter() - started, 3)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total else None


class Tree:
    """A copy of the collection (optionally patched) that playbooks run from."""

    def __init__(self, name: str, patch: Path | None = None, revision: str | None = None):
        self.name = name
        self.revision = revision
        self.base = RESULTS / "trees" / name.replace("/", "_").replace(":", "_")
        self.path = self.base / "ansible_collections" / "gpulab" / "vllm"
        shutil.rmtree(self.base, ignore_errors=True)
        self.path.mkdir(parents=True)
        if revision:
            # An earlier commit of the collection, measured beside the snapshot (e.g. before a change).
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision, "--",
                                      *[p for p in TREE_PARTS if (ROOT / p).exists()]], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(self.path)], input=archive, check=True)
        for part in TREE_PARTS if not revision else []:
            source = ROOT / part
            if source.is_dir():
                shutil.copytree(source, self.path / part, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.exists():
                shutil.copy2(source, self.path / part)
        inventory = self.path / "inventories" / "local_lab"
        shutil.copytree(ROOT / "inventories" / "local_lab" / "group_vars", inventory / "group_vars")
        # hosts.yml is rewritten by every `make lab-up`: follow the live one.
        (inventory / "hosts.yml").symlink_to(benchlib.INVENTORY)
        self.inventory = inventory
        if patch is not None:
            subprocess.run(["patch", "-p1", "-s", "-d", str(self.path), "-i", str(patch)], check=True)

    def describe(self) -> dict:
        if self.revision:
            commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", self.revision], capture_output=True, text=True, check=True).stdout.strip()
            return {"name": self.name, "revision": commit, "uncommitted": []}
        paths = TREE_PARTS + ["inventories/local_lab/group_vars"]
        status = subprocess.run(["git", "-C", str(ROOT), "status", "--short", "--", *paths], capture_output=True, text=True, check=False).stdout
        digest = hashlib.sha256()
        for path in sorted(p for p in self.path.rglob("*") if p.is_file() and not p.is_symlink()):
            digest.update(str(path.relative_to(self.path)).encode())
            digest.update(path.read_bytes())
        return {"name": self.name, "uncommitted": status.splitlines(), "sha256": digest.hexdigest()[:16]}


class Bench:
    def __init__(self, args):
        self.args = args
        RESULTS.mkdir(mode=0o700, parents=True, exist_ok=True)
        LOGS.mkdir(mode=0o700, exist_ok=True)
        self.results_file = RESULTS / "results.json"
        self.results = {"started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "runs": args.runs}
        self.tree = Tree("snapshot")
        self.results["tree"] = self.tree.describe()
        self.counter = 0
        self.results["machine"] = benchlib.machine_description(self.nodes()[0] if benchlib.INVENTORY.exists() else None)

    # ------------------------------------------------------------------ bookkeeping
    def save(self) -> None:
        self.results_file.write_text(json.dumps(self.results, indent=1, sort_keys=True))
        (RESULTS / "RESULTS.md").write_text(report.render(self.results))

    def _label(self, what: str) -> str:
        self.counter += 1
        return "%03d-%s" % (self.counter, what)

    # ------------------------------------------------------------------ lab
    def nodes(self) -> list[benchlib.Node]:
        return benchlib.lab_nodes(benchlib.read_inventory())

    def lab_up(self, nodes: int, images: str) -> float:
        log("lab-up NODES=%d LAB_IMAGES=%r" % (nodes, images))
        started = time.monotonic()
        with open(LOGS / self._label("lab-up-%d.log" % nodes), "w") as out:
            subprocess.run(["make", "-C", str(ROOT), "lab-up", "NODES=%d" % nodes, "LAB_IMAGES=%s" % images],
                           stdout=out, stderr=subprocess.STDOUT, check=True)
        return round(time.monotonic() - started, 1)

    # ------------------------------------------------------------------ ansible
    def ansible_env(self, tree: Tree, timeline_file: Path) -> dict:
        env = dict(os.environ)
        env.update({
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": str(tree.base),
            "ANSIBLE_CALLBACK_PLUGINS": str(BENCH / "callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,bench_timeline",
            "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "40",
            "BENCH_TIMELINE": str(timeline_file),
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": "%s:%s" % (VENV_BIN, env.get("PATH", "")),
        })
        return env

    def playbook(self, name: str, extra: dict | None = None, tree: Tree | None = None, what: str = "",
                 inventory: Path | None = None, path: Path | None = None) -> dict:
        tree = tree or self.tree
        label = self._label("%s-%s" % (what or Path(name).stem, tree.name))
        timeline_file = LOGS / (label + ".jsonl")
        # The callback appends: a file left by an earlier benchmark under the same label must not mix in.
        timeline_file.unlink(missing_ok=True)
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory or tree.inventory), str(path or tree.path / "playbooks" / name)]
        if extra:
            argv += ["-e", json.dumps(extra)]
        calibrated = calibration()
        cpu = cpu_times()
        # The controller's own CPU time (ansible-playbook, its forks and SSH clients; the lab nodes' module runs are
        # their sshd's children, not these): with the work counts, a measure the machine's load moves far less.
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        launched = time.time()
        started = time.monotonic()
        with open(LOGS / (label + ".log"), "w") as out:
            proc = subprocess.run(argv, cwd=ROOT, env=self.ansible_env(tree, timeline_file), stdout=out, stderr=subprocess.STDOUT,
                                  timeout=PLAYBOOK_TIMEOUT, check=False)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        controller_cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
        parsed = timeline.read(timeline_file) if timeline_file.exists() else timeline.parse([])
        result = {
            "label": label, "rc": proc.returncode, "wall_s": round(wall, 3), "launched": launched, "cpu_busy": busy_share(cpu, cpu_times()),
            "changed": parsed["changed"], "failed": parsed["failed"],
            "startup_s": round(parsed["first_event"] - launched, 3) if parsed["first_event"] else None,
            "profile": timeline.task_profile(parsed),
            "controller_cpu_s": round(controller_cpu, 3),
            "calibration_s": calibrated,
            "work": timeline.work(parsed),
        }
        gate_at, gate_host = timeline.result_time(parsed, "gpulab.vllm.ray_cluster_facts")
        if gate_at is not None:
            result["gate_passed_at"] = gate_at
            result["gate_wait"] = gate_host.get("ray_wait")
        log("%s: rc=%d %.1fs changed=%d" % (label, proc.returncode, wall, parsed["changed"]))
        return result

    def teardown(self) -> None:
        result = self.playbook("teardown.yml", what="teardown")
        if result["rc"] != 0:
            raise RuntimeError("teardown failed, see %s.log" % (LOGS / result["label"]))

    # ------------------------------------------------------------------ Ray and the floor
    def ray_nodes(self) -> list[dict]:
        """Ray's own node table (with each node's start time), read with the collection's GCS reader."""
        head = self.nodes()[0]
        proc = benchlib.docker(head, "exec", "gpulab-ray-head", "python3", "-c", benchlib.gcs_reader_source(self.tree.path),
                               "auto", "5", check=False)
        return benchlib.reader_nodes(proc.stdout)

    @staticmethod
    def last_registration(nodes: list[dict]) -> float:
        return max(n["start_time_ms"] for n in nodes if n["state"] == "ALIVE") / 1000.0

    def record_spec(self, name: str) -> Path:
        """What the roles started (docker inspect) and the firewall they set, as the floor's input."""
        inventory = benchlib.read_inventory()
        secrets = benchlib.inventory_secrets(inventory)
        nodes = benchlib.lab_nodes(inventory)
        binds = set()
        raw = {}
        for node in nodes:
            ids = benchlib.docker(node, "ps", "-q", "--filter", "label=" + benchlib.ROLE_LABEL).stdout.split()
            raw[node.name] = json.loads(benchlib.docker(node, "inspect", *ids).stdout) if ids else []
            binds |= {b.split(":", 1)[0] for doc in raw[node.name] for b in doc["HostConfig"].get("Binds") or []}
        secret_files = benchlib.find_secret_files(sorted(b for b in binds if b.startswith("/")), secrets)
        entries = []
        for node in nodes:
            rules = benchlib.firewall_rules(benchlib.in_netns(node, ["iptables", "-S"], check=True).stdout)
            entries.append({"name": node.name, "containers": benchlib.record_containers(node, secrets, secret_files), "firewall": rules})
        specs = [c for entry in entries for c in entry["containers"]]
        group_vars = benchlib.read_inventory(self.tree.inventory / "group_vars" / "all.yml")
        spec = {"nodes": entries, "expect": benchlib.expected_cluster(specs), "pull": group_vars.get("image_pull") == "always",
                "checks": self.checks_spec(inventory, group_vars, entries), "config_files": self.config_files(specs, group_vars)}
        path = RESULTS / ("spec-%s.json" % name)
        path.write_text(json.dumps(spec, indent=1))
        path.chmod(0o600)
        return path

    @staticmethod
    def config_files(specs: list[dict], group_vars: dict) -> list[dict]:
        """The server's read-only files the vllm_server role writes (its middleware, the variables vLLM must not carry
        to the workers, its config): what the floor writes before it starts the server, as the role does. Secrets are
        left out (the floor writes them from the inventory); so are the model's folders."""
        secret = {f["path"] for c in specs for f in c["secret_files"]}
        model = str(group_vars.get("weights_dir") or "/nonexistent")
        found = []
        for spec in (c for c in specs if c["role"] == "vllm-server"):
            for bind in spec["binds"]:
                source = bind.split(":", 1)[0]
                if not source.startswith("/") or source in secret or source.startswith(os.path.dirname(model)):
                    continue
                paths = [Path(source)] if Path(source).is_file() else sorted(p for p in Path(source).rglob("*") if p.is_file())
                found += [{"path": str(p), "mode": p.stat().st_mode & 0o777, "content": p.read_text()} for p in paths]
        return found

    def checks_spec(self, inventory: dict, group_vars: dict, entries: list[dict]) -> dict:
        """The checks the playbook runs before and after Ray starts, for the floor to run the same way: the image's
        contract probe on every node (with the GPU request the Ray containers got), the proof of the model on every
        node against its source (the same stamps), and the collective across every GPU (the same settings)."""
        collective = benchlib.read_inventory(self.tree.path / "roles" / "collective" / "defaults" / "main.yml")
        collective.update({k: v for k, v in group_vars.items() if k.startswith("collective_")})
        hostvars = inventory["all"]["vars"]
        model_dir = hostvars.get("lab_model_dir") or ""
        weights_dir = group_vars.get("weights_dir") or ""
        probes = []
        for entry in entries:
            ray = [c for c in entry["containers"] if c["role"] in ("ray-head", "ray-worker")]
            if ray:
                probes.append({"name": entry["name"], "image": ray[0]["image"], "gpus": ray[0]["gpus"],
                               "entrypoint_prefix": ray[0]["entrypoint"][:-1]})
        weights = None
        if model_dir and weights_dir:
            stamps = "%s/.gpulab-stamps" % os.path.dirname(weights_dir)
            weights = {
                "source": model_dir,
                "source_stamp": os.path.expanduser("~/.cache/gpulab/weights-stamps/%s.json" % hashlib.sha1(model_dir.encode()).hexdigest()[:16]),
                # Each node's disk as this machine sees it (the lab's /srv/gpulab-lab is the node's data folder).
                "nodes": [{"name": e["name"], "dir": str(NODE_DATA / e["name"] / os.path.relpath(weights_dir, "/srv/gpulab-lab")),
                           "stamp": str(NODE_DATA / e["name"] / os.path.relpath(stamps, "/srv/gpulab-lab")
                                        / ("%s.json" % hashlib.sha1(weights_dir.encode()).hexdigest()[:16]))} for e in entries]}
        return {
            "probe": probes,
            "weights": weights,
            "collective": {"enabled": bool(collective.get("collective_check", True)), "world": int(collective["collective_world"]),
                           "size_mb": int(collective["collective_size_mb"]), "iterations": int(collective["collective_iterations"]),
                           "timeout": int(collective["collective_timeout"])},
        }

    def parity(self, spec_path: Path) -> list[str]:
        """Differences between the containers running now and the recorded spec; empty when the same."""
        recorded = json.loads(spec_path.read_text())
        inventory = benchlib.read_inventory()
        secrets = benchlib.inventory_secrets(inventory)
        secret_files = {f["path"]: f["secret"] for e in recorded["nodes"] for c in e["containers"] for f in c["secret_files"]}
        diffs = []
        for entry, node in zip(recorded["nodes"], benchlib.lab_nodes(inventory)):
            now = benchlib.record_containers(node, secrets, secret_files)
            for want, have in zip(entry["containers"], now):
                diffs += ["%s/%s: %s" % (node.name, want["name"], key) for key in want if want[key] != have.get(key)]
            if len(now) != len(entry["containers"]):
                diffs.append("%s: %d containers, recorded %d" % (node.name, len(now), len(entry["containers"])))
        return diffs

    def floor(self, spec_path: Path, tree: Tree | None = None) -> dict:
        tree = tree or self.tree
        label = self._label("floor")
        calibrated = calibration()
        cpu = cpu_times()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, str(BENCH / "floor.py"), "--spec", str(spec_path), "--collection", str(tree.path)],
                              capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT, check=False)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        controller_cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
        (LOGS / (label + ".log")).write_text(proc.stdout + proc.stderr)
        out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {"ok": False, "error": proc.stderr[-300:]}
        result = {"label": label, "rc": proc.returncode, "wall_s": round(wall, 3), "cpu_busy": busy_share(cpu, cpu_times()),
                  "controller_cpu_s": round(controller_cpu, 3), "calibration_s": calibrated,
                  "marks": out.get("marks"), "error": out.get("error")}
        if out.get("ok"):
            gate = out["gate"]
            result["gate_reaction_s"] = round(gate["at"] - self.last_registration(gate["nodes"]), 3)
            result["gate_polls"] = gate["polls"]
            result["parity_diffs"] = self.parity(spec_path)
        log("%s: rc=%d %.1fs" % (label, proc.returncode, wall))
        return result

    def timed_deploy(self, name: str, extra: dict | None = None, tree: Tree | None = None) -> dict:
        self.teardown()
        result = self.playbook(name, extra, tree, what="deploy")
        if result["rc"] == 0 and "gate_passed_at" in result:
            result["gate_reaction_s"] = round(result["gate_passed_at"] - self.last_registration(self.ray_nodes()), 3)
        return result

    def side_by_side(self, name: str, extra: dict | None, spec_path: Path) -> list[dict]:
        """Rounds of one playbook run and one floor run, alternating which goes first; the last run is the playbook's."""
        rounds = []
        for index in range(self.args.runs):
            order = ["floor", "playbook"] if index % 2 == 0 else ["playbook", "floor"]
            pair = {}
            for which in order:
                if which == "playbook":
                    pair["playbook"] = self.timed_deploy(name, extra)
                else:
                    self.teardown()
                    pair["floor"] = self.floor(spec_path)
            pair["order"] = order
            rounds.append(pair)
        return rounds

    # ------------------------------------------------------------------ the measures
    def step_ready(self) -> None:
        """1 and 2: time to ready, playbook against floor, and the gate's reaction, on two nodes with vLLM."""
        self.lab_up(2, "ray vllm")
        warm = self.timed_deploy("deploy_qwen35.yml")
        if warm["rc"] != 0:
            raise RuntimeError("the warm-up deploy failed; see %s.log" % (LOGS / warm["label"]))
        spec = self.record_spec("qwen35")
        self.results["ready"] = {"warmup": warm, "rounds": []}
        self.save()
        self.results["ready"]["rounds"] = self.side_by_side("deploy_qwen35.yml", None, spec)
        self.results["ready"]["unit_costs"] = self.unit_costs()
        self.results["images"] = sorted({c["image"] for e in json.loads(spec.read_text())["nodes"] for c in e["containers"]})
        self.results["ray_version"] = benchlib.docker(self.nodes()[0], "exec", "gpulab-ray-head", "ray", "--version").stdout.strip()
        self.save()

    def unit_costs(self) -> dict:
        """Ansible's own cost per unit on this lab, right after the rounds (the cluster the last deploy left, idle): the
        plays of timeline.unit_playbooks, in turn, at least three times each, with the deploy's configuration and
        callbacks. With a run's counts (timeline.work) they say what the playbook's tasks cost whatever they do."""
        paths = {}
        for kind, text in timeline.unit_playbooks().items():
            paths[kind] = LOGS / ("unit-%s.yml" % kind)
            paths[kind].write_text(text)
        samples = {kind: [] for kind in paths}
        for round_index in range(max(self.args.runs, 3)):
            kinds = list(paths)[round_index % len(paths):] + list(paths)[:round_index % len(paths)]
            for kind in kinds:
                run = self.playbook(paths[kind].name, what="unit-" + kind, path=paths[kind])
                if run["rc"] != 0:
                    raise RuntimeError("the unit-cost play %s failed; see %s.log" % (kind, LOGS / run["label"]))
                samples[kind].append(run["wall_s"])
        return {"samples": samples, "costs": timeline.unit_costs(samples)}

    def step_noop(self) -> None:
        """3: re-run on the healthy two-node cluster the last playbook run left."""
        self.results["noop"] = [self.playbook("deploy_qwen35.yml", what="noop") for run_index in range(self.args.runs)]
        self.save()

    def step_facts(self) -> None:
        """5: the facts module (ad hoc, and its own read time) against `ray status` in the head container."""
        reader = benchlib.gcs_reader_source(self.tree.path)
        head = self.nodes()[0]
        samples = {"module_adhoc_s": [], "module_read_s": [], "reader_exec_s": [], "ray_status_s": []}
        for sample_index in range(max(self.args.runs, 5)):
            label = self._label("facts")
            timeline_file = LOGS / (label + ".jsonl")
            env = self.ansible_env(self.tree, timeline_file)
            env["ANSIBLE_LOAD_CALLBACK_PLUGINS"] = "1"
            started = time.monotonic()
            with open(LOGS / (label + ".log"), "w") as out:
                subprocess.run([str(VENV_BIN / "ansible"), "ray_head", "-i", str(self.tree.inventory), "-m", "gpulab.vllm.ray_cluster_facts",
                                "-a", json.dumps({"container": "gpulab-ray-head"})], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT, check=True, timeout=300)
            samples["module_adhoc_s"].append(round(time.monotonic() - started, 3))
            host = timeline.result_time(timeline.read(timeline_file), "gpulab.vllm.ray_cluster_facts")[1]
            samples["module_read_s"].append((host or {}).get("ray_wait", {}).get("elapsed"))
            for key, argv in (("reader_exec_s", ["python3", "-c", reader, "auto", "5"]), ("ray_status_s", ["ray", "status"])):
                started = time.monotonic()
                benchlib.docker(head, "exec", "gpulab-ray-head", *argv)
                samples[key].append(round(time.monotonic() - started, 3))
        self.results["facts"] = samples
        self.save()

    def step_scale(self) -> None:
        """4: Ray-only deploy with more lab nodes, playbook and floor side by side at each size."""
        self.results["scale"] = {}
        for nodes in self.args.scale:
            lab_s = self.lab_up(nodes, "ray")
            extra = dict(RAY_ONLY, gate_expected_gpus=nodes)
            warm = self.timed_deploy("deploy.yml", extra)
            if warm["rc"] != 0:
                raise RuntimeError("the warm-up Ray deploy on %d nodes failed; see %s.log" % (nodes, LOGS / warm["label"]))
            spec = self.record_spec("ray-%d" % nodes)
            entry = {"lab_up_s": lab_s, "warmup": warm, "rounds": []}
            self.results["scale"][str(nodes)] = entry
            self.save()
            entry["rounds"] = self.side_by_side("deploy.yml", extra, spec)
            self.save()

    def step_variants(self) -> None:
        """Proposed role changes (bench/patches/NAME.diff), each beside the snapshot: Ray-only deploy and its no-op, two nodes."""
        self.lab_up(2, "ray vllm")
        trees = [self.tree]
        for name in self.args.variants:
            try:
                if name.startswith("rev:"):
                    trees.append(Tree(name, revision=name[len("rev:"):]))
                else:
                    trees.append(Tree(name, BENCH / "patches" / (name + ".diff")))
            except subprocess.CalledProcessError:
                log("variant %s: the patch does not apply to the snapshot (or the revision is unknown); skipped" % name)
        self.results["variants"] = {t.name: {"tree": t.describe(), "deploy": [], "noop": []} for t in trees}
        extra = dict(RAY_ONLY, gate_expected_gpus=2)
        for index in range(self.args.runs):
            for tree in trees if index % 2 == 0 else list(reversed(trees)):
                entry = self.results["variants"][tree.name]
                entry["deploy"].append(self.timed_deploy("deploy.yml", extra, tree))
                entry["noop"].append(self.playbook("deploy.yml", extra, tree, what="noop"))
                self.save()

    # ------------------------------------------------------------------ the model on every node
    def _bench_model(self, node: str) -> None:
        """A model of WEIGHTS_SHARDS random shards on the node's own disk (lab node-data), made once."""
        folder = NODE_DATA / node / "bench-model"
        if len(list(folder.glob("*.safetensors"))) == WEIGHTS_SHARDS:
            return
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for index in range(WEIGHTS_SHARDS):
            with open(folder / ("model-%05d-of-%05d.safetensors" % (index + 1, WEIGHTS_SHARDS)), "wb") as out:
                for chunk_index in range(WEIGHTS_SHARD_MB):
                    out.write(os.urandom(1 << 20))
        (folder / "config.json").write_text('{"model_type": "bench"}')

    def _raw_stream(self, sender: benchlib.Node, receiver: benchlib.Node, folder: Path) -> float:
        """Seconds to stream the model's shards from sender to receiver over their fabric addresses: one plain TCP
        stream (sendfile from the page cache, read into nothing), the link's own figure beside the copy's."""
        files = sorted(str(Path("/srv/gpulab-lab/bench-model") / p.name) for p in folder.glob("*.safetensors"))
        send = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                "s.bind((sys.argv[1],7390));s.listen(1);c,_=s.accept()\n"
                "for p in sys.argv[2:]:\n    c.sendfile(open(p,'rb'))\nc.close()")
        # The receiver connects as soon as the sender listens (no fixed wait), then times the stream alone.
        take = ("import socket,sys,time\nd=time.monotonic()+10\nwhile True:\n    try:\n"
                "        c=socket.create_connection((sys.argv[1],7390));break\n    except OSError:\n"
                "        if time.monotonic()>d: raise\n        time.sleep(0.05)\nt=time.monotonic();n=0\n"
                "while True:\n    b=c.recv(1<<20)\n    if not b: break\n    n+=len(b)\nprint(n,time.monotonic()-t)")
        # In the sender's network namespace, and in its sshd's mount namespace, where its own disk is.
        sshd = (RUN / sender.name / "run" / "sshd.pid").read_text().strip()
        server = subprocess.Popen(["nsenter", "--net=%s" % sender.netns, "--mount=/proc/%s/ns/mnt" % sshd, "--",
                                   "python3", "-c", send, sender.fabric_ip, *files])
        try:
            out = benchlib.in_netns(receiver, ["python3", "-c", take, sender.fabric_ip], check=True).stdout.split()
        finally:
            server.wait(30)
        return float(out[1])

    def step_weights(self) -> None:
        """The model onto every node: copy throughput with proof against a raw stream, the re-run, 2/4/8 nodes."""
        entry = self.results["weights"] = {"model_mb": WEIGHTS_SHARDS * WEIGHTS_SHARD_MB, "sizes": {}}
        for nodes in self.args.scale:
            self.lab_up(nodes, "ray vllm")
            self.teardown()
            names = [n.name for n in self.nodes()]
            self._bench_model(names[0])
            extra = {"weights_source": "node", "weights_source_host": names[0], "weights_source_path": "/srv/gpulab-lab/bench-model",
                     "weights_dir": "/srv/gpulab-lab/bench-model", "gpulab_progress_interval": 10}
            size = entry["sizes"][str(nodes)] = {"copy": [], "rerun": [], "raw_s": []}
            for run_index in range(self.args.runs):
                for name in names[1:]:
                    shutil.rmtree(NODE_DATA / name / "bench-model", ignore_errors=True)
                    shutil.rmtree(NODE_DATA / name / ".gpulab-stamps", ignore_errors=True)
                copy = self.playbook("weights.yml", extra, what="weights-%d" % nodes)
                parsed = timeline.read(LOGS / (copy["label"] + ".jsonl"))
                spans = [round(h["end"] - h["start"], 3) for t in parsed["tasks"] if t["action"] == "gpulab.vllm.weights_fetch"
                         for h in t["hosts"].values() if h.get("changed") and "start" in h and "end" in h]
                copy["copy_spans_s"] = spans
                # The module's own figures: bytes received over its own seconds (received, written, hashed, moved
                # into place), without its start over SSH.
                copy["copy_own"] = [h["copy"] for t in parsed["tasks"] if t["action"] == "gpulab.vllm.weights_fetch"
                                    for h in t["hosts"].values() if h.get("changed") and h.get("copy")]
                copy["rounds"] = sum(1 for t in parsed["tasks"] if t["action"] == "gpulab.vllm.weights_fetch")
                size["copy"].append(copy)
                size["rerun"].append(self.playbook("weights.yml", extra, what="weights-rerun-%d" % nodes))
                if nodes == min(self.args.scale):
                    nodes_list = self.nodes()
                    size["raw_s"].append(round(self._raw_stream(nodes_list[0], nodes_list[1], NODE_DATA / names[0] / "bench-model"), 3))
                self.save()

    # ------------------------------------------------------------------ time to a correct diagnosis
    def step_faults(self) -> None:
        """Each fault class seeded on the lab, the deploy from nothing: seconds to the stop, the line it ended with,
        whether that names the cause and the fix, and nothing started past the failing stage."""
        wanted = [faults.BY_KEY[key] for key in self.args.faults] if self.args.faults else faults.FAULTS
        # The seed's image (Ray 2.53) for the row of Ray versions that differ: without it in the lab its tag names no
        # image, and the deploy stops on that instead of on the versions.
        self.lab_up(2, " ".join(["ray", "vllm"] + sorted({image for fault in wanted for image in fault.images})))
        entry = self.results.setdefault("faults", {})
        # The hand flow starts the containers a healthy deploy started, as a user would by hand.
        warm = self.timed_deploy("deploy_qwen35.yml")
        if warm["rc"] != 0:
            raise RuntimeError("the deploy before the fault matrix failed; see %s.log" % (LOGS / warm["label"]))
        self.results["faults_deploy"] = warm
        spec = json.loads(self.record_spec("faults").read_text())
        for fault in wanted:
            runs, hands = [], []
            for run_index in range(self.args.runs):
                if fault.needs_serving:
                    warm = self.timed_deploy("deploy_qwen35.yml", fault.serving_extra or None)
                    if warm["rc"] != 0:
                        raise RuntimeError("the deploy before the fault %s failed; see %s.log" % (fault.key, LOGS / warm["label"]))
                if fault.from_nothing:
                    self.teardown()
                seeded = fault.seed()
                try:
                    inventory = faults.inventory_with(seeded.hostvars, RESULTS / "inventory-fault") if seeded.hostvars else None
                    if seeded.during is not None:
                        seeded.during.start()
                    result = self.playbook(fault.playbook, seeded.extra, what="fault-" + fault.key, inventory=inventory)
                finally:
                    if seeded.stop is not None:
                        seeded.stop.set()
                        seeded.during.join(30)
                    containers = faults.containers_now()
                    seeded.undo()
                output = (LOGS / (result["label"] + ".log")).read_text()
                verdict = faults.judge(fault, output, containers)
                runs.append({"label": result["label"], "rc": result["rc"], "seconds": round(result["wall_s"] + seeded.waited_s, 3),
                             "waited_s": seeded.waited_s, **verdict})
                log("fault %s: %.1fs named=%s past=%s: %s" % (
                    fault.key, result["wall_s"], verdict["named"], verdict["started_past_stage"], verdict["said"][:160]))
                if not fault.hand_not:
                    hands.append(self.hand_flow(fault, spec))
            row = faults.summary_row(fault, runs)
            row["hand"] = faults.summary_hand(fault, hands)
            entry[fault.key] = {"row": row, "runs": runs, "hand": hands}
            self.save()
        self.teardown()

    def hand_flow(self, fault: faults.Fault, spec: dict) -> dict:
        """The same fault under the hand flow, from nothing running (or, for a fault of a running server, on the
        cluster a deploy left), with the row's budget."""
        if fault.needs_serving:
            warm = self.timed_deploy("deploy_qwen35.yml")
            if warm["rc"] != 0:
                raise RuntimeError("the deploy before the hand flow of %s failed" % fault.key)
        if fault.from_nothing:
            self.teardown()
        seeded = fault.seed()
        try:
            if seeded.during is not None:
                seeded.during.start()
            change = (lambda specs: fault.hand_change(specs, seeded)) if fault.hand_change else None
            outcome = handflow.run(spec, change, fault.budget_s, serving_check=fault.hand_serving_check)
        finally:
            if seeded.stop is not None:
                seeded.stop.set()
                seeded.during.join(30)
            seeded.undo()
        log("hand %s: %ss failed=%s: %s" % (fault.key, outcome["seconds"], outcome["failed"], outcome["said"][:160]))
        self.teardown()
        return outcome

    def pictures(self) -> None:
        draw_pictures(self.results)

    def finish(self) -> None:
        """Leave the lab as the benchmark found it by default: two nodes, both images, nothing running."""
        self.lab_up(2, "ray vllm")
        self.teardown()
        self.results["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.results["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        self.save()
        self.pictures()


def rejudge(results: dict) -> None:
    """The fault rows judged again from their runs' logs with today's patterns (bench/faults.py), the containers found
    after each run as recorded."""
    for key, entry in (results.get("faults") or {}).items():
        fault = faults.BY_KEY[key]
        for run in entry["runs"]:
            path = LOGS / (run["label"] + ".log")
            if path.exists():
                verdict = faults.judge(fault, path.read_text(), run["started_past_stage"])
                run.update({name: verdict[name] for name in ("said", "named", "named_at", "errors")})
        hand = entry["row"].get("hand")
        entry["row"] = faults.summary_row(fault, entry["runs"])
        entry["row"]["hand"] = hand


def draw_pictures(results: dict) -> list[Path]:
    """The deploy's timeline (the median run from nothing of the ready step) and the fault matrix, as SVG."""
    PICTURES.mkdir(parents=True, exist_ok=True)
    written = []
    runs = [r["playbook"] for r in (results.get("ready") or {}).get("rounds", []) if r.get("playbook", {}).get("rc") == 0]
    # Without the ready step, the deploy the fault matrix started from.
    runs = runs or [r for r in [results.get("faults_deploy")] if r and r.get("rc") == 0]
    runs = [r for r in runs if (LOGS / (r["label"] + ".jsonl")).exists()]
    if runs:
        middle = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
        parsed = timeline.read(LOGS / (middle["label"] + ".jsonl"))
        title = "deploy_qwen35.yml from nothing on the 2-node lab: %.1f s (the median of %d run(s))" % (middle["wall_s"], len(runs))
        written.append(PICTURES / "deploy-timeline.svg")
        written[-1].write_text(pictures.timeline_svg(parsed, title))
    rows = [entry["row"] for entry in (results.get("faults") or {}).values()]
    if rows:
        written.append(PICTURES / "fault-matrix.svg")
        written[-1].write_text(pictures.faults_svg(rows, "Time to a correct diagnosis, per fault class, on the 2-node lab"))
    return written


STEPS = ("ready", "noop", "facts", "scale", "weights", "variants", "faults")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each kind (3 or more)")
    parser.add_argument("--steps", default="ready,noop,facts,scale,weights,faults", help="comma-separated, from %s" % ", ".join(STEPS))
    parser.add_argument("--scale", default="2,4,8", help="lab sizes for the Ray-only deploy")
    parser.add_argument("--variants", default="", help="patches under bench/patches/ (NAME) or commits (rev:COMMIT) to measure beside the snapshot")
    parser.add_argument("--faults", default="", help="fault rows to run (keys of bench/faults.py), all when empty")
    parser.add_argument("--report", action="store_true", help="only render RESULTS.md from results.json")
    args = parser.parse_args(argv)
    if args.report:
        results = json.loads((RESULTS / "results.json").read_text())
        rejudge(results)
        (RESULTS / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True))
        (RESULTS / "RESULTS.md").write_text(report.render(results))
        draw_pictures(results)
        return 0
    args.scale = [int(n) for n in args.scale.split(",") if n]
    args.variants = [v for v in args.variants.split(",") if v]
    args.faults = [f for f in args.faults.split(",") if f]
    if [f for f in args.faults if f not in faults.BY_KEY]:
        parser.error("unknown fault(s) %s; choose from %s" % ([f for f in args.faults if f not in faults.BY_KEY], ", ".join(faults.BY_KEY)))
    steps = [s for s in args.steps.split(",") if s]
    if args.variants and "variants" not in steps:
        steps.append("variants")
    unknown = [s for s in steps if s not in STEPS]
    if unknown or args.runs < 1:
        parser.error("unknown step(s) %s; choose from %s" % (unknown, ", ".join(STEPS)) if unknown else "--runs must be 1 or more")
    bench = Bench(args)
    try:
        for step in steps:
            log("step %s" % step)
            getattr(bench, "step_" + step)()
    finally:
        # Whatever happened, the lab goes back to its default shape with nothing running.
        bench.finish()
    log("results in %s" % (RESULTS / "RESULTS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
