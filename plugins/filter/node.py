# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the node role asks gpulab.vllm.node_facts about the files the other roles write."""

from __future__ import annotations


def files_with_digest(paths) -> list:
    """node_facts' files entries for paths, each asking for the file's SHA-1 (digest), in the order given.

    paths: files and folders the roles write, none holding a secret (node_files); a re-run compares each
    file's SHA-1 with what it would write and skips what is already there."""
    return [{"path": path, "digest": True} for path in paths]


class FilterModule:
    def filters(self):
        return {"files_with_digest": files_with_digest}
