# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weights role's plan of copies and its byte counts, as filters (module_utils._weights does the work)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights


def weights_plan(holders, targets):
    """Rounds of copies, each {target: holder}; every node that received a copy serves in the next round."""
    try:
        return _weights.spread_plan(list(holders or []), list(targets or []))
    except ValueError as error:
        raise AnsibleFilterError(str(error))


def human_bytes(count):
    return _weights.human_bytes(int(count or 0))


def weights_problem(problem):
    """One problem of a proof as a phrase: 'FILE: truncated (expected N bytes, found M bytes)'."""
    return _weights.describe(problem)


class FilterModule:
    def filters(self):
        return {"weights_plan": weights_plan, "human_bytes": human_bytes, "weights_problem": weights_problem}
