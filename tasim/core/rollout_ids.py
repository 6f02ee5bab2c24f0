"""Names of RL rollout trajectories, ``s<step>.<prompt>.<sample>``: made and read here only.

The samples of one prompt form a GRPO group (its advantage needs every one of them); the group's
key, ``s<step>.<prompt>``, is a trajectory's id without its sample. The simulator and the live
verl driver name trajectories with `trajectory_id`; the metrics fold reads each trajectory's
group back from its id with `rollout_group_of`. No event carries the group: a field for it on
`ProgramStarted` would be written in every rollout's log and change the bytes of the logs
recorded so far, while the id already holds it.
"""

from __future__ import annotations

import re

_TRAJECTORY_ID = re.compile(r"s\d+\.\d+\.\d+")


def group_id(step: int, prompt: int) -> str:
    """The GRPO group of the ``prompt``-th prompt submitted at ``step``."""
    return f"s{step}.{prompt}"


def trajectory_id(step: int, prompt: int, sample: int) -> str:
    return f"{group_id(step, prompt)}.{sample}"


def rollout_group_of(program_id: str) -> str | None:
    """The GRPO group (``s<step>.<prompt>``) of the trajectory `trajectory_id` named
    ``program_id``; None for any other program's id."""
    if _TRAJECTORY_ID.fullmatch(program_id) is None:
        return None
    return program_id.rpartition(".")[0]
