"""Every name an installed collection's code uses resolves with what is installed beside it, and nothing else.

Run by the Python of a virtual environment that holds ansible-core alone, with ANSIBLE_COLLECTIONS_PATH naming only
the folder where the collection's tarball and the collections its galaxy.yml declares were installed
(tests/collection/test_build_install.py does):

    python tests/collection/names_resolve.py gpulab.vllm

It imports every Python plugin of the collection, and reads every playbook, every role's tasks, handlers, variables,
meta and templates: each task's module or action, each role named (import_role, include_role, roles:, a role's
dependencies), and each filter, test and lookup in a Jinja expression or condition (map('x'), select('x') and
selectattr(attr, 'x') included) must resolve. A playbook's --syntax-check resolves only what is imported statically
and no filter at all, so a filter of an undeclared collection would pass it and fail on a real run.

Prints one line per name that does not resolve, with the file that uses it; exit status 1 if any.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import jinja2
import jinja2.filters
import jinja2.tests
from jinja2 import nodes

from ansible.parsing.dataloader import DataLoader
from ansible.playbook.handler import Handler
from ansible.plugins.loader import action_loader, filter_loader, init_plugin_loader, lookup_loader, module_loader, test_loader

# Keys whose value Ansible evaluates as a bare Jinja expression (or a list of them).
CONDITIONS = {"when", "changed_when", "failed_when", "until", "that"}
TASK_KEYWORDS = set(Handler.fattributes) | {"local_action", "block", "rescue", "always"}
PLAY_TASK_LISTS = ("pre_tasks", "tasks", "post_tasks", "handlers")
ROLE_ACTIONS = {"ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role"}
LOOKUP_CALLS = {"lookup", "query", "q"}


class Names:
    """What the collection uses, each name with the first file that uses it."""

    def __init__(self) -> None:
        self.found: dict[str, dict[str, str]] = {"filter": {}, "test": {}, "lookup": {}, "action": {}, "role": {}}
        self.problems: list[str] = []

    def add(self, kind: str, name: str, where: str) -> None:
        self.found[kind].setdefault(name, where)

    def template(self, text: str, where: str) -> None:
        try:
            tree = ENVIRONMENT.parse(text)
        except jinja2.TemplateSyntaxError as error:
            self.problems.append(f"{where}: not a template Jinja can parse ({error}): {text[:80]!r}")
            return
        for node in tree.find_all((nodes.Filter, nodes.Test, nodes.Call)):
            if isinstance(node, nodes.Call):
                if isinstance(node.node, nodes.Name) and node.node.name in LOOKUP_CALLS and node.args \
                        and isinstance(node.args[0], nodes.Const):
                    self.add("lookup", node.args[0].value, where)
                continue
            if node.name is None:
                continue
            self.add("filter" if isinstance(node, nodes.Filter) else "test", node.name, where)
            if isinstance(node, nodes.Filter):
                self._named_in_arguments(node, where)

    def _named_in_arguments(self, node: nodes.Filter, where: str) -> None:
        # map('f'), select('t'), reject('t'), selectattr(attr, 't'), rejectattr(attr, 't') name a filter or a test
        # by a string that no Filter or Test node carries.
        position = {"map": (0, "filter"), "select": (0, "test"), "reject": (0, "test"),
                    "selectattr": (1, "test"), "rejectattr": (1, "test")}.get(node.name)
        if position is None or (node.name == "map" and any(keyword.key == "attribute" for keyword in node.kwargs)):
            return
        index, kind = position
        if len(node.args) > index and isinstance(node.args[index], nodes.Const) and isinstance(node.args[index].value, str):
            self.add(kind, node.args[index].value, where)

    def value(self, data, where: str, condition: bool = False) -> None:
        if isinstance(data, dict):
            for key, item in data.items():
                self.value(item, where, condition=key in CONDITIONS)
                if isinstance(key, str) and key.startswith("with_"):
                    self.add("lookup", key[len("with_"):], where)
        elif isinstance(data, list):
            for item in data:
                self.value(item, where, condition)
        elif isinstance(data, str):
            if "{{" in data or "{%" in data:
                self.template(data, where)
            elif condition:
                self.template("{{ " + data + " }}", where)

    def tasks(self, tasks, where: str) -> None:
        for task in tasks or []:
            if not isinstance(task, dict):
                continue
            if "block" in task:
                for part in ("block", "rescue", "always"):
                    self.tasks(task.get(part), where)
                continue
            for key in task:
                if key in TASK_KEYWORDS or key.startswith("with_"):
                    continue
                self.add("action", key, where)
                if key in ROLE_ACTIONS and isinstance(task[key], dict) and "name" in task[key]:
                    self.add("role", task[key]["name"], where)
            if "local_action" in task or "action" in task:
                action = task.get("local_action") or task.get("action")
                name = action.get("module") if isinstance(action, dict) else str(action).split()[0]
                self.add("action", name, where)

    def roles(self, roles, where: str) -> None:
        for role in roles or []:
            name = role if isinstance(role, str) else (role.get("role") or role.get("name"))
            if name:
                self.add("role", name, where)


ENVIRONMENT = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])


def read(collection: Path, names: Names) -> None:
    loader = DataLoader()
    for path in sorted(collection.glob("playbooks/**/*.yml")):
        where = str(path.relative_to(collection))
        data = loader.load_from_file(str(path))
        names.value(data, where)
        if path.parent.name == "tasks":
            names.tasks(data, where)
            continue
        for play in data or []:
            if not isinstance(play, dict):
                continue
            for key in PLAY_TASK_LISTS:
                names.tasks(play.get(key), where)
            names.roles(play.get("roles"), where)
    for path in sorted(collection.glob("roles/*/*/**/*")):
        where = str(path.relative_to(collection))
        part = path.relative_to(collection).parts[2]
        if not path.is_file() or part == "files" or path.name == "argument_specs.yml":
            continue
        if part == "templates":
            names.template(path.read_text(), where)
            continue
        if path.suffix not in (".yml", ".yaml"):
            continue
        data = loader.load_from_file(str(path))
        names.value(data, where)
        if part in ("tasks", "handlers"):
            names.tasks(data, where)
        elif part == "meta" and isinstance(data, dict):
            names.roles(data.get("dependencies"), where)
    for path in sorted(collection.glob("playbooks/**/*.j2")):
        names.template(path.read_text(), str(path.relative_to(collection)))


def _resolves(loader, name: str) -> bool:
    try:
        return loader.get(name) is not None
    except Exception:  # pylint: disable=broad-exception-caught  # a missing collection is a KeyError, others differ
        return False


def unresolved(names: Names, roots: list[Path]) -> list[str]:
    problems = list(names.problems)
    for name, where in sorted(names.found["filter"].items()):
        if name not in jinja2.filters.FILTERS and not _resolves(filter_loader, name):
            problems.append(f"{where}: filter {name} does not resolve")
    for name, where in sorted(names.found["test"].items()):
        if name not in jinja2.tests.TESTS and not _resolves(test_loader, name):
            problems.append(f"{where}: test {name} does not resolve")
    for name, where in sorted(names.found["lookup"].items()):
        if not _resolves(lookup_loader, name):
            problems.append(f"{where}: lookup {name} does not resolve")
    for name, where in sorted(names.found["action"].items()):
        if not (module_loader.find_plugin_with_context(name).resolved or action_loader.find_plugin_with_context(name).resolved):
            problems.append(f"{where}: module or action {name} does not resolve")
    for name, where in sorted(names.found["role"].items()):
        parts = name.split(".")
        if len(parts) != 3 or not any((root / "ansible_collections" / parts[0] / parts[1] / "roles" / parts[2]).is_dir()
                                      for root in roots):
            problems.append(f"{where}: role {name} is not a role of an installed collection (by its full name)")
    return problems


def import_plugins(collection: Path, fqcn: str) -> list[str]:
    problems = []
    for path in sorted(collection.glob("plugins/**/*.py")):
        if path.name == "__init__.py":
            continue
        module = "ansible_collections.%s.%s" % (fqcn, ".".join(path.relative_to(collection).with_suffix("").parts))
        try:
            importlib.import_module(module)
        except Exception as error:  # pylint: disable=broad-exception-caught  # any failure to import is the finding
            problems.append(f"{path.relative_to(collection)}: does not import: {type(error).__name__}: {error}")
    return problems


def main(argv: list[str]) -> int:
    fqcn = argv[0]
    roots = [Path(path) for path in os.environ["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) if path]
    # What this Python finds before the collections path is added must be nothing: ansible-core alone.
    try:
        bundled = importlib.util.find_spec("ansible_collections")
    except ImportError:
        bundled = None
    if bundled is not None:
        print(f"this Python brings collections of its own ({list(bundled.submodule_search_locations or [])}): "
              "run it from a virtual environment that holds ansible-core alone", file=sys.stderr)
        return 1
    init_plugin_loader()
    namespace, name = fqcn.split(".")
    collection = next((root / "ansible_collections" / namespace / name for root in roots
                       if (root / "ansible_collections" / namespace / name / "MANIFEST.json").exists()), None)
    if collection is None:
        print(f"{fqcn} is not installed under {os.environ['ANSIBLE_COLLECTIONS_PATH']}", file=sys.stderr)
        return 1
    names = Names()
    read(collection, names)
    problems = import_plugins(collection, fqcn) + unresolved(names, roots)
    for problem in problems:
        print(problem)
    counts = ", ".join(f"{len(found)} {kind}s" for kind, found in names.found.items())
    print(f"{fqcn}: {counts} read; {len(problems)} that do not resolve")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
