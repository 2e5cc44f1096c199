#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_manifest
short_description: Prove a model folder file by file against the manifest it must match
version_added: 0.3.0
description:
  - Reads the model folder O(path) on the node and returns its manifest, every file's size and sha256.
  - A stamp file (O(stamp_file)) keeps the manifest with each file's mtime from the last read; a file whose size and
    mtime still match its stamp is not read again (unless O(full)), so that proving a verified folder of 119 GB a
    second time takes a second. Files that changed, or that the stamp does not know, are hashed.
  - With O(expected), lists every file that is missing, of another size (truncated) or of other bytes, and the shards
    that a safetensors index of the folder names and the folder lacks.
  - Reports the free bytes of the file system that holds (or would hold) the folder, and the bytes partial copies
    left by a cut-off copy already hold, so that a caller can refuse a node without room before the first byte.
  - Files and folders whose names start with C(.gpulab) (stamps, partial copies) and the hub client's C(.cache) and
    C(.git) folders are not part of the model.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  path:
    description: The model folder; it need not exist (then every expected file is missing).
    type: path
    required: true
  expected:
    description:
      - The manifest the folder must match, file path (relative, with C(/)) to C(size) and C(sha256); a file without
        C(sha256) is judged on its size alone.
    type: dict
  stamp_file:
    description:
      - Where the stamp of this folder is kept (written when the manifest changed, never in check mode). Empty for
        none (every file is hashed).
    type: path
    default: ""
  full:
    description: Hash every file, whatever the stamp says (a proof that trusts no mtime).
    type: bool
    default: false
  manifest:
    description: Whether to return the manifest itself (a large folder has many files).
    type: bool
    default: true
extends_documentation_fragment:
  - gpulab.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It only reads the model; in check mode the stamp is not written.
  diff_mode:
    support: none
notes:
  - A file changed in place without a new size or mtime (a tool that restores the mtime) is found only with O(full).
seealso:
  - module: gpulab.vllm.weights_fetch
"""

EXAMPLES = r"""
- name: Prove this node's copy of the model against the source's manifest
  gpulab.vllm.weights_manifest:
    path: /opt/models/Qwen3.5-122B-A10B-FP8
    expected: "{{ source_manifest }}"
    stamp_file: /opt/models/.gpulab-stamps/qwen.json
  register: __copy
"""

RETURN = r"""
files:
  description: The manifest, file to C(size) and C(sha256) (empty with O(manifest=false)).
  type: dict
  returned: always
  sample: {"model-00001-of-00002.safetensors": {"size": 4096, "sha256": "9f86d0..."}}
count:
  description: Number of the model's files in the folder.
  type: int
  returned: always
total_bytes:
  description: Bytes of the model's files in the folder.
  type: int
  returned: always
hashed:
  description: Files read and hashed this time (the others were trusted from the stamp).
  type: list
  elements: str
  returned: always
problems:
  description: Each file that differs from O(expected), and each shard a safetensors index of the folder names
    and the folder lacks, as C(file), C(problem) (missing, size, sha256, index), C(expected) and C(found).
  type: list
  elements: dict
  returned: always
problem_lines:
  description: "Each problem as one phrase, e.g. C(model-00002.safetensors: truncated (expected 4096 bytes, found 1000 bytes))."
  type: list
  elements: str
  returned: always
needed_bytes:
  description: With O(expected), the bytes a copy of the differing files must still write (what partial copies hold
    already subtracted).
  type: int
  returned: always
partial_bytes:
  description: Bytes held by partial copies of the differing files.
  type: int
  returned: always
free_bytes:
  description: Free bytes (for an unprivileged writer) on the file system of the folder or of its nearest parent.
  type: int
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            expected=dict(type="dict"),
            stamp_file=dict(type="path", default=""),
            full=dict(type="bool", default=False),
            manifest=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    root = params["path"]
    expected = params["expected"]
    if expected is not None:
        bad = [rel for rel, entry in expected.items()
               if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or rel.startswith("/") or ".." in rel.split("/")]
        if bad:
            module.fail_json(msg="expected: entries %s are not relative file paths with an integer size" % ", ".join(sorted(bad)[:5]))
    try:
        # In check mode the stamp is read, not written.
        result = _weights.read_folder(root, params["stamp_file"], expected=expected, full=params["full"],
                                      with_manifest=params["manifest"], write=not module.check_mode, warn=module.warn)
    except OSError as error:
        module.fail_json(msg="cannot read the model folder %s: %s" % (root, error))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
