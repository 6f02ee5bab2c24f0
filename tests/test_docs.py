"""The hand-written docs keep up with the code where drift would go unnoticed: the generated
scenario reference names every field, the policies page describes every registered policy, and
README.md and docs/ speak of the project, never of how it was worked on."""

from __future__ import annotations

import re

from conftest import REPO
from pydantic import BaseModel

from tasim.config.distributions import DISTRIBUTION_KINDS
from tasim.config.scenario import Scenario, _union_members
from tasim.policies import POLICIES

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        members = _union_members(annotation)
        if members and not set(members) <= set(DISTRIBUTION_KINDS):  # distributions are documented apart
            for member in members:
                names += [n for n in _fields(member, f"{prefix}{name}.") if n not in names]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += _fields(annotation, f"{prefix}{name}.")
        else:
            names.append(prefix + name)
    return names


def test_the_scenario_reference_documents_every_scenario_field() -> None:
    reference = (DOCS / "reference" / "scenario.md").read_text()
    missing = [name for name in _fields(Scenario) if f"`{name}`" not in reference]
    assert not missing, f"docs/reference/scenario.md lacks: {missing}"


def test_the_policies_page_describes_every_registered_policy() -> None:
    page = (DOCS / "policies.md").read_text()
    assert [name for name in POLICIES if f"`{name}`" not in page] == []


def test_the_docs_speak_of_the_project_not_of_its_work_sessions() -> None:
    words = re.compile(
        r"this session|this issue|this task|issue [0-9]+|sitting|was lent|\bround [0-9]+\b|(first|second|third|fourth|fifth) round", re.I
    )
    lines = [(page, n, line) for page in PAGES for n, line in enumerate(page.read_text().splitlines(), 1)]
    assert [f"{page.relative_to(REPO)}:{n}: {line.strip()[:80]}" for page, n, line in lines if words.search(line)] == []
