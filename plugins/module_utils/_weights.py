# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model folder, proven file by file: its manifest, what differs from the expected one, and how copies spread.

A manifest maps each file's path (relative to the folder, with '/') to its size and sha256. A stamp is the manifest
a node computed last time, with each file's mtime: a file whose size and mtime still match its stamp is trusted
without reading it again, so that proving a verified 119 GB folder a second time takes a second, not minutes.
Everything here is pure (no node, no network) except the folder walk and the hashing, which read files.
"""

from __future__ import annotations

import hashlib
import json
import os

# The collection's own files in a model folder (stamps, partial copies) and the hub client's metadata folder are
# not the model's.
OWN_PREFIX = ".gpulab"
SKIPPED_DIRS = (".cache", ".git")
PARTIAL_DIR = ".gpulab-partial"
STAMP_NAME = ".gpulab-manifest.json"
HASH_BLOCK = 8 * 1024 * 1024


def walk(root):
    """Relative paths ('/'-separated, sorted) of the model's regular files under root."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(OWN_PREFIX) and d not in SKIPPED_DIRS)
        for name in files:
            if name.startswith(OWN_PREFIX):
                continue
            full = os.path.join(folder, name)
            if os.path.isfile(full) and not os.path.islink(full):
                found.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(found)


def sha256_file(path, block=HASH_BLOCK):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while True:
            chunk = stream.read(block)
            if not chunk:
                break
            digest.update(chunk)
    return digest.hexdigest()


def read_stamp(path):
    """The stamp at path, or {} when there is none or it cannot be read (then every file is hashed)."""
    try:
        with open(path) as stream:
            data = json.load(stream)
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def write_stamp(path, files):
    """Write the stamp atomically (a reader never sees half of one)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as stream:
        json.dump({"version": 1, "files": files}, stream, sort_keys=True)
    os.replace(tmp, path)


def manifest(root, stamp=None, only=None, full=False, hasher=sha256_file):
    """(files, hashed): the manifest of root with each file's mtime, and the paths read this time.

    A file whose size and mtime_ns equal its stamp's keeps the stamp's sha256 (unless full); only, when given,
    limits the walk to those paths (those absent are left out)."""
    stamp = stamp or {}
    files, hashed = {}, []
    paths = walk(root) if only is None else [p for p in only if os.path.isfile(os.path.join(root, p))]
    for rel in paths:
        full_path = os.path.join(root, rel)
        info = os.stat(full_path)
        old = stamp.get(rel) or {}
        if not full and old.get("size") == info.st_size and old.get("mtime_ns") == info.st_mtime_ns and old.get("sha256"):
            digest = old["sha256"]
        else:
            digest = hasher(full_path)
            hashed.append(rel)
        files[rel] = {"size": info.st_size, "sha256": digest, "mtime_ns": info.st_mtime_ns}
    return files, hashed


def strip(files):
    """The manifest without the node's own details (mtimes): what two nodes must agree on."""
    return {rel: {"size": entry["size"], "sha256": entry.get("sha256")} for rel, entry in files.items()}


def compare(expected, found):
    """The files that differ from the expected manifest, each {file, problem, expected, found}, sorted by file.

    problem is missing, size (a truncated or grown copy) or sha256 (same size, other bytes). An expected entry
    without a sha256 (a hub file the hub publishes no sha256 for) is judged on its size alone."""
    problems = []
    for rel in sorted(expected):
        want = expected[rel]
        have = found.get(rel)
        if have is None:
            problems.append({"file": rel, "problem": "missing", "expected": "%d bytes" % want["size"], "found": "absent"})
        elif have["size"] != want["size"]:
            problems.append({"file": rel, "problem": "size", "expected": "%d bytes" % want["size"],
                             "found": "%d bytes" % have["size"]})
        elif want.get("sha256") and have.get("sha256") != want["sha256"]:
            problems.append({"file": rel, "problem": "sha256", "expected": "sha256 " + want["sha256"][:16],
                             "found": "sha256 " + str(have.get("sha256"))[:16]})
    return problems


def index_problems(root, present):
    """Shards a safetensors index (model*.safetensors.index.json) names that present (paths) lacks, as problems."""
    problems = []
    for rel in sorted(p for p in present if p.endswith(".safetensors.index.json")):
        try:
            with open(os.path.join(root, rel)) as stream:
                weight_map = json.load(stream).get("weight_map") or {}
        except (OSError, ValueError, AttributeError) as error:
            problems.append({"file": rel, "problem": "index", "expected": "a safetensors index", "found": str(error)[:120]})
            continue
        base = os.path.dirname(rel)
        for shard in sorted(set(weight_map.values())):
            shard_rel = "/".join(filter(None, [base, shard]))
            if shard_rel not in present:
                problems.append({"file": shard_rel, "problem": "missing", "expected": "a shard %s names" % rel, "found": "absent"})
    return problems


def describe(problem):
    """One problem as a phrase: 'model-00002.safetensors: truncated (expected 4096 bytes, found 1000 bytes)'."""
    word = {"missing": "missing", "size": "wrong size", "sha256": "corrupt", "index": "unreadable index"}.get(problem["problem"], problem["problem"])
    if problem["problem"] == "size":
        try:
            if int(problem["found"].split()[0]) < int(problem["expected"].split()[0]):
                word = "truncated"
        except (ValueError, IndexError):
            pass
    return "%s: %s (expected %s, found %s)" % (problem["file"], word, problem["expected"], problem["found"])


def spread_plan(holders, targets):
    """Rounds of copies, each a dict target -> holder, in which every holder serves at most one target.

    Every node that received a verified copy serves in the next round, so N targets are reached in
    ceil(log2(N / holders + 1)) rounds instead of N. Nodes serve before a source whose name starts with '@' (the
    source folder, maybe on the controller, across the management network): a node's copy goes over the fabric.
    Otherwise holders and targets keep their given order."""
    holders, waiting = list(holders), [t for t in targets if t not in holders]
    if not holders and waiting:
        raise ValueError("no node holds the model to copy from")
    rounds = []
    while waiting:
        pairs = {}
        for holder in [h for h in holders if not h.startswith("@")] + [h for h in holders if h.startswith("@")]:
            if not waiting:
                break
            pairs[waiting.pop(0)] = holder
        rounds.append(pairs)
        holders.extend(pairs)
    return rounds


def partial_path(dest, rel):
    """Where a copy of rel into dest grows until it is proven and moved into place."""
    return os.path.join(dest, PARTIAL_DIR, *rel.split("/"))


def partial_bytes(dest, files):
    """Bytes already in partial copies of the given files (what a resumed copy need not fetch again)."""
    total = 0
    for rel, entry in files.items():
        try:
            total += min(os.path.getsize(partial_path(dest, rel)), entry["size"])
        except OSError:
            pass
    return total


def free_bytes(path):
    """Free bytes (for an unprivileged writer) on the file system of path, or of its nearest parent that exists."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    info = os.statvfs(probe or "/")
    return info.f_bavail * info.f_frsize


def read_folder(root, stamp_file="", expected=None, full=False, with_manifest=True, hash_allowed=True, write=True, warn=None):
    """What weights_manifest returns for root: the manifest, the problems against expected, the bytes a copy needs.

    With hash_allowed false, None when the answer would need a file read (a file the stamp does not vouch for) or a
    new stamp (a file gone or added): the caller then runs the module, which does both. Otherwise the stamp is
    written when the manifest changed and write is true (warn, when given, hears why it could not be); raises
    OSError when the folder cannot be walked."""
    stamp = read_stamp(stamp_file) if stamp_file else {}
    files, hashed = {}, []
    if os.path.isdir(root):
        if hash_allowed:
            files, hashed = manifest(root, stamp=stamp, full=full)
        else:
            def refuse(path):
                raise LookupError(path)
            try:
                files, hashed = manifest(root, stamp=stamp, full=full, hasher=refuse)
            except LookupError:
                return None
    elif not hash_allowed:
        return None
    if stamp_file and files and (hashed or set(stamp) != set(files)):
        if not hash_allowed:
            return None
        try:
            if write:
                write_stamp(stamp_file, files)
        except OSError as error:
            if warn is not None:
                warn("the stamp %s could not be written (%s): the next run hashes every file again" % (stamp_file, error))
    # A shard its own index names and the folder lacks is a problem with or without an expected manifest.
    problems = index_problems(root, set(files))
    needed = partial = 0
    if expected is not None:
        problems = compare(expected, files) + [p for p in problems if p["file"] not in expected]
        differing = {p["file"]: expected[p["file"]] for p in problems if p["file"] in expected}
        partial = partial_bytes(root, differing)
        needed = max(0, sum(entry["size"] for entry in differing.values()) - partial)
    return dict(
        files=strip(files) if with_manifest else {},
        count=len(files),
        total_bytes=sum(entry["size"] for entry in files.values()),
        hashed=hashed,
        problems=problems,
        problem_lines=[describe(p) for p in problems],
        needed_bytes=needed,
        partial_bytes=partial,
        free_bytes=free_bytes(root),
    )


def human_bytes(count):
    value = float(count)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return ("%d %s" % (value, unit)) if unit == "B" else ("%.1f %s" % (value, unit))
        value /= 1000.0
    return "%d B" % count


def human_seconds(seconds):
    seconds = int(round(max(0, seconds)))
    if seconds < 60:
        return "%d s" % seconds
    if seconds < 3600:
        return "%d min %02d s" % divmod(seconds, 60)
    hours, rest = divmod(seconds, 3600)
    return "%d h %02d min" % (hours, rest // 60)
