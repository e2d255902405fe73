"""The read-back: references read from the delay topic shortly before they fall due.

A far-future record is kept in Redis as a reference (see bridge.store.references) and stored whole
again, from the delay topic, at least ``store.fetch_ahead`` before it is due.
"""

from bridge.readback.confirm import IdReader
from bridge.readback.loop import ReadBack, missing_record, parse_read_back
from bridge.readback.reader import Reader
from bridge.readback.runs import runs

__all__ = ["IdReader", "ReadBack", "Reader", "missing_record", "parse_read_back", "runs"]
