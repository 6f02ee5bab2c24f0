"""A policy and its parameters as one piece of text: ``name`` or ``name[key=value,...]``.

``compare --policies`` takes a list of these and ``simulate --policy`` / ``live --policy`` one;
any command that runs named policies can read them here. Values are YAML, as in ``--set``.
Parsing checks the text and the policy's name. The parameters are validated where a scenario is
loaded with `PolicySpec.overrides`, merged over the scenario's ``policy.defaults`` for that
policy: a rule across parameters (ThunderAgent's pause bands) may hold only with a default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from tasim.config.scenario import Override, parse_value, shown
from tasim.policies import policy_class

SYNTAX = "expected name or name[key=value,...]"
_NOT_FILE_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")


class PolicySpecError(ValueError):
    """A spec that cannot be read: one line that starts with the spec as written."""


def split_outside_brackets(text: str) -> list[str]:
    """Split on commas outside []/{}, so an item may be a YAML flow list or mapping, or a spec
    with its [...]; items are stripped."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts]


def file_safe(text: str) -> str:
    """``text`` with every character but letters, digits and ``._=+-`` replaced by ``_``."""
    return _NOT_FILE_SAFE.sub("_", text)


def flow_yaml(value: Any) -> str:
    """``value`` as one line of YAML that `parse_value` reads back as ``value``."""
    # dumped inside a list, so a scalar gets no document-end marker and a string that would read
    # as another type ("null", "2") is quoted
    return yaml.safe_dump([value], default_flow_style=True, width=math.inf, sort_keys=False).strip()[1:-1]


@dataclass(frozen=True)
class PolicySpec:
    """A policy name and the parameters given with it (in the order given). Two specs are equal
    when their names and parameter values are, whatever the order."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        written = text.strip()
        name, bracket, rest = written.partition("[")
        name = name.strip()

        def problem(message: str) -> PolicySpecError:
            return PolicySpecError(f"{shown(written)}: {message}")

        if not name:
            raise problem(f"no policy name ({SYNTAX})")
        try:
            policy_class(name)
        except ValueError as exc:
            raise problem(str(exc)) from None
        if not bracket:
            return cls(name)
        body = _bracketed(rest)
        if body is None:
            raise problem(f"no closing ']' ({SYNTAX})")
        if len(body) + 1 < len(rest):
            raise problem(f"text after ']' ({SYNTAX})")
        if not body.strip():
            raise problem(f"nothing inside [] ({SYNTAX})")
        params: dict[str, Any] = {}
        for item in split_outside_brackets(body):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise problem(f"{shown(item, 40)} is not key=value ({SYNTAX})")
            if key in params:
                raise problem(f"parameter {shown(key, 40)} is given twice")
            params[key] = parse_value(value)
        return cls(name, params)

    @property
    def label(self) -> str:
        """How tables, plots and messages name the run: the name, with the params in brackets."""
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(self._assignments())}]"

    @property
    def dirname(self) -> str:
        """The label as a file name: ``thunderagent[variant=dynamo]`` -> ``thunderagent-variant=dynamo``."""
        return file_safe("-".join([self.name, *self._assignments()]))

    def overrides(self) -> list[str]:
        """Scenario overrides that select this policy with exactly these params: the scenario's
        own ``policy.params`` are replaced, its ``policy.defaults`` still apply beneath them."""
        return [f"policy.name={self.name}", f"policy.params={flow_yaml(self.params)}"]

    def conflict(self, override: Override, source: str | None = None) -> str | None:
        """Why ``override``, applied after `overrides`, would silently undo part of this spec or
        do nothing (a param the spec sets beats a ``policy.defaults`` entry for it); None when
        the two agree. ``source`` names the spec in the reason (default: its label)."""
        source = source or shown(self.label)
        own = [Override(("policy", "name"), self.name), *(Override(("policy", "params", k), v) for k, v in self.params.items())]
        if any(override.overwrites(part) for part in own):
            return f"would replace what {source} sets"
        for key, value in self.params.items():
            if Override(("policy", "defaults", self.name, key), value).overwrites(override):
                return f"would do nothing: {source} sets {shown(key, 40)} itself"
        return None

    def _assignments(self) -> list[str]:
        return [f"{key}={flow_yaml(value)}" for key, value in self.params.items()]


def _bracketed(rest: str) -> str | None:
    """What comes before the ']' that closes an already opened '[', or None if none does."""
    depth = 1
    for i, char in enumerate(rest):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0:
            return rest[:i]
    return None
