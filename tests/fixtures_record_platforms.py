"""Record what a Docker Engine says about image platforms, from this machine's Docker and a throwaway registry.

This is how tests/unit/fixtures/platforms/*.json was made; nothing there is written by hand. It needs no lab:
the Docker engine of this machine, Debian's docker-registry and the docker CLI. It starts its own registry on
127.0.0.1:--port (never the lab's), pushes two tiny images to it (one file each; one built for amd64, one for
arm64), an image index of both made by `docker manifest`, and the same two as OCI image manifests with an OCI index,
then records the Engine API's answers to the requests gpulab.vllm.node_facts sends:

  GET /version (the platform the daemon pulls for), /info (only Architecture and OSType are kept: the rest names
  the machine), /images/REF/json (the node's copy) and /distribution/REF/json (the registry's platforms, asked
  through the daemon) for each reference, and /distribution with and without credentials against the same
  registry restarted with basic authentication.

It leaves nothing behind: the registry and its storage, the images named archprobe/..., the CLI's manifest list.

  .venv/bin/python tests/fixtures_record_platforms.py docker20_amd64 --situation "..."
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from urllib.parse import quote

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt  # bcrypt for the registry's htpasswd (removed in Python 3.13; the venv is 3.11)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "collections"))

sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests"))

from ansible_collections.gpulab.vllm.plugins.module_utils import _node  # noqa: E402
from fixtures_record import docker_api, now  # noqa: E402  (the lab recorder's Engine API request, with curl)
from labkit import single_file_image  # noqa: E402

FIXTURES = REPO / "tests" / "unit" / "fixtures" / "platforms"
LAB_REGISTRY_PORT = 5055
NAME = "archprobe/platforms"
# The throwaway registry's only user; recorded as is (it guards nothing once the registry is gone).
USER, PASSWORD = "archprobe", "archprobe-not-a-secret"
S2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sh(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120, **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Registry:
    """Debian's docker-registry on 127.0.0.1:port, storage in folder, optionally with basic authentication."""

    def __init__(self, folder: Path, port: int):
        self.folder, self.port, self.proc = folder, port, None
        self.address = f"127.0.0.1:{port}"

    def start(self, auth: bool = False) -> None:
        conf = self.folder / ("registry-auth.yml" if auth else "registry.yml")
        text = (f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {self.folder / 'storage'}\n"
                f"http:\n  addr: {self.address}\nlog:\n  level: error\n")
        if auth:
            htpasswd = self.folder / "htpasswd"
            htpasswd.write_text(f"{USER}:{crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
            text += f"auth:\n  htpasswd:\n    realm: archprobe\n    path: {htpasswd}\n"
        conf.write_text(text)
        log = open(self.folder / "registry.log", "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1)
                return
            except urllib.error.HTTPError:
                return  # 401: up, with authentication
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"the registry on {self.address} did not start (see {self.folder}/registry.log)")

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def manifest(self, ref: str, accept: str) -> tuple[bytes, str]:
        request = urllib.request.Request(f"http://{self.address}/v2/{NAME}/manifests/{ref}", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.read(), answer.headers["Docker-Content-Digest"]

    def put_manifest(self, ref: str, doc: dict, media_type: str) -> tuple[str, int]:
        body = json.dumps(doc, indent=3).encode()
        request = urllib.request.Request(f"http://{self.address}/v2/{NAME}/manifests/{ref}", data=body, method="PUT",
                                         headers={"Content-Type": media_type})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.headers["Docker-Content-Digest"], len(body)


def make_images(work: Path, registry: Registry, made: list[str]) -> dict:
    """The images and the references to record, by role."""
    local = {arch: f"{NAME}:{arch}" for arch in ("amd64", "arm64")}
    if subprocess.run(["docker", "version", "--format", "{{.Server.Arch}}"], capture_output=True, text=True,
                      check=True).stdout.strip() != "amd64":
        raise SystemExit("record on an amd64 machine: the recording's node is amd64")
    notes = {}
    for arch, ref in local.items():
        how, notes[f"import_platform_{arch}_gave"] = single_file_image(ref, arch, work / arch)
        made.append(how)
    refs = {}
    for arch, ref in local.items():
        pushed = f"{registry.address}/{NAME}:{arch}"
        sh("docker", "tag", ref, pushed)
        sh("docker", "push", "-q", pushed)
        made.append(f"docker push {pushed}")
        refs[arch] = pushed
    refs["multi"] = f"{registry.address}/{NAME}:multi"
    sh("docker", "manifest", "create", "--insecure", refs["multi"], refs["amd64"], refs["arm64"])
    sh("docker", "manifest", "push", "--insecure", "--purge", refs["multi"])
    made.append(f"docker manifest create --insecure {refs['multi']} {refs['amd64']} {refs['arm64']}; "
                f"docker manifest push --insecure --purge {refs['multi']}")
    # The same images as OCI image manifests, and an OCI index of them (what BuildKit pushes).
    oci = {}
    for arch in ("amd64", "arm64"):
        raw, _digest = registry.manifest(arch, S2)
        manifest = json.loads(raw)
        doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
               "config": dict(manifest["config"], mediaType="application/vnd.oci.image.config.v1+json"),
               "layers": [dict(layer, mediaType="application/vnd.oci.image.layer.v1.tar+gzip") for layer in manifest["layers"]]}
        oci[arch] = registry.put_manifest(f"oci-{arch}", doc, OCI_MANIFEST)
        refs[f"oci_{arch}"] = f"{registry.address}/{NAME}:oci-{arch}"
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": oci["amd64"][0], "size": oci["amd64"][1],
         "platform": {"architecture": "amd64", "os": "linux"}},
        {"mediaType": OCI_MANIFEST, "digest": oci["arm64"][0], "size": oci["arm64"][1],
         "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}}]}
    registry.put_manifest("oci-multi", index, OCI_INDEX)
    refs["oci_multi"] = f"{registry.address}/{NAME}:oci-multi"
    made.append("PUT of OCI image manifests (oci-amd64, oci-arm64: the same config and layer) and of an OCI index "
                "of both (oci-multi) to the registry's manifest API")
    _raw, arm64_digest = registry.manifest("arm64", S2)
    _raw, multi_digest = registry.manifest("multi", "application/vnd.docker.distribution.manifest.list.v2+json")
    refs["arm64_by_digest"] = f"{registry.address}/{NAME}@{arm64_digest}"
    refs["multi_by_digest"] = f"{registry.address}/{NAME}@{multi_digest}"
    refs["missing_tag"] = f"{registry.address}/{NAME}:no-such-tag"
    refs["missing_repo"] = f"{registry.address}/archprobe/no-such-repo:1"
    refs["unreachable"] = f"127.0.0.1:{free_port()}/{NAME}:multi"
    refs["malformed"] = "not an image!"
    # The node pulls the index: the daemon takes the image of its own platform and keeps the index's digest.
    sh("docker", "pull", "-q", refs["multi"])
    made.append(f"docker pull {refs['multi']}")
    return {"refs": refs, "local": local, "notes": notes}


def record(args: argparse.Namespace) -> dict:
    if args.port == LAB_REGISTRY_PORT:
        raise SystemExit(f"port {LAB_REGISTRY_PORT} is the lab's registry; choose another --port")
    host = args.docker_host
    work = Path(tempfile.mkdtemp(prefix="archprobe-"))
    registry = Registry(work, args.port)
    made: list[str] = []
    refs, local = {}, {}
    try:
        registry.start()
        images = make_images(work, registry, made)
        refs, local = images["refs"], images["local"]
        quoted = {role: quote(ref, safe="/:@") for role, ref in refs.items()}
        version = docker_api(host, "/version")
        info = docker_api(host, "/info")
        info["body"] = {key: (info["body"] or {}).get(key) for key in ("Architecture", "OSType")}
        info["kept"] = "Architecture and OSType; the rest of the answer names the machine"
        distribution = {role: docker_api(host, f"/distribution/{quoted[role]}/json") for role in refs}
        inspect = {role: docker_api(host, f"/images/{quoted[role]}/json") for role in refs}
        registry.stop()
        registry.start(auth=True)
        config = {"auths": {registry.address: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}
        wrong = {"auths": {registry.address: {"auth": base64.b64encode(f"{USER}:wrong".encode()).decode()}}}
        header = _node.registry_auth_header(_node.registry_credentials(refs["multi"], config, lambda *unused: None))
        wrong_header = _node.registry_auth_header(_node.registry_credentials(refs["multi"], wrong, lambda *unused: None))
        auth = {
            "config_json": config,
            "how": "the registry restarted with htpasswd authentication (user %s); X-Registry-Auth (not recorded) built by "
                   "_node.registry_credentials and _node.registry_auth_header from config_json (or from it with a "
                   "wrong password)" % USER,
            "without_credentials": docker_api(host, f"/distribution/{quoted['multi']}/json"),
            "with_credentials": docker_api(host, f"/distribution/{quoted['multi']}/json", header),
            "wrong_credentials": docker_api(host, f"/distribution/{quoted['multi']}/json", wrong_header),
        }
    finally:
        registry.stop()
        cleanup(work, refs, local)
    return {
        "kind": "platforms",
        "name": args.name,
        "recorded_at": now(),
        "situation": args.situation,
        "docker_host": args.docker_host,
        "registry": registry.address,
        "made": made,
        "notes": images["notes"],
        "refs": refs,
        "version": version,
        "info": info,
        "distribution": distribution,
        "images": inspect,
        "auth": auth,
    }


def cleanup(work: Path, refs: dict, local: dict) -> None:
    names = [ref for role, ref in refs.items() if role in ("amd64", "arm64", "multi")] + list(local.values())
    for name in names:
        subprocess.run(["docker", "image", "rm", name], capture_output=True, check=False)
    if refs.get("multi"):
        subprocess.run(["docker", "manifest", "rm", refs["multi"]], capture_output=True, check=False)
    shutil.rmtree(work, ignore_errors=True)
    left = sh("docker", "image", "ls", "--format", "{{.Repository}}", "--filter", "reference=*archprobe*").stdout
    left += sh("docker", "image", "ls", "--format", "{{.Repository}}", "--filter", "reference=*/archprobe/*").stdout
    if left.strip():
        print("left behind, remove by hand: " + " ".join(left.split()), file=sys.stderr)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("--situation", required=True, help="the machine and its engine, in words")
    parser.add_argument("--docker-host", default="unix:///var/run/docker.sock")
    parser.add_argument("--port", type=int, default=5077, help="the throwaway registry's port on 127.0.0.1")
    args = parser.parse_args(argv)
    result = record(args)
    text = json.dumps(result, indent=2, sort_keys=True)
    for pattern in (re.escape(str(REPO)), re.escape(tempfile.gettempdir() + "/archprobe-"),
                    r"\b%s\b" % re.escape(socket.gethostname())):
        if re.search(pattern, text):
            raise SystemExit(f"the recording holds {pattern!r}, which names this machine; not written")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    target = FIXTURES / (args.name + ".json")
    target.write_text(text + "\n")
    print("recorded %s" % target.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
