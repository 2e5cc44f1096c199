"""The lab's model as a folder, and each node's own disk for it.

Real nodes each have their own disk; lab nodes share the machine's. So that copying the model from one node to
another means something in the lab, every node sees its own folder at DATA_MOUNT (bound there in the mount
namespaces of its sshd and its dockerd), and `labctl.py disk NODE SIZE` puts a small file system there to show a
node without room.

The lab's model for the weights role is the tiny Llama the lab vLLM image holds, taken from the image's own layer in
the lab registry (no image pull), and split into shards with a safetensors index, as the large models are.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import tarfile
import urllib.request
from pathlib import Path

from .common import BUILD, LabError, log, node_dirs, pid_alive, run
from .config import LAB_IMAGES, LabConfig
from .images import MANIFEST_V2, _registry_get

# Where each lab node sees its own data folder (the machine's is an empty mount point).
DATA_MOUNT = Path("/srv/gpulab-lab")
NODE_DATA = BUILD / "lab" / "node-data"
MODELS = BUILD / "lab" / "models"
MODEL_NAME = "tiny-llama"
SHARDS = 3


def node_data(name: str) -> Path:
    return NODE_DATA / name


def bind_data_command(name: str) -> str:
    """Shell words, for a node namespace's start script, that bind the node's data folder onto DATA_MOUNT."""
    return f'mkdir -p "{node_data(name)}" && mount --bind "{node_data(name)}" "{DATA_MOUNT}"'


def prepare_data(names) -> None:
    DATA_MOUNT.mkdir(parents=True, exist_ok=True)
    for name in names:
        node_data(name).mkdir(parents=True, exist_ok=True)


def _model_layer(cfg: LabConfig, key: str) -> str:
    """The digest of the image layer that holds /models (the image's `RUN .../make_tiny_model.py /models/...`)."""
    image = LAB_IMAGES[key]
    found = _registry_get(cfg, f"{image.repo}/manifests/{image.tag}", MANIFEST_V2)
    if found is None:
        raise LabError(f"the lab registry has no {image.repo}:{image.tag}; run `lab/labctl.py build {key}` first")
    manifest = found[1]
    config = _registry_get(cfg, f"{image.repo}/blobs/{manifest['config']['digest']}")
    history = [h for h in (config[1].get("history") or []) if not h.get("empty_layer")] if config else []
    layers = manifest.get("layers") or []
    for entry, layer in zip(history, layers):
        if "make_tiny_model.py /models/" in entry.get("created_by", ""):
            return layer["digest"]
    raise LabError(f"no layer of {image.repo}:{image.tag} makes /models; is it the lab vLLM image?")


def _split_safetensors(source: Path, out: Path, shards: int) -> dict:
    """Split one safetensors file into `shards` files (tensors kept whole) and return the index's weight map."""
    data = source.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", None)
    body = data[8 + length:]
    names = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for number, group in enumerate(groups, start=1):
        file_name = "model-%05d-of-%05d.safetensors" % (number, shards)
        new_header, chunks, offset = {}, [], 0
        for name in group:
            start, end = header[name]["data_offsets"]
            new_header[name] = dict(header[name], data_offsets=[offset, offset + end - start])
            chunks.append(body[start:end])
            offset += end - start
            weight_map[name] = file_name
        if metadata is not None:
            new_header["__metadata__"] = metadata
        encoded = json.dumps(new_header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)
        (out / file_name).write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))
    return weight_map


def model_folder(cfg: LabConfig, key: str = "vllm") -> Path:
    """The lab's model, in shards with an index, on the controller (made once from the registry's image layer).

    One folder per image: each image's model was saved by its own transformers, whose tokenizer files an older
    transformers (the seed's) may not read."""
    target = MODELS / key / MODEL_NAME
    if (target / "model.safetensors.index.json").exists():
        return target
    digest = _model_layer(cfg, key)
    url = f"http://127.0.0.1:{cfg.registry_port}/v2/{LAB_IMAGES[key].repo}/blobs/{digest}"
    with urllib.request.urlopen(url, timeout=60) as answer:
        blob = answer.read()
    staging = MODELS / key / (MODEL_NAME + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    prefix = f"models/{MODEL_NAME}/"
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.startswith(prefix) and "/" not in member.name[len(prefix):]:
                (staging / member.name[len(prefix):]).write_bytes(archive.extractfile(member).read())
    single = staging / "model.safetensors"
    if not single.exists():
        raise LabError(f"the image layer {digest} holds no {prefix}model.safetensors")
    weight_map = _split_safetensors(single, staging, SHARDS)
    single.unlink()
    total = sum(p.stat().st_size for p in staging.glob("model-*.safetensors"))
    (staging / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    log(f"model: {target} ({SHARDS} shards, {total} bytes of weights) from the image layer {digest[:19]}")
    return target


def set_disk(cfg: LabConfig, name: str, size: str) -> None:
    """Give a node a small file system of `size` (tmpfs, e.g. 2M) at DATA_MOUNT, or `off` for its own folder again."""
    if name not in cfg.node_names:
        raise LabError(f"no lab node named {name!r}; the lab has {cfg.node_names}")
    pids = [pid_alive(node_dirs(name)["run"] / f) for f in ("sshd.pid", "docker.pid")]
    if None in pids:
        raise LabError(f"the sshd or dockerd of {name} is not running; bring the lab up first")
    for pid in pids:
        in_ns = ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--"]
        # The node's own folder is bound there first; a small file system goes on top of it.
        while "tmpfs" in run([*in_ns, "findmnt", "-n", "-o", "FSTYPE", str(DATA_MOUNT)], check=False).stdout.split():
            run([*in_ns, "umount", str(DATA_MOUNT)])
        if size != "off":
            run([*in_ns, "mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "gpulab-lab-disk", str(DATA_MOUNT)])
