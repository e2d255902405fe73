"""The operator's tools: functions the command line and the console share.

Each takes typed options (:mod:`bridge.ops.asked`) and returns typed results. Reads: what waits
(``status``, ``list``: :mod:`bridge.ops.records`), a record's fate (``trace``), the dead-letter
topic (``dlq list``), answered by :mod:`bridge.ops.answers`. Writes (:mod:`bridge.ops.acts`):
``cancel``, ``fire`` and ``reschedule`` of one record or of every match of a filter
(:mod:`bridge.ops.bulk`), and ``dlq replay``; a recurring schedule's ``schedules list``, ``pause``
and ``resume`` (:mod:`bridge.ops.schedules`); what they produce goes through
:func:`bridge.ops.send.send`. They act with the bridge's configuration, never inside its loops."""

from typing import Any

from bridge.ops.acts import WRITES as BY_ID_OR_FILTER
from bridge.ops.acts import (
    BulkDone,
    Sent,
    cancel,
    check_record,
    choose,
    delay_topic,
    fire,
    operation_of,
    replay_dead_letters,
    reschedule,
)
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
from bridge.ops.asked import (
    DEFAULT_RATE,
    BulkAsk,
    CancelAsk,
    DlqAsk,
    FireAsk,
    ListAsk,
    PauseAsk,
    ReplayAsk,
    RescheduleAsk,
    ResumeAsk,
    SchedulesAsk,
    StatusAsk,
    TraceAsk,
    from_body,
    from_query,
    when,
)
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
from bridge.ops.replay import Replayed, replay
from bridge.ops.schedules import (
    ScheduleRow,
    SchedulesAnswer,
    hold,
    schedules,
    schedules_answer,
)
from bridge.ops.send import Placed, Sending, Voice, send
from bridge.ops.trace import print_trace, trace

# Each write by its command's name: its options and its tool (the command line's and the API's).
WRITES: dict[str, tuple[type[Any], Any]] = {
    **BY_ID_OR_FILTER,
    "pause": (PauseAsk, hold),
    "resume": (ResumeAsk, hold),
}

__all__ = [
    "AHEAD",
    "DEFAULT_RATE",
    "STALL_S",
    "WRITES",
    "Answer",
    "BulkAsk",
    "BulkDone",
    "CancelAsk",
    "DlqAnswer",
    "DlqAsk",
    "Filter",
    "Filters",
    "FireAsk",
    "Follow",
    "ListAnswer",
    "ListAsk",
    "Match",
    "Outgoing",
    "PauseAsk",
    "Placed",
    "ReplayAsk",
    "Replayed",
    "RescheduleAsk",
    "ResumeAsk",
    "ScheduleRow",
    "SchedulesAnswer",
    "SchedulesAsk",
    "Sending",
    "Sent",
    "StatusAnswer",
    "StatusAsk",
    "Tally",
    "TraceAnswer",
    "TraceAsk",
    "Voice",
    "cancel",
    "cancel_of",
    "check_record",
    "choose",
    "delay_shards",
    "delay_topic",
    "dlq_answer",
    "dlq_filters",
    "fire",
    "from_body",
    "from_query",
    "hold",
    "list_answer",
    "listing",
    "locate",
    "made_by",
    "matches",
    "operation_of",
    "packed",
    "print_listing",
    "print_status",
    "print_trace",
    "print_waiting",
    "replacement_of",
    "replay",
    "replay_dead_letters",
    "reschedule",
    "schedules",
    "schedules_answer",
    "send",
    "status",
    "status_answer",
    "store_of",
    "trace",
    "trace_answer",
    "waiting",
    "when",
]
