"""The bounds of one read, whatever the store or the journal holds.

The console's API runs the operator tools inside the bridge, so a page, how deep it starts and how
far back the journal is read are bounded; a request past a bound is refused with the bound named
(the CLI's exit 2, the API's 400)."""

from __future__ import annotations

from bridge.errors import UsageError
from bridge.message import format_duration_ms, format_time_ms

# A page is at most MAX_PAGE records, and it starts at most MAX_SKIP records in (each shard reads
# skip + limit of its earliest); deeper, narrow the filters (--due-before).
MAX_PAGE = 1000
MAX_SKIP = 10_000


def check_page(limit: int | None, skip: int = 0) -> None:
    """UsageError unless ``limit`` (None: none asked) and ``skip`` are within a page's bounds."""
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise UsageError(f"--limit {limit}: 1 to {MAX_PAGE:,} (a page; --skip for the next)")
    if not 0 <= skip <= MAX_SKIP:
        raise UsageError(
            f"--skip {skip}: 0 to {MAX_SKIP:,}; further in, narrow the filters (--due-before)"
        )


def check_since(since_ms: int | None, now_ms: int, max_delay_ms: int) -> None:
    """UsageError when a read of the journal would start further back than ``max_delay_ms``
    (``limits.max_delay``, the retention the journal is created with)."""
    if since_ms is not None and since_ms < now_ms - max_delay_ms:
        raise UsageError(
            f"--since {format_time_ms(since_ms)}: at most limits.max_delay "
            f"({format_duration_ms(max_delay_ms)}) back"
        )
