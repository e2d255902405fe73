"""What a failed end-to-end test prints of its bridges and of Kafka's view of their group.

A log's last lines show where a bridge ended, not how it got there: a partition assigned to
nobody for minutes shows only in the group's history. So the report is, per log file (restarted
bridges share one): its group events and warnings from the whole run, then its tail; and the
broker's group-coordinator lines of the bridges' consumer group (who joined, who the broker
removed, which generation stabilized with whom). Each part is capped: CI shows a part of the
output only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from testbed.harness import Bridge
from testbed.servers import STATE_DIR

EVENTS = re.compile(
    r"starting: |assigned |revoked |lost |released |leaving the group|owned by no|"
    r"WARNING  *bridge|ERROR|CRITICAL|Traceback"
)
EVENT_LINES = 40
TAIL_LINES = 30
BROKER_LINES = 30
BROKER_LOG = STATE_DIR / "kafka" / "logs" / "server.log"


def report(bridges: Sequence[Bridge], broker_log: Path = BROKER_LOG) -> list[str]:
    """The lines to print for a failed test's ``bridges``."""
    lines: list[str] = []
    for log in dict.fromkeys(b.log for b in bridges):
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
        events = [line for line in text if EVENTS.search(line)][-EVENT_LINES:]
        lines += [f"--- {log}: its group events and warnings (the last {len(events)}) ---"]
        lines += events
        lines += [f"--- {log}: the last {min(len(text), TAIL_LINES)} lines ---"]
        lines += text[-TAIL_LINES:]
    groups = {g for b in bridges if (g := b.env.get("DELAY_BRIDGE_KAFKA__GROUP_ID"))}
    coordinator = _coordinator_lines(broker_log, groups)
    if coordinator:
        lines += [f"--- {broker_log}: the group coordinator on {', '.join(sorted(groups))} ---"]
        lines += coordinator
    return lines


def _coordinator_lines(log: Path, groups: Iterable[str]) -> list[str]:
    names = "|".join(re.escape(g) for g in groups)
    if not names or not log.exists():
        return []
    # "group <id> has failed", "Group <id> with generation 4 is now empty", "[Group <id>] Member
    # … has left group through explicit LeaveGroup": the id whole, not a prefix of another.
    wanted = re.compile(rf"[Gg]roup (?:{names})(?![\w-])")
    found = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if "GroupCoordinator" in line and wanted.search(line)
    ]
    return [_short(line) for line in found[-BROKER_LINES:]]


def _short(line: str) -> str:
    """A coordinator line without its logger's class and partition: the event, readable."""
    line = re.sub(r" \(org\.apache\.kafka\.[\w.]+\)$", "", line)
    return re.sub(r"\[GroupCoordinator id=\d+ topic=__consumer_offsets partition=\d+\] ", "", line)
