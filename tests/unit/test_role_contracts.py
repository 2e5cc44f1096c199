"""Role contracts: a role reads its own variables, the collection-wide ones, and the one published fact of each
role before it (gpulab_<name>), handed over by the playbook; never another role's variables or private names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
PREFIXES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())
# Names of the collection, not of a role: inventory groups and the secrets folder, the same in every role.
SHARED = {"gpulab_head_group", "gpulab_worker_group", "gpulab_secrets_dir"}
# Each role's one published fact, and the internal node read.
OUTPUTS = {"fabric": "fabric_info", "image": "image_info", "ray_cluster": "ray_cluster_info", "gate": "gate_info", "collective": "collective_info",
           "vllm_server": "vllm_server_info", "node": "gpulab_node", "weights": "weights_info", "supervisor": "supervisor_info"}
PRIVATE = re.compile(r"(?<![\w.])_{1,2}(%s)_[a-z0-9_]+" % "|".join(PREFIXES))
PUBLIC = {role: set(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}) - SHARED for role in PREFIXES}
# Calling the internal node role with its inputs is how a role run on its own reads its node.
CALLABLE = PUBLIC["node"]


def role_files(role: str) -> list[Path]:
    return [p for folder in ("tasks", "vars", "defaults", "templates", "handlers") for p in sorted((ROLES / role / folder).glob("*"))
            if p.is_file()]


@pytest.mark.parametrize("role", PREFIXES)
def test_a_role_reads_no_other_roles_names(role):
    foreign = set()
    others = set().union(*(PUBLIC[other] for other in PREFIXES if other != role)) - CALLABLE
    for path in role_files(role):
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0] if path.suffix == ".yml" else line
            foreign |= {"%s: %s" % (path.relative_to(ROLES), m.group(0)) for m in PRIVATE.finditer(code) if m.group(1) != role}
            foreign |= {"%s: %s" % (path.relative_to(ROLES), name) for name in re.findall(r"[a-z][a-z0-9_]*", code) if name in others}
    assert not foreign, "%s reads names of other roles: %s" % (role, sorted(foreign))


@pytest.mark.parametrize("role", [role for role in PREFIXES if role != "node"])
def test_a_role_publishes_one_fact(role):
    published = set()
    for path in role_files(role):
        if path.suffix != ".yml":
            continue
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            facts = task.get("ansible.builtin.set_fact") or {}
            published |= {name for name in facts if not name.startswith("_") and name != "cacheable"}
    assert published == {OUTPUTS[role]}, "%s publishes %s" % (role, sorted(published))


def test_the_node_read_is_published_by_the_node_role_alone():
    callers = [path for role in PREFIXES for path in role_files(role) if "gpulab.vllm.node_facts:" in path.read_text()]
    assert [str(path.relative_to(ROLES)) for path in callers] == ["node/tasks/main.yml"]


def test_shared_names_mean_the_same_in_every_role():
    seen = {}
    for role in PREFIXES:
        specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for entry, spec in specs.items():
            for name, option in (spec.get("options") or {}).items():
                if name in SHARED:
                    seen.setdefault(name, set()).add((option.get("default"), option.get("description")))
    assert set(seen) == SHARED
    assert all(len(variants) == 1 for variants in seen.values()), seen


def _tasks(items):
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        yield item
        for key in ("block", "rescue", "always"):
            yield from _tasks(item.get(key))
