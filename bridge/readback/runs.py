"""Which offsets of a partition to read in one sequential run, and where to seek instead."""

from __future__ import annotations

from collections.abc import Sequence

# Offsets this close are read in one run, the records between them consumed and skipped over: a
# seek costs a fetch round trip and discards what was prefetched, as much as reading on over a
# few hundred records (docs/bench/history.md, far-future records).
MAX_GAP = 500


def runs(offsets: Sequence[int], max_gap: int = MAX_GAP) -> list[list[int]]:
    """``offsets`` ascending, in runs whose neighbours are at most ``max_gap`` apart: each run is
    read sequentially, with a seek before it."""
    out: list[list[int]] = []
    for offset in sorted(set(offsets)):
        if out and offset - out[-1][-1] <= max_gap:
            out[-1].append(offset)
        else:
            out.append([offset])
    return out
