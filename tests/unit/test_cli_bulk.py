"""The bulk commands' refusals: one line on stderr and exit 2, before anything is read or
produced (so no server is needed: the command line runs in this process); their operation id,
and what carries it."""

from __future__ import annotations

import pytest

from bridge.cli.entry import build_parser, main
from bridge.cli.records import asked
from bridge.message import H_OPERATION, Headers, Scheduled
from bridge.ops import Match, RescheduleAsk, made_by, operation_of, replacement_of
from bridge.store import Shard


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel"], "give --id, or a filter"),
        (["cancel", "--target", "x"], "needs --dry-run (count what matches) or --yes"),
        (["cancel", "--id", "x", "--yes"], "--yes: not with --id"),
        (["cancel", "--id", "x", "--target", "y"], "--target: not with --id"),
        (["cancel", "--key-prefix", "k", "--force", "--yes"], "--force: only with --id"),
        (["cancel", "--due-before", "soon", "--dry-run"], "--due-before: not a time"),
        (["cancel", "--target", "x", "--dry-run", "--yes"], "not allowed with"),
        (["fire", "--target", "x"], "a bulk fire needs --dry-run"),
        (["fire", "--id", "x", "--dry-run"], "--dry-run: not with --id"),
        (["reschedule", "--id", "x"], "one of the arguments --at --after --shift is required"),
        (["reschedule", "--id", "x", "--shift", "soon"], "--shift: not a duration"),
        (["reschedule", "--id", "x", "--after=-1h"], "--after: a delay from now is not negative"),
        (["reschedule", "--id", "x", "--at", "later"], "--at: not a time"),
        (["reschedule", "--key-prefix", "k", "--shift", "1h"], "a bulk reschedule needs"),
        (["cancel", "--key-prefix", "k", "--yes", "--rate=-1"], "--rate -1: 0 (no limit) or more"),
        (["fire", "--key-prefix", "k", "--yes", "--rate", "fast"], "--rate: invalid float value"),
        (["fire", "--key-prefix", "k", "--yes", "--operation", "x" * 65], "--operation 'xxx"),
        (["fire", "--key-prefix", "k", "--yes", "--operation", "op-\u00b2"], "printable ASCII"),
    ],
)
def test_a_bulk_command_refuses_bad_input_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_operation_is_named_by_the_command_as_given() -> None:
    def op(*args: str) -> str:
        return operation_of(asked(RescheduleAsk, build_parser().parse_args(["reschedule", *args])))

    shift = op("--due-after", "10m", "--shift", "1h", "--yes")
    assert shift == op("--shift", "1h", "--due-after", "10m", "--dry-run")  # same command
    assert shift != op("--due-after", "10m", "--shift", "2h", "--yes")
    assert shift != op("--due-after", "11m", "--shift", "1h", "--yes")
    named = op("--target", "t", "--shift", "1h", "--yes", "--operation", "campaign-42")
    assert named == "campaign-42"


def test_a_replacement_carries_its_operation_and_its_delivery_does_not() -> None:
    earlier: Headers = [("h", b"1"), (H_OPERATION, b"older")]
    rec = Scheduled(7, 1_800_000_000_000, "orders", b"k", b"v", earlier, "order-7")
    made = replacement_of(Match(Shard("delay", 0), 7, rec.due_ms, rec), None, "op-1")
    assert made is not None
    _, _, headers, _ = made
    assert [v for k, v in headers if k == H_OPERATION] == [b"op-1"]
    again = Scheduled(9, 1_800_000_000_000, "orders", b"k", b"v", headers, "order-7")
    assert made_by(again, "op-1") and not made_by(again, "older")
    assert all(k != H_OPERATION for k, _ in again.delivered_headers())
