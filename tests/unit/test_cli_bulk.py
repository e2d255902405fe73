"""The bulk commands' refusals: one line on stderr and exit 2, before anything is read or
produced (so no server is needed: the command line runs in this process)."""

from __future__ import annotations

import pytest

from bridge.cli.entry import main


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
