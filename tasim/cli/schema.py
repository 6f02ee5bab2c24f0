"""``tasim schema``: print the JSON schema of scenario files."""

from __future__ import annotations

import argparse
import json

from tasim.cli.common import Commands
from tasim.config.scenario import Scenario


def add_parser(commands: Commands) -> None:
    schema = commands.add_parser("schema", help="print the scenario file JSON schema")
    schema.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(json.dumps(Scenario.model_json_schema(), indent=2))
    return 0
