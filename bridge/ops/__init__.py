"""The operator's tools: functions the command line and the console share.

What waits (``status``, ``list``, a record by its delay-id: :mod:`bridge.ops.records`), a record's
fate (``trace``), the bulk actions on waiting records (``cancel``, ``fire``, ``reschedule`` by a
filter: :mod:`bridge.ops.bulk`), and the dead-letter topic (``dlq list``, ``dlq replay``). They
read the store and the topics with the bridge's configuration, never inside the bridge's loops."""

from bridge.ops.answers import (
    Answer,
    DlqAnswer,
    ListAnswer,
    StatusAnswer,
    TraceAnswer,
    dlq_answer,
    dlq_filters,
    list_answer,
    status_answer,
    trace_answer,
)
from bridge.ops.asked import DlqAsk, ListAsk, StatusAsk, TraceAsk, from_query, when
from bridge.ops.bulk import (
    AHEAD,
    STALL_S,
    Filter,
    Follow,
    Match,
    Outgoing,
    Tally,
    cancel_of,
    made_by,
    matches,
    packed,
    replacement_of,
)
from bridge.ops.dlq import Filters, listing, print_listing
from bridge.ops.records import (
    delay_shards,
    locate,
    print_status,
    print_waiting,
    status,
    store_of,
    waiting,
)
from bridge.ops.replay import PROGRESS_EVERY, replay, terminal_progress
from bridge.ops.trace import print_trace, trace

__all__ = [
    "AHEAD",
    "PROGRESS_EVERY",
    "STALL_S",
    "Answer",
    "DlqAnswer",
    "DlqAsk",
    "Filter",
    "Filters",
    "Follow",
    "ListAnswer",
    "ListAsk",
    "Match",
    "Outgoing",
    "StatusAnswer",
    "StatusAsk",
    "Tally",
    "TraceAnswer",
    "TraceAsk",
    "cancel_of",
    "delay_shards",
    "dlq_answer",
    "dlq_filters",
    "from_query",
    "list_answer",
    "listing",
    "locate",
    "made_by",
    "matches",
    "packed",
    "print_listing",
    "print_status",
    "print_trace",
    "print_waiting",
    "replacement_of",
    "replay",
    "status",
    "status_answer",
    "store_of",
    "terminal_progress",
    "trace",
    "trace_answer",
    "waiting",
    "when",
]
