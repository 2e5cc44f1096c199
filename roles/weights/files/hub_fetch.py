# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fetch a model from a Hugging Face hub at one revision, and prove every file against what the hub publishes.

Run by the weights role inside the serving image (which carries huggingface_hub), on the node that fetches for all
the others. The hub client reads HF_ENDPOINT (a mirror) and HF_TOKEN_PATH (a root-only file, so that no token is in
any process's environment or in `docker inspect`) itself. Prints one JSON document: the commit the revision names,
the manifest (size and sha256 of every file) and the files that do not match what the hub published (the sha256 of
LFS files; the git blob id of the others).

    python3 hub_fetch.py REPO REVISION DEST [--manifest-only]
"""

import hashlib
import json
import os
import sys

BLOCK = 8 * 1024 * 1024


def digests(path):
    """(sha256, git blob sha1) of the file, read once."""
    sha256 = hashlib.sha256()
    blob = hashlib.sha1()
    blob.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(BLOCK), b""):
            sha256.update(chunk)
            blob.update(chunk)
    return sha256.hexdigest(), blob.hexdigest()


def published(entries):
    """What the hub publishes for each file of a revision (its tree, listed recursively): size, sha256 (LFS files)
    and git blob id."""
    files = {}
    for entry in entries:
        if not hasattr(entry, "blob_id"):
            continue  # a folder
        lfs = getattr(entry, "lfs", None)
        lfs_sha = getattr(lfs, "sha256", None) if lfs is not None else None
        lfs_size = getattr(lfs, "size", None) if lfs is not None else None
        if isinstance(lfs, dict):
            lfs_size, lfs_sha = lfs.get("size"), lfs.get("sha256")
        files[entry.path] = {"size": lfs_size if lfs_size is not None else entry.size, "sha256": lfs_sha, "blob_id": entry.blob_id}
    return files


def prove(dest, want):
    """The manifest of what is in dest, and each file that differs from what the hub published."""
    manifest, problems = {}, []
    for rel, entry in sorted(want.items()):
        path = os.path.join(dest, rel)
        if not os.path.isfile(path):
            problems.append({"file": rel, "problem": "missing", "expected": "%s bytes" % entry["size"], "found": "absent"})
            continue
        size = os.path.getsize(path)
        sha256, blob = digests(path)
        manifest[rel] = {"size": size, "sha256": sha256}
        if entry["size"] is not None and size != entry["size"]:
            problems.append({"file": rel, "problem": "size", "expected": "%d bytes" % entry["size"], "found": "%d bytes" % size})
        elif entry["sha256"] and sha256 != entry["sha256"]:
            problems.append({"file": rel, "problem": "sha256", "expected": "sha256 " + entry["sha256"][:16], "found": "sha256 " + sha256[:16]})
        elif not entry["sha256"] and entry["blob_id"] and blob != entry["blob_id"]:
            problems.append({"file": rel, "problem": "sha256", "expected": "git blob " + entry["blob_id"][:16], "found": "git blob " + blob[:16]})
    return manifest, problems


def main(argv):
    repo, revision, dest = argv[:3]
    from huggingface_hub import HfApi, snapshot_download  # pylint: disable=import-outside-toplevel

    api = HfApi()
    # The commit the revision names now; then what that commit holds: its tree carries each file's size, blob id and,
    # for LFS files, sha256.
    commit = api.model_info(repo, revision=revision).sha
    want = published(api.list_repo_tree(repo, revision=commit, recursive=True))
    result = {"repo": repo, "revision": revision, "commit": commit, "published": want}
    if "--manifest-only" not in argv:
        os.makedirs(dest, exist_ok=True)
        # The commit, not the revision's name: what was listed is what is fetched.
        snapshot_download(repo, revision=commit, local_dir=dest)
        result["files"], result["problems"] = prove(dest, want)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
