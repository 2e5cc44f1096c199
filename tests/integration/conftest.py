"""Chains (labkit.Chain): one deployment shared by the lab tests that only read it, or break it and repair it by a re-run.

A chain module defines a module-scoped `chain` fixture (a Chain) and links: tests that ask for `link` and run in the
order they are written. When a link fails, every link after it fails at once, naming the link it could not run
behind: a broken chain is never a silent skip, and never a cascade of confusing errors.
"""

from __future__ import annotations

import pytest

from labkit import Chain


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
    outcome = yield
    report = outcome.get_result()
    chain = getattr(item, "funcargs", {}).get("link")
    if isinstance(chain, Chain) and report.failed and chain.broken_by is None:
        chain.broken_by = item.name


@pytest.fixture()
def link(chain: Chain) -> Chain:
    """The chain, for a link: fails at once behind a link that failed."""
    if chain.broken_by is not None:
        pytest.fail(f"not run: the {chain.name} chain broke at {chain.broken_by}, which this link runs behind",
                    pytrace=False)
    return chain
