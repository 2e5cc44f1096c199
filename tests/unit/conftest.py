"""Shared helpers of the unit tests: imports through build/collections, recorded fixtures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / "build" / "collections"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# pytest.ini sets the same path; this keeps `pytest tests/unit/...` working from anywhere.
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

if not (COLLECTIONS / "ansible_collections" / "gpulab" / "vllm").exists():
    raise pytest.UsageError("build/collections/ansible_collections/gpulab/vllm is missing: run `make venv` first")


def load_fixture(kind: str, name: str) -> dict:
    """A fixture recorded from the lab by tests/fixtures_record.py."""
    return json.loads((FIXTURES / kind / (name + ".json")).read_text())


def fixture_names(kind: str) -> list[str]:
    return sorted(path.stem for path in (FIXTURES / kind).glob("*.json"))
