"""What in a delay topic's configuration stops a Redis rebuild."""

from __future__ import annotations

import pytest

from bridge.topics import retention_problems

DAY = 86_400_000


@pytest.mark.parametrize(
    ("settings", "max_delay", "expected"),
    [
        ({"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}, DAY, []),
        ({"retention.ms": str(7 * DAY)}, 7 * DAY, []),
        ({"retention.ms": str(7 * DAY)}, 7 * DAY + 1, ["retention.ms=604800000 (7d)"]),
        ({"retention.ms": "0"}, DAY, ["retention.ms=0"]),
        ({"retention.bytes": "1073741824"}, DAY, ["retention.bytes=1073741824"]),
        ({"cleanup.policy": "compact"}, DAY, ["cleanup.policy=compact"]),
        (
            {"cleanup.policy": "compact,delete", "retention.ms": "1000"},
            DAY,
            ["retention.ms=1000", "cleanup.policy=compact,delete"],
        ),
    ],
)
def test_retention_problems(settings: dict[str, str], max_delay: int, expected: list[str]) -> None:
    problems = retention_problems("delay", settings, max_delay)
    assert len(problems) == len(expected)
    for problem, fragment in zip(problems, expected, strict=True):
        assert fragment in problem and problem.startswith("delay topic delay ")


def test_compaction_is_no_problem_where_the_key_is_the_delay_id() -> None:
    """etf1's topics are compacted by design: a later record with the same key replaces the
    schedule (or a tombstone cancels it), which is what compaction keeps. Retention still counts."""
    assert retention_problems("legacy", {"cleanup.policy": "compact"}, DAY, key_is_id=True) == []
    [short] = retention_problems(
        "legacy", {"cleanup.policy": "compact,delete", "retention.ms": "1000"}, DAY, key_is_id=True
    )
    assert "retention.ms=1000" in short
