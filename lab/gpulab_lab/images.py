# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab images: a Debian base imported once, recipes built only when they change, pushed and pinned by digest."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .common import BUILD, CACHE, IMAGES_DIR, PROJECT, RUN, STATE_FILE, LabError, log, node_dirs, pid_alive, run
from .config import LAB_IMAGES, LabConfig, LabImage
from .registry import MANIFEST_V2, push_uncompressed


BASE_IMAGE = "gpulab-lab/bookworm:base"


def recipe_files(folder: Path, requirements: str) -> list[Path]:
    """The files of a recipe folder that make one image: every file but the other images' package lists."""
    return [path for path in sorted(folder.rglob("*")) if path.is_file()
            and (path.name == requirements or not path.name.startswith("requirements"))]


def recipe_hash(folder: Path, extra: str = "", requirements: str = "requirements.txt") -> str:
    h = hashlib.sha256(extra.encode())
    for path in recipe_files(folder, requirements):
        h.update(path.relative_to(folder).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def watch(proc: subprocess.Popen, doing: str, seen, every: float = 30.0) -> subprocess.Popen:
    """Wait for a long process, saying every `every` seconds that it still runs and what it is at (seen())."""
    started = time.monotonic()
    while True:
        try:
            proc.wait(timeout=every)
            return proc
        except subprocess.TimeoutExpired:
            at = seen()
            log(f"  still {doing} ({time.monotonic() - started:.0f}s){': ' + at if at else ''}")


def folder_size(folder: Path) -> str:
    files = [path for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")]
    # pip resolves first and writes the wheels at the end: nothing to count before that.
    return f"{len(files)} files, {sum(path.stat().st_size for path in files) / 1e9:.1f} GB so far" if files else "resolving"


def last_step(path: Path) -> str:
    """The last build step a docker build log reached ("Step 5/18 : RUN ..."), trimmed."""
    try:
        steps = [line for line in path.read_text(errors="replace").splitlines() if line.startswith("Step ")]
    except OSError:
        return ""
    return steps[-1][:100] if steps else ""


def log_tail(path: Path, lines: int = 25) -> str:
    """The last lines of a build log, indented, for an error that must explain itself where only the output is seen."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text)


def image_label(ref: str, label: str) -> str | None:
    proc = run(["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', ref], check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_base_image() -> None:
    if image_label(BASE_IMAGE, "org.gpulab.lab.base") is not None:
        return
    rootfs = CACHE / "rootfs-bookworm"
    if not (rootfs / "usr" / "bin" / "apt-get").exists():
        log("making a Debian bookworm root file system (debootstrap, once)")
        shutil.rmtree(rootfs, ignore_errors=True)
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs)], capture=True)
    log(f"importing {BASE_IMAGE}")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run(["docker", "import", "--change", "LABEL org.gpulab.lab.base=bookworm",
         "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE], stdin=tar.stdout)
    tar.wait()


# The lab images' Python (Debian bookworm's); their wheels are downloaded by the same version.
IMAGE_PYTHON = "3.11"


def image_python() -> str:
    """A Python of the images' version to download their wheels with (the checkout's venv may run another)."""
    if sys.version_info[:2] == tuple(int(part) for part in IMAGE_PYTHON.split(".")):
        return sys.executable
    found = subprocess.run([str(PROJECT / "tests" / "find_python.sh"), IMAGE_PYTHON], capture_output=True, text=True,
                           check=False).stdout.strip()
    if not found:
        raise LabError(f"the lab images' wheels need Python {IMAGE_PYTHON} to download them (pip picks wheels for its own "
                       f"Python); install python{IMAGE_PYTHON}")
    return found


# One download per wheel set: a prefetch still running is waited for, never started twice.
_WHEELHOUSE_LOCKS = {key: threading.Lock() for key in LAB_IMAGES}


def ensure_wheelhouse(key: str, folder: Path, image: LabImage) -> Path:
    with _WHEELHOUSE_LOCKS[key]:
        return _ensure_wheelhouse(key, folder, image)


def _ensure_wheelhouse(key: str, folder: Path, image: LabImage) -> Path:
    house = CACHE / "wheelhouse" / key
    house.mkdir(parents=True, exist_ok=True)
    stamp = house / ".requirements"
    req = (folder / image.requirements).read_text()
    if stamp.exists() and stamp.read_text() == req:
        return house
    log(f"downloading wheels for the {key} image into {house.relative_to(PROJECT)}")
    pip_extra = os.environ.get("LAB_PIP_ARGS", "").split() + (["--no-deps"] if image.locked else [])
    (BUILD / "lab" / "logs").mkdir(parents=True, exist_ok=True)
    pip_log = BUILD / "lab" / "logs" / f"wheels-{key}.log"
    with open(pip_log, "w") as out:
        pip = watch(subprocess.Popen([image_python(), "-m", "pip", "download", "--quiet", "-d", str(house),
                                      "-r", str(folder / image.requirements), *pip_extra],
                                     stdout=out, stderr=subprocess.STDOUT),
                    f"downloading the {key} image's wheels", lambda: folder_size(house))
    if pip.returncode != 0:
        raise LabError(f"downloading the {key} image's wheels failed; build/lab/logs/wheels-{key}.log ends:\n{log_tail(pip_log, 10)}")
    stamp.write_text(req)
    return house


@contextlib.contextmanager
def serve_folder(folder: Path):
    """Serve a folder's files over HTTP on loopback for as long as the block runs; yields its URL. pip takes
    loopback as a secure origin, so --find-links needs no --trusted-host."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # pylint: disable=redefined-builtin
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def image_is_current(cfg: LabConfig, key: str) -> bool:
    """The registry holds this recipe's image, built on the base image this machine has (False without a base:
    a new base makes every image new)."""
    if image_label(BASE_IMAGE, "org.gpulab.lab.base") is None:
        return False
    image = LAB_IMAGES[key]
    digest = recipe_hash(IMAGES_DIR / image.folder, requirements=image.requirements,
                         extra=run(["docker", "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]).stdout)
    return registry_label(cfg, key, "org.gpulab.lab.recipe") == digest


def prefetch_wheels(keys: list[str]) -> list[threading.Thread]:
    """Download the wheel sets of these images at once, each in its own thread (the downloads wait on the network,
    the builds on the CPU): a build then waits only for its own set, already there or nearly."""
    threads = []
    errors: dict[str, LabError] = {}

    def fetch(key: str) -> None:
        image = LAB_IMAGES[key]
        try:
            ensure_wheelhouse(key, IMAGES_DIR / image.folder, image)
        except LabError as exc:  # the build of this image downloads again and says why it failed
            errors[key] = exc
            log(f"prefetching the {key} image's wheels failed; its build will try again: {exc}")

    for key in keys:
        thread = threading.Thread(target=fetch, args=(key,), daemon=True, name=f"wheels-{key}")
        thread.start()
        threads.append(thread)
    return threads


def keep_first_layer(ref: str, folder: str) -> None:
    """Tag the layer a recipe builds first on the base (its apt packages) as gpulab-lab/FOLDER-system, so that it
    outlives the image's removal after its push: the next image of the same recipe (the seed's vLLM after today's)
    finds it in the build cache instead of running apt again."""
    base = run(["docker", "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]).stdout.strip()
    current, first = ref, None
    for _depth in range(64):
        parent = run(["docker", "image", "inspect", "--format", "{{.Parent}}", current], check=False).stdout.strip()
        if not parent or parent == base:
            break
        first = current = parent
    if first is not None and parent == base:
        run(["docker", "tag", first, f"gpulab-lab/{folder}-system:latest"], check=False)


# Built and pushed at the lowest CPU priority: the seed's image (9 GB) builds while the lab stage runs, which needs it
# only at its end; the lab's tests, which share the machine's cores with it, go first.
BACKGROUND_IMAGES = ("vllm-seed",)


def _builder_pids() -> list[int]:
    """The processes that do a build's and a push's work: the machine's Docker daemon, its containerd (which starts
    each build step's processes, and they take its priority), the lab registry."""
    dockerd = pid_alive(Path("/var/run/docker.pid"))
    pids = [pid for pid in (dockerd, pid_alive(RUN / "registry.pid")) if pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if dockerd and int(stat.read_text().rsplit(")", 1)[1].split()[1]) == dockerd:
                pids.append(int(stat.parent.name))
    return pids


def _set_priority(pid: int, priority: int) -> None:
    """Every thread of a process (a priority is a thread's own on Linux); pid 0: this thread."""
    tids = [0] if pid == 0 else [int(task.name) for task in Path(f"/proc/{pid}/task").glob("[0-9]*")]
    for tid in tids:
        with contextlib.suppress(OSError):  # gone, or not ours to change: it keeps its priority
            os.setpriority(os.PRIO_PROCESS, tid, priority)


AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


@contextlib.contextmanager
def priorities_by_nice(switch: Path = AUTOGROUP):
    """Linux's autogroup (on by default) shares the CPU equally between sessions, whatever their processes' nice
    values: a container is a session of its own, and so is each build step, so a build at nice 19 took as much CPU as
    a lab server beside it. Off for the block, so that a nice value holds on the whole machine; as it was after.
    Processes started during the block keep the scheduling they started with. Without the right to change it (not
    root, no such kernel setting), nothing changes."""
    try:
        before = switch.read_text().strip()
    except OSError:
        yield
        return
    changed = False
    if before != "0":
        with contextlib.suppress(OSError):
            switch.write_text("0\n")
            changed = True
    try:
        yield
    finally:
        if changed:
            with contextlib.suppress(OSError):
                switch.write_text(before + "\n")


@contextlib.contextmanager
def lowest_priority(key: str):
    """For a background image: this thread (and the push thread it starts) and the builder's processes at nice 19
    for the block, with autogroup off so that nice 19 holds against the lab's containers, each at its own priority
    again after it."""
    if key not in BACKGROUND_IMAGES:
        yield
        return
    before = {}
    with priorities_by_nice():
        for pid in [0, *_builder_pids()]:
            with contextlib.suppress(OSError):
                before[pid] = os.getpriority(os.PRIO_PROCESS, pid)
                _set_priority(pid, 19)
        try:
            yield
        finally:
            for pid, priority in before.items():
                _set_priority(pid, priority)


UNPACKER = b"docker-untar"


def _lower_unpackers(running, every: float = 1.0, priority: int = 19, name: bytes = UNPACKER) -> None:
    """While running() is true, every layer unpacker of the machine's Docker daemons (a child each daemon starts per
    layer, argv[0] docker-untar) at nice 19: a node's pull of a background image unpacks gigabytes on the cores the
    lab's tests use, while the node's daemon itself keeps its priority for the tests' calls (priority and name: for a
    test, which must leave the machine's real unpackers alone)."""
    lowered: set[int] = set()
    while running():
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            pid = int(cmdline.parent.name)
            if pid in lowered:
                continue
            with contextlib.suppress(OSError):
                if cmdline.read_bytes().split(b"\0", 1)[0] == name:
                    _set_priority(pid, priority)
                    lowered.add(pid)
        time.sleep(every)


def ensure_image(cfg: LabConfig, key: str, push: bool = True) -> None:
    with lowest_priority(key):
        _ensure_image(cfg, key, push)


def _ensure_image(cfg: LabConfig, key: str, push: bool = True) -> None:
    image = LAB_IMAGES[key]
    folder = IMAGES_DIR / image.folder
    local_ref = cfg.image_ref(key, for_nodes=False)
    digest = recipe_hash(folder, extra=run(["docker", "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]).stdout,
                         requirements=image.requirements)
    built = image_label(local_ref, "org.gpulab.lab.recipe")
    if built is None and registry_label(cfg, key, "org.gpulab.lab.recipe") == digest:
        return  # pushed by an earlier run, and its local copy removed
    if built != digest:
        house = ensure_wheelhouse(key, folder, image)
        context = BUILD / "context" / key
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir(parents=True)
        for path in recipe_files(folder, image.requirements):
            target = context / ("requirements.txt" if path.name == image.requirements else path.relative_to(folder))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        log(f"building {local_ref} (recipe {digest}): a few minutes; its log: build/lab/logs/build-{key}.log"
            + (" (at the lowest CPU priority, nice 19, behind the lab's work)" if key in BACKGROUND_IMAGES else ""))
        (BUILD / "lab" / "logs").mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        log_path = BUILD / "lab" / "logs" / f"build-{key}.log"
        # The wheels reach the build over HTTP on loopback (the build shares the machine's network), not in its
        # context: a context would be copied twice more (the daemon's copy, and a layer), 4.3 GB each for the seed.
        # One server for both tries, so the second one's steps match the first one's cache.
        with serve_folder(house) as wheels:
            # A second try, on the layers the first one finished: the builds reach the Debian mirrors, which
            # fail now and then (a mirror in sync answers "Hash Sum mismatch"). A recipe that is broken fails twice.
            for attempt in (1, 2):
                with open(log_path, "w") as build_log:
                    proc = watch(subprocess.Popen(
                        ["docker", "build", "--network", "host", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                         "--build-arg", f"PIP_DEPS={'--no-deps' if image.locked else ''}", "--build-arg", f"WHEELS={wheels}",
                         "--label", f"org.gpulab.lab.recipe={digest}", "-t", local_ref, str(context)],
                        stdout=build_log, stderr=subprocess.STDOUT,
                    ), f"building the {key} image", lambda: last_step(log_path))
                if proc.returncode == 0:
                    break
                tail = log_tail(log_path)
                if attempt == 1:
                    log(f"building the {key} image failed (exit {proc.returncode}); trying once more. Its log ended:\n{tail}")
                    shutil.copyfile(log_path, log_path.with_suffix(".first.log"))
                else:
                    raise LabError(f"building the {key} image failed twice; see build/lab/logs/build-{key}.log, which "
                                   f"ends:\n{tail}")
        log(f"built {local_ref} in {time.monotonic() - started:.0f}s")
        keep_first_layer(local_ref, image.folder)
        # Untagged images a failed try left go (only lab images carry the base's label). The wheels go too
        # (the seed's are 4.3 GB): they are downloaded again only if the recipe changes.
        run(["docker", "image", "prune", "--force", "--filter", "label=org.gpulab.lab.base"], check=False)
        shutil.rmtree(house, ignore_errors=True)
        shutil.rmtree(context, ignore_errors=True)
    if push:
        size = run(["docker", "image", "inspect", "--format", "{{.Size}}", local_ref], check=False).stdout.strip()
        log(f"pushing {local_ref} ({int(size) / 1e9:.1f} GB) to the lab registry" if size.isdigit() else f"pushing {local_ref}")
        started = time.monotonic()
        pushing = threading.Thread(target=_push, args=(cfg, key, local_ref), name=f"push-{key}")
        pushing.start()
        while pushing.is_alive():
            pushing.join(30)
            if pushing.is_alive():
                log(f"  still pushing the {key} image ({time.monotonic() - started:.0f}s)")
        if _PUSHED.pop(key, None) is None:
            raise _PUSH_ERRORS.pop(key, LabError(f"pushing {local_ref} ended without a manifest (see the log above)"))
        log(f"pushed {local_ref} in {time.monotonic() - started:.0f}s")
        # The registry and the nodes hold it now; the machine's copy (9 GB for the seed's) goes.
        run(["docker", "image", "rm", local_ref], check=False)
        # The nodes pull it while the next image builds (wait_for_pulls before the build command ends).
        puller = threading.Thread(target=pull_on_nodes, args=(cfg, key), name=f"pull-{key}")
        puller.start()
        _PULLS.append(puller)


_PULLS: list[threading.Thread] = []
_PUSH_ERRORS: dict[str, Exception] = {}
_PUSHED: dict[str, str] = {}


def _push(cfg: LabConfig, key: str, local_ref: str) -> None:
    """The image into the lab registry with its layers uncompressed (registry.push_uncompressed says why)."""
    try:
        _PUSHED[key] = push_uncompressed(cfg, local_ref, LAB_IMAGES[key].repo, LAB_IMAGES[key].tag)
    except (LabError, OSError, subprocess.CalledProcessError, tarfile.TarError, KeyError, ValueError) as err:
        _PUSH_ERRORS[key] = LabError(f"pushing {local_ref} failed: {err!r}")


def wait_for_pulls() -> None:
    """Wait for the nodes' pulls of the images this process pushed."""
    for puller in _PULLS:
        puller.join()


def pull_on_nodes(cfg: LabConfig, key: str) -> None:
    """Pull a pushed image onto every node of the lab that is up, the nodes side by side: a build that finishes while
    the lab runs tests (the seed's) is on the nodes before a deploy asks for it. Nothing when no lab is up; a node
    whose daemon does not answer is left to pull it when a deploy asks (the roles pull what is missing)."""
    if not STATE_FILE.exists():
        return
    sockets = {name: node_dirs(name)["run"] / "docker.sock" for name in cfg.node_names}
    sockets = {name: sock for name, sock in sockets.items() if sock.exists()}
    if not sockets:
        return
    ref, started = pinned_ref(cfg, key), time.monotonic()
    pulls = {name: subprocess.Popen(["docker", "-H", f"unix://{sock}", "pull", "--quiet", ref], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True) for name, sock in sockets.items()}
    if key in BACKGROUND_IMAGES:
        threading.Thread(target=_lower_unpackers, args=(lambda: any(p.poll() is None for p in pulls.values()),),
                         name=f"lower-{key}", daemon=True).start()
    failed = {name: (proc.communicate()[1] or "").strip()[-200:] for name, proc in pulls.items() if proc.wait() != 0}
    log(f"pulled {key} onto {', '.join(sorted(set(pulls) - set(failed))) or 'no node'} in {time.monotonic() - started:.0f}s"
        + "".join(f"; {name} did not pull it ({why})" for name, why in sorted(failed.items())))


def _registry_get(cfg: LabConfig, path: str, accept: str | None = None):
    """(response headers, JSON body) of the lab registry's answer, or None when it has nothing there."""
    request = urllib.request.Request(f"http://127.0.0.1:{cfg.registry_port}/v2/{path}",
                                     headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.headers, json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _manifest(cfg: LabConfig, key: str):
    image = LAB_IMAGES[key]
    return _registry_get(cfg, f"{image.repo}/manifests/{image.tag}", MANIFEST_V2)


def registry_label(cfg: LabConfig, key: str, label: str) -> str | None:
    """A label of the image the lab registry holds under the lab image's tag; None when it holds none."""
    found = _manifest(cfg, key)
    if found is None or "config" not in found[1]:
        return None
    config = _registry_get(cfg, f"{LAB_IMAGES[key].repo}/blobs/{found[1]['config']['digest']}")
    labels = ((config[1].get("config") or {}).get("Labels") or {}) if config else {}
    return labels.get(label)


def pinned_ref(cfg: LabConfig, key: str) -> str:
    """The nodes' reference of a lab image, pinned by the digest the registry gave it (as a real lab
    should pin its images): the roles can then pull only what is missing. The tag when the registry
    does not hold the image."""
    found = _manifest(cfg, key)
    digest = found[0].get("Docker-Content-Digest") if found else None
    if not digest:
        return cfg.image_ref(key)
    return cfg.image_ref(key).rsplit(":", 1)[0] + "@" + digest
