# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: file_state
short_description: Whether a file on the controller is in place, read in the controller's own process
version_added: 0.4.0
description:
  - For a path on the controller, whether it is a regular file, its mode (octal string), the SHA-1 of its content and
    the mode of the folder that holds it, so that a play can skip writing a controller file already in place without
    a module run. The content itself is never returned.
author:
  - gpulab.vllm maintainers (!UNKNOWN)
options:
  _terms:
    description: Paths on the controller (C(~) is expanded).
    required: true
"""

EXAMPLES = r"""
- name: Write the client file unless it is in place
  ansible.builtin.copy:
    dest: ~/.config/gpulab/lab.env
    content: "{{ content }}"
    mode: "0600"
  when: lookup('gpulab.vllm.file_state', '~/.config/gpulab/lab.env').sha1 != content | hash('sha1')
"""

RETURN = r"""
_raw:
  description: Per path, C(exists), C(mode), C(sha1) (null when not a regular file) and C(dir_mode) (null without a folder).
  type: list
  elements: dict
"""

import hashlib
import os
import stat

from ansible.plugins.lookup import LookupBase


def describe(path):
    """What the lookup returns for one path."""
    found = {"exists": False, "mode": None, "sha1": None, "dir_mode": None}
    try:
        found["dir_mode"] = "%04o" % stat.S_IMODE(os.stat(os.path.dirname(path) or ".").st_mode)
        info = os.stat(path)
    except OSError:
        return found
    found.update(exists=True, mode="%04o" % stat.S_IMODE(info.st_mode))
    if stat.S_ISREG(info.st_mode):
        digest = hashlib.sha1()
        try:
            with open(path, "rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
            found["sha1"] = digest.hexdigest()
        except OSError:
            pass
    return found


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [describe(os.path.expanduser(str(term))) for term in terms]
