# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: weights_stamped
short_description: A model folder on the controller, read from its stamp when the stamp vouches for every file
version_added: 0.4.0
description:
  - Returns what M(gpulab.vllm.weights_manifest) would return for a folder on the controller (its manifest, file
    count, bytes, the shards its safetensors index names and it lacks), read in the controller's own process.
  - Only when the stamp vouches for every file (same size and mtime as when it was hashed, no file added or gone);
    otherwise it returns an empty dict, and the caller runs the module, which hashes what changed and writes the stamp.
  - A verified folder is thus proven again without a module run; nothing is written.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  _terms:
    description: The model folder on the controller.
    required: true
  stamp_file:
    description: The folder's stamp, as given to M(gpulab.vllm.weights_manifest).
    type: path
    required: true
"""

EXAMPLES = r"""
- name: The source's manifest, if its stamp vouches for it
  ansible.builtin.set_fact:
    source_read: "{{ lookup('gpulab.vllm.weights_stamped', '/models/qwen', stamp_file='~/.cache/gpulab/stamp.json') }}"
"""

RETURN = r"""
_raw:
  description: The module's answer (files, count, total_bytes, problems, problem_lines, free_bytes), or an empty dict.
  type: list
  elements: dict
"""

import os

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if not kwargs.get("stamp_file"):
            raise AnsibleError("weights_stamped: give stamp_file, the folder's stamp")
        stamp_file = os.path.expanduser(str(kwargs["stamp_file"]))
        answers = []
        for term in terms:
            root = os.path.expanduser(str(term))
            try:
                found = _weights.read_folder(root, stamp_file, hash_allowed=False, write=False)
            except OSError as error:
                raise AnsibleError("weights_stamped: cannot read %s: %s" % (root, error))
            answers.append(found or {})
        return answers
