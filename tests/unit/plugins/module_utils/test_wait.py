"""The shared wait loop, on a fake monotonic clock."""

from __future__ import annotations

import pytest

from ansible_collections.gpulab.vllm.plugins.module_utils._wait import poll_until, validate_wait_options


class FakeTime(object):
    """A clock that only moves when the loop sleeps or a probe takes time."""

    def __init__(self, probe_cost=0.0):
        self.now = 1000.0
        self.probe_cost = probe_cost
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def probing(fake, answers):
    seen = []

    def probe(remaining):
        seen.append(remaining)
        fake.now += fake.probe_cost
        return answers[min(len(seen) - 1, len(answers) - 1)]

    return probe, seen


def test_without_wait_the_probe_runs_once_without_deadline():
    fake = FakeTime(probe_cost=0.2)
    probe, seen = probing(fake, [False])
    outcome = poll_until(probe, bool, False, 300, 0.5, clock=fake.clock, sleeper=fake.sleep)
    assert (outcome.ready, outcome.waited, outcome.polls, seen) == (False, False, 1, [None])
    assert outcome.elapsed == pytest.approx(0.2)
    assert fake.sleeps == []


def test_ready_at_the_third_poll_stops_there():
    fake = FakeTime(probe_cost=0.1)
    probe, seen = probing(fake, [False, False, True])
    outcome = poll_until(probe, bool, True, 60, 0.5, clock=fake.clock, sleeper=fake.sleep)
    assert (outcome.ready, outcome.polls, outcome.value) == (True, 3, True)
    assert fake.sleeps == [0.5, 0.5]
    assert outcome.elapsed == pytest.approx(3 * 0.1 + 2 * 0.5)
    assert outcome.as_dict() == {"waited": True, "elapsed": 1.3, "polls": 3}


def test_timeout_never_sleeps_past_the_deadline_and_hands_probes_the_time_left():
    fake = FakeTime(probe_cost=0.3)
    probe, seen = probing(fake, [False])
    outcome = poll_until(probe, bool, True, 2, 0.5, clock=fake.clock, sleeper=fake.sleep)
    assert not outcome.ready
    # 0.3 probe + 0.5 sleep per round: probes start at 0, 0.8, 1.6; the third ends at 1.9,
    # the loop sleeps the last 0.1 s and probes once more, which ends past the deadline.
    assert outcome.polls == 4
    assert fake.sleeps == pytest.approx([0.5, 0.5, 0.1])
    assert seen[0] == pytest.approx(2.0)
    assert seen[1] == pytest.approx(1.2)
    assert seen[-1] == pytest.approx(0.001)
    assert sum(fake.sleeps) + 4 * 0.3 == pytest.approx(outcome.elapsed)


def test_a_slow_probe_at_the_deadline_is_not_followed_by_another():
    fake = FakeTime(probe_cost=5.0)
    probe, seen = probing(fake, [False])
    outcome = poll_until(probe, bool, True, 3, 0.5, clock=fake.clock, sleeper=fake.sleep)
    assert (outcome.polls, fake.sleeps) == (1, [])
    assert outcome.elapsed == pytest.approx(5.0)


@pytest.mark.parametrize("timeout, sleep, words", [
    (0, 0.5, "wait_timeout must be greater than 0, got 0"),
    (-1, 0.5, "wait_timeout"),
    (10, 0, "wait_sleep must be greater than 0, got 0"),
    (10, -0.1, "wait_sleep"),
])
def test_bad_wait_options_are_named(timeout, sleep, words):
    assert words in validate_wait_options(timeout, sleep)


def test_good_wait_options_pass():
    assert validate_wait_options(1, 0.01) is None


def test_hopeless_value_ends_the_wait_at_once():
    from ansible_collections.gpulab.vllm.plugins.module_utils._wait import poll_until

    clock = iter(range(100)).__next__
    calls = []

    def probe(_remaining):
        calls.append(1)
        return "exited" if len(calls) >= 2 else "loading"

    outcome = poll_until(probe, lambda v: v == "ready", True, 60, 1, clock=lambda: float(clock()),
                         sleeper=lambda _s: None, is_hopeless=lambda v: v == "exited")
    assert outcome.value == "exited" and not outcome.ready and outcome.polls == 2
