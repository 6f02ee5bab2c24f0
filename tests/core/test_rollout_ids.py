"""A trajectory's GRPO group is read back from the id it was given, and from no other id."""

from __future__ import annotations

import pytest

from tasim.core.rollout_ids import rollout_group_of, trajectory_id


def test_a_trajectory_id_names_its_group() -> None:
    assert trajectory_id(3, 12, 7) == "s3.12.7"
    assert rollout_group_of(trajectory_id(3, 12, 7)) == "s3.12"
    assert rollout_group_of(trajectory_id(3, 12, 0)) == rollout_group_of(trajectory_id(3, 12, 5))
    assert rollout_group_of(trajectory_id(3, 1, 0)) != rollout_group_of(trajectory_id(4, 1, 0))


@pytest.mark.parametrize("program", ["p0", "s1.2", "s1.2.3.4", "s1.2.x", "x1.2.3", "s1.2.3 ", "", "conversation-7"])
def test_other_program_ids_have_no_group(program: str) -> None:
    assert rollout_group_of(program) is None
