# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wait options shared by gpulab.vllm's modules that wait for something to become ready.

Each module says what it waits for in its description and sets the defaults of O(wait_timeout)
and O(wait_sleep) that suit it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  wait:
    description:
      - Poll until what the module checks is ready, or fail after O(wait_timeout) with a message that says what was
        still missing. Without it the module reads once and reports.
    type: bool
    default: false
  wait_timeout:
    description:
      - Seconds to wait when O(wait=true). Must be greater than 0.
    type: int
  wait_sleep:
    description:
      - Seconds to sleep between two polls when O(wait=true), never past the deadline. Must be greater than 0.
      - Deadlines are kept on a monotonic clock.
    type: float
  progress_interval:
    description:
      - With O(wait=true), how often the wait reports on the controller what it is waiting for and what it has seen so
        far (one line per node at each interval). The collection's action plugin then runs the module in slices of this
        many seconds within O(wait_timeout), and stops at once when a slice ends early (a permanent error, or a
        server that exited). V(0) waits in one call, silently.
    type: float
    default: 30
  wait_resume:
    description:
      - What earlier slices of the same wait spent, C(elapsed) seconds and C(polls), and what they saw that the next
        slice must know (for M(gpulab.vllm.ray_cluster_facts), C(silent), since when each node's raylet has been silent
        to the head); set by the action plugin so that the result and its message count the whole wait. Not for playbooks.
    type: dict
"""
