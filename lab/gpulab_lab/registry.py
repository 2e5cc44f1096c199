# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's image registry (Debian's docker-registry) on the machine, reached by the nodes over the management bridge."""

from __future__ import annotations

import hashlib
import http.client
import json
import posixpath
import subprocess
import tarfile
import urllib.parse
import urllib.request

from .common import BUILD, CACHE, RUN, LabError, pid_alive, wait_for
from .config import LabConfig


def start_registry(cfg: LabConfig) -> None:
    pidfile = RUN / "registry.pid"
    if pid_alive(pidfile):
        return
    storage = CACHE / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    conf = RUN / "registry.yml"
    # Listens on all addresses: the machine pushes over loopback, the nodes pull
    # over the management bridge. No authentication: it only holds lab images.
    conf.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: :{cfg.registry_port}\n"
    )
    (BUILD / "lab" / "logs").mkdir(parents=True, exist_ok=True)
    logf = open(BUILD / "lab" / "logs" / "registry.log", "ab")
    proc = subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=logf, stderr=logf, start_new_session=True)
    pidfile.write_text(str(proc.pid))

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{cfg.registry_port}/v2/", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(answers, 30, f"the lab registry on port {cfg.registry_port} (log: build/lab/logs/registry.log)")


# The lab's images travel uncompressed: the registry sits on this machine and the nodes pull over a bridge, so gzip
# (what `docker push` always applies, one core at about 20 MB/s here) is only cost: 3 minutes for today's vLLM image
# and 6 for the seed's on push, and as much again to inflate it on every node. A Docker daemon inflates whatever a
# layer holds (it reads the stream's first bytes), so a plain tar is pulled as it is.
LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
CONFIG_JSON = "application/vnd.docker.container.image.v1+json"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
_CHUNK = 4 << 20


def _request(cfg: LabConfig, method: str, path: str, body=None, headers: dict | None = None,
             size: int | None = None) -> http.client.HTTPResponse:
    """One request to the lab registry; a body that is a file is streamed in chunks (size given), its SHA-256 kept on
    the response as .sha256."""
    conn = http.client.HTTPConnection("127.0.0.1", cfg.registry_port, timeout=120)
    conn.putrequest(method, path)
    for name, value in (headers or {}).items():
        conn.putheader(name, value)
    digest = hashlib.sha256()
    if hasattr(body, "read"):
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        left = size
        while left:
            chunk = body.read(min(_CHUNK, left))
            if not chunk:
                raise LabError(f"the image stream ended {left} bytes before its layer did")
            digest.update(chunk)
            conn.send(chunk)
            left -= len(chunk)
    else:
        data = body or b""
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        digest.update(data)
    answer = conn.getresponse()
    answer.read()
    answer.sha256 = "sha256:" + digest.hexdigest()
    conn.close()
    return answer


def _put_blob(cfg: LabConfig, repo: str, body, size: int) -> str:
    """Upload one blob (a file streamed, or bytes); its digest."""
    started = _request(cfg, "POST", f"/v2/{repo}/blobs/uploads/")
    if started.status != 202:
        raise LabError(f"the lab registry refused an upload to {repo}: HTTP {started.status}")
    location = urllib.parse.urlsplit(started.headers["Location"])
    sent = _request(cfg, "PATCH", f"{location.path}?{location.query}", body, {"Content-Type": "application/octet-stream"}, size)
    if sent.status != 202:
        raise LabError(f"the lab registry took no data for {repo}: HTTP {sent.status}")
    location = urllib.parse.urlsplit(sent.headers["Location"])
    query = f"{location.query}&" if location.query else ""
    done = _request(cfg, "PUT", f"{location.path}?{query}digest={urllib.parse.quote(sent.sha256)}")
    if done.status != 201:
        raise LabError(f"the lab registry did not keep a blob of {repo}: HTTP {done.status}")
    return sent.sha256


def push_uncompressed(cfg: LabConfig, local_ref: str, repo: str, tag: str) -> str:
    """Put a local image into the lab registry as REPO:TAG with plain-tar layers, streamed from `docker save`; a layer's
    digest is its diff ID, which the image's configuration names (checked). Returns the manifest's digest."""
    inspected = json.loads(subprocess.run(["docker", "image", "inspect", local_ref], capture_output=True, text=True,
                                          check=True).stdout)[0]
    diff_ids = inspected["RootFS"]["Layers"]
    save = subprocess.Popen(["docker", "save", local_ref], stdout=subprocess.PIPE)
    sizes, config, order = {}, None, None
    try:
        with tarfile.open(fileobj=save.stdout, mode="r|") as stream:
            for member in stream:
                if member.name.endswith("/layer.tar") and member.isfile():
                    # Which layer this is shows only once it is read (the registry keeps one copy of a blob it
                    # holds already); its place in the manifest comes with manifest.json, at the end.
                    sizes[member.name] = (_put_blob(cfg, repo, stream.extractfile(member), member.size), member.size)
                elif member.name.endswith("/layer.tar") and member.issym():  # a layer the image holds twice
                    sizes[member.name] = sizes[posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))]
                elif member.name == "manifest.json":
                    order = json.load(stream.extractfile(member))[0]
                elif member.name.endswith(".json") and "/" not in member.name:
                    config = stream.extractfile(member).read()
    finally:
        save.stdout.close()
        if save.wait() != 0:
            raise LabError(f"docker save {local_ref} failed (exit {save.returncode})")
    if order is None or config is None:
        raise LabError(f"docker save {local_ref} gave no manifest or no image configuration")
    layers = [sizes[name] for name in order["Layers"]]
    if [digest for digest, _size in layers] != diff_ids:
        raise LabError(f"the layers docker save gave for {local_ref} are not the image's diff IDs")
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    _put_blob(cfg, repo, config, len(config))
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_V2,
        "config": {"mediaType": CONFIG_JSON, "size": len(config), "digest": config_digest},
        "layers": [{"mediaType": LAYER_TAR, "size": size, "digest": digest} for digest, size in layers],
    }).encode()
    put = _request(cfg, "PUT", f"/v2/{repo}/manifests/{tag}", manifest, {"Content-Type": MANIFEST_V2})
    if put.status != 201:
        raise LabError(f"the lab registry refused the manifest of {repo}:{tag}: HTTP {put.status}")
    return "sha256:" + hashlib.sha256(manifest).hexdigest()
