# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpulab.vllm maintainers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One wait loop for every gpulab.vllm module that waits for something.

Private to gpulab.vllm. The loop uses a monotonic clock (wall-clock jumps on a
freshly booted host must not end or stretch a wait), always polls at least
once, never sleeps past the deadline, and tells the probe how much time is
left so that a single slow poll cannot overrun the timeout by much.
"""

from __future__ import annotations

import time


class WaitOutcome(object):
    """What a wait ended with: the last value, whether it was ready, and the cost."""

    __slots__ = ("value", "ready", "waited", "elapsed", "polls")

    def __init__(self, value, ready, waited, elapsed, polls):
        self.value = value
        self.ready = ready
        self.waited = waited
        self.elapsed = elapsed
        self.polls = polls

    def as_dict(self):
        return {"waited": self.waited, "elapsed": round(self.elapsed, 3), "polls": self.polls}


def validate_wait_options(timeout, sleep):
    """Return an error message for bad wait options, or None."""
    if timeout is None or timeout <= 0:
        return "wait_timeout must be greater than 0, got %r" % (timeout,)
    if sleep is None or sleep <= 0:
        return "wait_sleep must be greater than 0, got %r" % (sleep,)
    return None


def poll_until(probe, is_ready, wait, timeout, sleep, clock=None, sleeper=None, is_hopeless=None, resume=None):
    """Call ``probe(remaining_seconds)`` until ``is_ready(value)`` or the timeout.

    With ``wait`` false the probe runs exactly once. ``remaining_seconds`` is
    ``None`` then (no deadline); with ``wait`` it is the time left before the
    deadline, at least a small positive number. ``is_hopeless(value)``, when
    given, ends the wait early: waiting longer cannot help (a server that exited).
    ``resume``, a dict with ``elapsed`` and ``polls``, is what earlier calls of the
    same wait spent (the collection's action plugins wait in slices and report
    progress between them): the outcome counts them in. ``clock`` and ``sleeper``
    default to this module's ``time.monotonic`` and ``time.sleep``, looked up
    at each call.
    """
    clock = clock or time.monotonic
    sleeper = sleeper or time.sleep
    before = resume or {}
    before_elapsed, before_polls = float(before.get("elapsed") or 0), int(before.get("polls") or 0)
    started = clock()
    deadline = started + timeout if wait else None
    polls = 0
    while True:
        remaining = None if deadline is None else max(deadline - clock(), 0.001)
        value = probe(remaining)
        polls += 1
        ready = bool(is_ready(value))
        now = clock()
        hopeless = not ready and is_hopeless is not None and bool(is_hopeless(value))
        if ready or hopeless or deadline is None or now >= deadline:
            return WaitOutcome(value, ready, bool(wait), before_elapsed + now - started, before_polls + polls)
        sleeper(min(sleep, deadline - now))
