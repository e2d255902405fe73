"""Cancels and replacements that found nothing but their record in flight, claimed meanwhile.

add.lua says which of the cancels and replacements that found nothing anywhere met a record with
their id in flight (:attr:`bridge.store.calls.AddReply.in_flight`). Two such flights end with the
record waiting again, unproduced, and the cancel is not late: the mover put it back (a claim the
ingress had not said its partition was read for: :meth:`bridge.catchup.CatchUp.past`; a record
beyond its target's rate, into the target's wait index), or it was claimed ahead and is held in
memory until its due time, which a cancel read in time takes back
(:meth:`bridge.catchup.CatchUp.take_back`). Either way the record is then withdrawn in the
cancel's own partition, as if it had waited when add.lua ran: by the id index, or, named by its
default id, at the due time the put-back or the take-back gives. A third flight ends the same
way later: a record leased by an earlier owner of the partition that claimed it only to put it
back, and was killed first. The cancel is kept (bridge.claiming's ``keep_missed``); the new
owner, claiming the record again once it took the lease over, puts it back while the cancel
names it, and the cancel looks again (:meth:`bridge.store.Store.look_here`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Protocol

from bridge.message import Cancel, Scheduled, parse_origin
from bridge.store.across import Asked, FoundAt, Hits, look, withdraw_hits
from bridge.store.ids import Confirm
from bridge.store.keys import Keys, Shard, offset_bytes
from bridge.store.scripts import Scripts

Named = tuple[Shard, Scheduled | Cancel]  # a cancel or replacement, in its shard


class InFlight(Protocol):
    """What the mover did with claimed records (bridge.catchup.CatchUp): a mark before add.lua
    runs (unmarked once add.lua's answer is looked into), then the shards it put records back
    in since it, once the claims begun by then have ended; and, by offset, records claimed ahead
    taken back on asking or put back since the mark, their shard held until said."""

    def put_backs_mark(self) -> int: ...

    def put_backs_unmark(self) -> None: ...

    def put_back_since(self, mark: int) -> Collection[Shard]: ...

    def take_back(self, shard: Shard, offsets: Collection[int]) -> dict[int, int]: ...

    def taken_back(self, shard: Shard) -> None: ...

    def keep_missed(
        self, missed: Sequence[tuple[Shard, Scheduled | Cancel]], mark: int, now: float
    ) -> None: ...


def withdraw_in_flight(
    scripts: Scripts,
    keys: Keys,
    missed: Sequence[tuple[Shard, Scheduled | Cancel]],
    flew: Collection[Asked],
    mover: InFlight,
    mark: int,
    confirm: Confirm,
) -> FoundAt:
    """What those of the ``missed`` cancels and replacements that met their record in flight
    (``flew``) withdraw in their own shard: where the mover put records back since ``mark``
    (:func:`withdraw_here`), and by a default id of their own shard, what it takes back."""
    met = [(s, r) for s, r in missed if (s, r.offset, r.delay_id) in flew]
    if not met:
        return {}
    shards = mover.put_back_since(mark)
    here = [(s, r) for s, r in met if s in shards]
    found = withdraw_here(scripts, keys, here, confirm=confirm) if here else {}
    left = [(s, r) for s, r in met if (s, r.offset, r.delay_id) not in found]
    found = {**found, **_withdraw_taken_back(scripts, keys, left, mover)}
    # Still in flight: being produced here, or leased by no mover of this replica (an earlier
    # owner's, which may have claimed it only to put it back): kept for it to come back.
    mover.keep_missed(
        [(s, r) for s, r in left if (s, r.offset, r.delay_id) not in found], mark, time.monotonic()
    )
    return found


def withdraw_here(
    scripts: Scripts,
    keys: Keys,
    cancels: Sequence[tuple[Shard, Scheduled | Cancel]],
    *,
    confirm: Confirm,
) -> FoundAt:
    """Withdraw what ``cancels`` and replacements, which found nothing anywhere but a record with
    their id in flight, name in their own partition after all: a record the mover had claimed
    when add.lua ran, and then put back (:meth:`bridge.catchup.CatchUp.past`: the ingress had not
    said the partition was read), waits again — in flight when the cancel looked, it was not past
    cancel. Looked for by the id index, its delay-id and timestamp read in the delay topic as
    across partitions (stamped no later than the cancel); a record in flight again, or
    delivered, stays where it is."""
    by_shard: dict[Shard, list[tuple[Shard, Scheduled | Cancel]]] = {}
    for shard, cancel in cancels:
        by_shard.setdefault(shard, []).append((shard, cancel))
    asked = list(by_shard.items())
    return look(scripts, keys, cancels, {}, confirm, set(), set(), asked).found


def _withdraw_taken_back(
    scripts: Scripts,
    keys: Keys,
    met: Sequence[tuple[Shard, Scheduled | Cancel]],
    mover: InFlight,
) -> FoundAt:
    """Withdraw the records that ``met`` cancels and replacements name by a default id of their
    own shard (``<topic>:<partition>:<offset>``, not in the id index) and that the mover claimed
    ahead and takes back (not produced yet: held until due), or put back since the mark (into
    the due index or a target's wait index). The shard's claims are held from the asking until
    the withdrawal is done, so a record taken or put back is not claimed again first."""
    named: dict[Shard, dict[int, tuple[Shard, Scheduled | Cancel]]] = {}
    for s, r in met:
        parts = parse_origin(r.delay_id)
        if parts is None or (parts[0], parts[1]) != (s.topic, s.partition) or s.incarnation:
            continue
        if isinstance(r, Scheduled) and r.default_of is not None:
            continue  # its own default id
        named.setdefault(s, {}).setdefault(parts[2], (s, r))  # the first that names it
    found: FoundAt = {}
    for shard, by_offset in named.items():
        try:
            dues = mover.take_back(shard, by_offset)
            hits: Hits = {
                offset_bytes(offset): (*by_offset[offset], due, "") for offset, due in dues.items()
            }
            found.update(withdraw_hits(scripts, keys, [(shard, hits)]).found if hits else {})
        finally:
            mover.taken_back(shard)
    return found
