"""The Docker daemon recorded by tests/fixtures_record_platforms.py, replayed for _node's requests."""

from __future__ import annotations

import base64
import json

from conftest import load_fixture
from ansible_collections.gpulab.vllm.plugins.module_utils import _node

RECORD = load_fixture("platforms", "docker20_amd64")
REFS = RECORD["refs"]


def replay(record=RECORD, version=None, auth=None, no_images=False):
    """A docker_get that answers as the recorded daemon did, and the list of (path, headers) it was asked.

    version replaces fields of the recorded /version answer (to stand for another node); no_images answers
    every image inspection as the daemon answered for the missing tag (a node that has none of the images);
    with auth, the registry is the recorded one with basic authentication: /distribution answers as recorded
    with the credentials given, without any, or with wrong ones."""
    answers = {record["version"]["path"]: record["version"]}
    answers.update((item["path"], item) for item in record["images"].values())
    answers.update((item["path"], item) for item in record["distribution"].values())
    calls = []

    def docker_get(docker_host, path, timeout, headers=None):
        assert docker_host == record["docker_host"]
        calls.append((path, dict(headers or {})))
        if no_images and path.startswith("/images/"):
            return record["images"]["missing_tag"]["status"], record["images"]["missing_tag"]["body"]
        if path == record["version"]["path"] and version:
            return 200, dict(record["version"]["body"], **version)
        if auth and path.startswith("/distribution/"):
            header = (headers or {}).get("X-Registry-Auth")
            if not header:
                answer = auth["without_credentials"]
            else:
                sent = json.loads(base64.urlsafe_b64decode(header))
                right = _node.registry_credentials(REFS["multi"], auth["config_json"], lambda *unused: None)
                answer = auth["with_credentials"] if sent == right else auth["wrong_credentials"]
            return answer["status"], answer["body"]
        return answers[path]["status"], answers[path]["body"]

    return docker_get, calls
