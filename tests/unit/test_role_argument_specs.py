"""Every public role variable is documented and typed in meta/argument_specs.yml, and only those."""

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if (p / "defaults" / "main.yml").exists()))
def test_defaults_and_argument_specs_name_the_same_variables(role):
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert sorted(set(defaults) - set(options)) == [], f"{role}: defaults missing from argument_specs.yml"
    assert sorted(set(options) - set(defaults)) == [], f"{role}: argument_specs.yml options without a default"
    for name in defaults:
        assert name.startswith(role + "_"), f"{role}: public variable {name} lacks the role's prefix"
        assert options[name].get("description"), f"{role}: {name} has no description"
