"""The fault matrix's rows that no other lab test covers (bench/faults.py, `make bench --steps faults` times them):
each fault seeded on the lab, the deploy run, its last error line must name the node, the component and the fix,
and nothing may have started past the stage that stopped it. No timing here: the benchmark has the figures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from labkit import BIN, LAB_INVENTORY, ROOT, playbook_env

sys.path.insert(0, str(ROOT / "bench"))
import faults  # noqa: E402

pytestmark = pytest.mark.lab

ROWS = [fault for fault in faults.FAULTS if fault.test.startswith("tests/integration/test_faults.py::test_fault_is_named")]


def _play(name: str, *extra: str, inventory=LAB_INVENTORY) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / "ansible-playbook", "-i", inventory, ROOT / "playbooks" / name, *extra],
                          cwd=ROOT, env=playbook_env(), capture_output=True, text=True, check=False, timeout=1200)


@pytest.mark.parametrize("fault", ROWS, ids=[fault.key for fault in ROWS])
def test_fault_is_named(fault, tmp_path):
    import json  # noqa: PLC0415

    _play("teardown.yml")
    try:
        if fault.needs_serving:
            warm = _play("deploy_qwen35.yml")
            assert warm.returncode == 0, warm.stdout[-3000:]
        seeded = fault.seed()
        try:
            inventory = faults.inventory_with(seeded.hostvars, tmp_path / "inventory") if seeded.hostvars else LAB_INVENTORY
            extra = ["-e", json.dumps(seeded.extra)] if seeded.extra else []
            run = _play(fault.playbook, *extra, inventory=inventory)
        finally:
            containers = faults.containers_now()
            seeded.undo()
        verdict = faults.judge(fault, run.stdout, containers)
        assert run.returncode != 0, run.stdout[-3000:]
        assert verdict["named"], "%s: the last error line does not name it: %s\n%s" % (fault.key, verdict["said"], run.stdout[-3000:])
        assert not verdict["started_past_stage"], "%s: started past the %s stage: %s" % (
            fault.key, fault.stage, verdict["started_past_stage"])
        assert "Traceback" not in run.stdout
    finally:
        _play("teardown.yml")
