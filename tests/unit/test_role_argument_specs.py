"""Every public role variable is documented and typed in meta/argument_specs.yml, and only those."""

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
# Collection-wide names, documented by every role that reads them (test_role_contracts checks they agree) and read
# with their default in the role's vars/main.yml, not set in defaults/ (a role's defaults carry its own prefix).
SHARED = {"gpulab_head_group", "gpulab_worker_group", "gpulab_secrets_dir"}


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if (p / "defaults" / "main.yml").exists()))
def test_defaults_and_argument_specs_name_the_same_variables(role):
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert sorted(set(defaults) - set(options)) == [], f"{role}: defaults missing from argument_specs.yml"
    assert sorted(set(options) - set(defaults) - SHARED) == [], f"{role}: argument_specs.yml options without a default"
    for name in defaults:
        assert name.startswith(role + "_") or name in SHARED, f"{role}: public variable {name} lacks the role's prefix"
        assert options[name].get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if (p / "tasks" / "preflight.yml").exists()))
def test_preflight_is_an_entry_point_with_the_main_options(role):
    """The playbook runs each role's preflight with include_role tasks_from: preflight; Ansible checks the types."""
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert "preflight" in specs, f"{role}: no preflight entry point in argument_specs.yml"
    assert specs["preflight"]["options"] == specs["main"]["options"]
