# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stamp of a container's settings, and whether a running container carries it.

A role puts the stamp of the settings it asks Docker for on the container it creates (a label). A later run that
asks for the same settings finds the same stamp on a running container of the same image in the node read it made
anyway, and need not ask Docker whether anything would change (a module run per container on every re-run).
"""

from __future__ import annotations

import hashlib
import json

# The label that carries the stamp.
STAMP_LABEL = "org.gpulab.vllm.settings"


def container_stamp(settings: dict) -> str:
    """'sha256:' and the hash of the settings as canonical JSON (keys sorted, no spaces): the same settings always
    give the same stamp, whatever order the keys came in; anything else gives another."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def container_carries(read: dict, stamp: str, image_id: str) -> bool:
    """Whether a container in a node read (node_facts' entry for it) runs the image image_id with the stamp."""
    read = read or {}
    return bool(read.get("running") and image_id and read.get("image_id") == image_id
                and (read.get("labels") or {}).get(STAMP_LABEL) == stamp)


class FilterModule:
    def filters(self):
        return {"container_stamp": container_stamp, "container_carries": container_carries}
