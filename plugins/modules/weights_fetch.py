#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_fetch
short_description: Copy a model's files from a node that serves its verified copy, resumably, proving each file
version_added: 0.3.0
description:
  - Copies the files of O(files) into O(dest) from O(source), the copy server the weights role starts on a node (or
    on the controller) that holds a verified copy, in O(streams) parallel streams, the largest files first.
  - Each file arrives in a partial copy under C(DEST/.gpulab-partial) and is hashed as it arrives; only a file whose
    sha256 matches O(files) is moved into place. A file that arrives with other bytes is fetched once more from its
    first byte; twice wrong fails the copy.
  - A partial copy left by a call that ran out of time, or by a run that was cut off, is continued with a byte range
    from where it stopped.
  - Copies for at most O(slice) seconds and returns what is left; its action plugin calls it again and prints the
    bytes done, the rate and the time left between calls, until every file is in place or O(timeout) has passed.
  - The files it moved into place are added to the folder's stamp (O(stamp_file)), so that proving the folder right
    after reads none of them again.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  dest:
    description: The model folder on this node.
    type: path
    required: true
  source:
    description: The copy server, C(http://ADDRESS:PORT), on the fabric for a node, on the management network for the controller.
    type: str
    required: true
  source_name:
    description: The source's name for messages (the node, or C(the controller)).
    type: str
    default: the source
  token:
    description: The run's bearer token for the copy server; never logged.
    type: str
    required: true
  files:
    description: The files to copy, relative path to C(size) and C(sha256).
    type: dict
    required: true
  streams:
    description: Files copied at the same time.
    type: int
    default: 4
  slice:
    description: Seconds one call copies before it returns what is left (the action plugin's progress interval).
    type: float
    default: 30
  timeout:
    description: Seconds the whole copy may take (across calls); 0 for no limit.
    type: float
    default: 0
  progress_interval:
    description: Seconds between two progress lines on the controller; 0 copies in one call, silently.
    type: float
    default: 30
  stamp_file:
    description: The folder's stamp, to which each file moved into place is added; empty for none.
    type: path
    default: ""
extends_documentation_fragment:
  - gpulab.vllm.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is copied; the result says what would be.
  diff_mode:
    support: none
seealso:
  - module: gpulab.vllm.weights_manifest
"""

EXAMPLES = r"""
- name: Copy the files this node lacks from node1's verified copy, over the fabric
  gpulab.vllm.weights_fetch:
    dest: /opt/models/Qwen3.5-122B-A10B-FP8
    source: http://10.220.0.11:6390
    source_name: node1
    token: "{{ __weights_token }}"
    files: "{{ node1_manifest | dict2items | selectattr('key', 'in', missing) | items2dict }}"
    streams: 8
"""

RETURN = r"""
done:
  description: Whether every file is in place.
  type: bool
  returned: always
copied:
  description: Files moved into place by this call.
  type: list
  elements: str
  returned: always
left:
  description: Files not yet in place.
  type: list
  elements: str
  returned: always
received_bytes:
  description: Bytes received by this call.
  type: int
  returned: always
resumed_bytes:
  description: Bytes of partial copies this call continued from (not fetched again).
  type: int
  returned: always
left_bytes:
  description: Bytes still to receive.
  type: int
  returned: always
total_bytes:
  description: Bytes of every file of O(files).
  type: int
  returned: always
retried:
  description: Files that arrived with other bytes than O(files) says and were fetched again.
  type: list
  elements: str
  returned: always
seconds:
  description: Seconds this call copied.
  type: float
  returned: always
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights, _weights_fetch


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            source=dict(type="str", required=True),
            source_name=dict(type="str", default="the source"),
            token=dict(type="str", required=True, no_log=True),
            files=dict(type="dict", required=True),
            streams=dict(type="int", default=4),
            slice=dict(type="float", default=30.0),
            timeout=dict(type="float", default=0.0),
            progress_interval=dict(type="float", default=30.0),
            stamp_file=dict(type="path", default=""),
        ),
        supports_check_mode=True,
    )
    params = module.params
    files = params["files"]
    total = sum(int(entry.get("size", 0)) for entry in files.values())
    if module.check_mode:
        module.exit_json(changed=bool(files), done=not files, copied=[], left=sorted(files), received_bytes=0, resumed_bytes=0,
                         left_bytes=total, total_bytes=total, retried=[], seconds=0.0)
    started = time.monotonic()
    deadline = started + params["slice"] if params["slice"] > 0 else None
    copier = _weights_fetch.Copier(params["dest"], params["source"], params["token"], files, streams=params["streams"], deadline=deadline)
    copier.run()
    if copier.done and params["stamp_file"]:
        stamp = _weights.read_stamp(params["stamp_file"])
        stamp.update(copier.done)
        try:
            _weights.write_stamp(params["stamp_file"], stamp)
        except OSError as error:
            module.warn("the stamp %s could not be written (%s): the proof after the copy reads the files again" % (params["stamp_file"], error))
    left = copier.left
    left_bytes = sum(files[rel]["size"] for rel in left) - _weights_fetch.partial_bytes(params["dest"], {r: files[r] for r in left})
    result = dict(changed=bool(copier.done), done=not left and not copier.errors, copied=sorted(copier.done), left=left,
                  received_bytes=copier.received, resumed_bytes=copier.resumed, left_bytes=max(0, left_bytes), total_bytes=total,
                  retried=sorted(copier.retried), seconds=round(time.monotonic() - started, 3))
    if copier.errors:
        module.fail_json(msg="copying the model into %s from %s: %s" % (params["dest"], params["source_name"], "; ".join(copier.errors[:3])),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
