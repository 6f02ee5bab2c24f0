"""A policy with parameters written as one string: ``thunderagent[variant=dynamo]``.

The parameters are merged over the scenario's ``policy.defaults`` for that policy, exactly as
``policy.params`` are, so a spec changes only what it names. Values are parsed as YAML, as
``--set`` values are. Whether the policy and its parameters exist is checked where the spec is
applied to a scenario, whose loader names the allowed values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\[(.*)\])?\s*$")


@dataclass(frozen=True)
class PolicySpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "PolicySpec":
        """``name`` or ``name[key=value,...]``; raises ValueError with a one-line message."""
        match = _SPEC.match(text)
        if match is None:
            raise ValueError(f"policy {text!r}: expected name or name[key=value,...]")
        name, inner = match.group(1), match.group(2)
        params: dict[str, Any] = {}
        for item in (inner.split(",") if inner and inner.strip() else []):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"policy {text!r}: expected key=value, got {item.strip()!r}")
            if key in params:
                raise ValueError(f"policy {text!r}: parameter {key} is given twice")
            params[key] = _value(value.strip())
        return cls(name, params)

    @property
    def label(self) -> str:
        """The spec as it would be written, e.g. ``thunderagent[variant=dynamo]``."""
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(f'{k}={_text(v)}' for k, v in self.params.items())}]"

    def overrides(self) -> list[str]:
        """``--set`` assignments that select this policy with exactly these parameters."""
        return [f"policy.name={self.name}", f"policy.params={json.dumps(self.params)}"]


def _value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
