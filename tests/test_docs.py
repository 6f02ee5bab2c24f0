"""The README's scenario reference names every scenario field, so docs cannot drift silently."""

from __future__ import annotations

from conftest import REPO
from pydantic import BaseModel

from tasim.config.distributions import DISTRIBUTION_KINDS
from tasim.config.scenario import Scenario, _union_members


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


def test_readme_documents_every_scenario_field() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [name for name in _fields(Scenario) if f"`{name}`" not in readme]
    assert not missing, f"README scenario reference lacks: {missing}"
