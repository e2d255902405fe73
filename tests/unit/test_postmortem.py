"""What a failed end-to-end test prints of its bridges (testbed.postmortem)."""

from __future__ import annotations

from pathlib import Path

from testbed import postmortem
from testbed.harness import Bridge

LOG = """\
2026-12-06 08:41:34,035 INFO    bridge.announce: delay-bridge 0.1.0 starting: delay topics d
2026-12-06 08:41:34,656 INFO    bridge.ingress.membership: assigned d[0], d[1], d[2]
2026-12-06 08:41:35,000 INFO    bridge.catchup: caught up on d[0]
2026-12-06 08:41:36,000 WARNING bridge.ingress.unowned: d[0] still owned by no replica
2026-12-06 08:41:37,000 INFO    bridge.catchup: caught up on d[1]
"""

BROKER = """\
[2026-12-06 08:41:34,088] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=2] \
Stabilized group bridge-g generation 1 with 1 members. (org.apache.kafka.coordinator.group.X)
[2026-12-06 08:41:34,089] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=2] \
Stabilized group bridge-other generation 1 with 1 members. (org.apache.kafka.coordinator.group.X)
[2026-12-06 08:41:35,000] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=2] \
Member m in group bridge-g has failed, removing it from the group. (org.apache.kafka.X)
[2026-12-06 08:41:36,000] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=2] \
[Group bridge-g] Member n has left group through explicit `LeaveGroup` request (org.apache.X)
[2026-12-06 08:41:37,000] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=2] \
Group bridge-g with generation 4 is now empty. (org.apache.kafka.coordinator.group.X)
[2026-12-06 08:41:38,000] INFO [GroupCoordinator id=1 topic=__consumer_offsets partition=2] \
Group bridge-gg with generation 1 is now empty. (org.apache.kafka.coordinator.group.X)
"""


def test_a_report_has_the_group_events_of_the_whole_log_its_tail_and_the_brokers_view(
    tmp_path: Path,
) -> None:
    log, broker = tmp_path / "bridge.log", tmp_path / "server.log"
    log.write_text(LOG + "".join(f"line {n}\n" for n in range(100)))
    broker.write_text(BROKER)
    env = {"DELAY_BRIDGE_KAFKA__GROUP_ID": "bridge-g"}
    # Two bridges started one after the other share a log: it is reported once.
    lines = postmortem.report([Bridge(env, log), Bridge(env, log)], broker)
    text = "\n".join(lines)
    assert text.count("its group events and warnings") == 1
    events = lines[1 : lines.index(next(x for x in lines if "the last 30 lines" in x))]
    assert [e.split(maxsplit=4)[3] for e in events] == [
        "bridge.announce:",
        "bridge.ingress.membership:",
        "bridge.ingress.unowned:",
    ]
    assert "line 99" in text and "line 69" not in text
    assert "Stabilized group bridge-g generation 1 with 1 members." in text
    assert "Member m in group bridge-g has failed, removing it from the group." in text
    assert "[Group bridge-g] Member n has left group through explicit `LeaveGroup`" in text
    assert "Group bridge-g with generation 4 is now empty." in text
    assert "bridge-other" not in text and "bridge-gg" not in text
    assert "GroupCoordinator id=" not in text


def test_a_report_without_a_broker_log_or_a_bridge_log_says_what_it_has(tmp_path: Path) -> None:
    lines = postmortem.report([Bridge({}, tmp_path / "never.log")], tmp_path / "none.log")
    assert lines == [
        f"--- {tmp_path / 'never.log'}: its group events and warnings (the last 0) ---",
        f"--- {tmp_path / 'never.log'}: the last 0 lines ---",
    ]
