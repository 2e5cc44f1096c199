"""The README stays a five-minute read: at most 1,000 words, a quick start of two commands whose test command is
the one CI runs; and every page that it, the docs or a README of the roles, the lab or the tests link to exists
(topics moved to docs/ keep their links whole)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_WORDS = 1000
# A Markdown link's target: [text](target), the target relative unless it names a scheme.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _quick_start() -> list[str]:
    section = README.read_text().split("## Quick start", 1)[1]
    block = section.split("```", 2)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_readme_is_at_most_a_thousand_words():
    words = len(README.read_text().split())
    assert words <= MAX_WORDS, f"README.md has {words} words, over {MAX_WORDS}: move the detail to a page under docs/"


def test_the_quick_start_is_two_commands_and_its_test_command_is_what_ci_runs():
    assert _quick_start() == ["make demo", "make test"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci


def test_every_relative_link_of_the_readmes_and_the_docs_names_a_file_that_exists():
    pages = [README, ROOT / "lab" / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "roles").glob("*/README.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
