"""``tasim policies``: list the routing policies, each with its parameters, their types, defaults
and descriptions."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from tasim.cli.common import Commands
from tasim.results.render import param_rows


def add_parser(commands: Commands) -> None:
    policies = commands.add_parser("policies", help="list the routing policies and their parameters")
    policies.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tasim.policies import POLICIES

    console = Console(highlight=False)
    for name, cls in POLICIES.items():
        console.print(Text.assemble((name, "bold"), " — ", cls.summary))
        rows = param_rows(cls.params_model)
        if not rows:
            console.print("    no parameters")
        # one parameter per line, description below it: stays readable in any terminal width
        for param, kind, default, description in rows:  # Text, so list[int] is not read as markup
            console.print(Text.assemble("    ", (param, "cyan"), f": {kind} = {default}"))
            if description:  # indented as a block, so wrapped lines stay under their parameter
                console.print(Padding(Text(description, style="dim"), (0, 0, 0, 8), expand=False))
        console.print()
    return 0
