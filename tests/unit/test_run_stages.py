"""The test runner's stages and their budgets (tests/README.md) agree: every stage has a budget, every budget a stage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("run_stages", ROOT / "tests" / "run_stages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stage_has_a_budget_and_every_budget_a_stage():
    runner = _runner()
    budgets = runner.budgets()
    stages = set(runner.stage_commands())
    assert set(budgets) == stages | {"images (background)", "total"}
    assert all(seconds > 0 for seconds in budgets.values())
    # The whole run's budget is the goal; no single stage may take all of it.
    assert max(seconds for name, seconds in budgets.items() if name != "total") < budgets["total"]


def test_the_seed_stage_runs_last_and_static_stages_beside_the_lab():
    runner = _runner()
    stages = list(runner.stage_commands())
    lab = [name for name in stages if name not in runner.STATIC]
    # The Ray-only scenario first, while today's vLLM image builds; then the lab stage; the seed's last.
    assert lab[-1] == "lab:seed" and lab[:2] == ["molecule:default", "lab"]
    # Only the seed's stage waits for every image, the Ray-only scenario for Ray's; the others for the first ones.
    waits = {name: [cmd[1] for cmd in runner.stage_commands()[name] if cmd[0] == "@images"] for name in lab}
    assert waits["lab:seed"] == ["all"] and waits["molecule:default"] == ["ray"]
    assert all(waits[name] == ["first"] for name in lab[1:-1])
    assert not any(cmd[0] == "@images" for name in runner.STATIC for cmd in runner.stage_commands()[name])
