"""tests/MANIFEST.md stays true: every pytest id it names as where a test went exists, and every lab test of today
appears in it (kept, moved there or new), so that a test dropped or renamed without a word fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_manifest_names_only_tests_that_exist_and_every_lab_test():
    manifest = (ROOT / "tests" / "MANIFEST.md").read_text()
    now = set()
    # Two sessions, as the stages collect them: the unit tests' conftest and the lab tests' share a module name.
    for paths in (["tests/unit", "bench/tests", "tests/collection"], ["tests/integration"]):
        collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
                                   cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
        assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
        now |= {line for line in collected.stdout.splitlines() if "::" in line}
    assert len(now) > 500
    moved = manifest.split("## Moved pytest ids", 1)[1].split("## Molecule verify tasks", 1)[0]
    destinations = {name for line in moved.splitlines() if line.startswith("| `")
                    for name in re.findall(r"`(tests/[^`]+?)`", line.split(" | ", 1)[1])}
    assert destinations, "the manifest lists no moved test"
    assert destinations <= now, f"the manifest names tests that do not exist: {sorted(destinations - now)}"
    listed = set(re.findall(r"`(tests/[^`]+?::[^`]+?)`", manifest))
    lab_now = {name for name in now if name.startswith("tests/integration/")}
    assert lab_now <= listed, f"lab tests the manifest does not mention: {sorted(lab_now - listed)}"
