"""What the mover puts back for an ingress reading behind (bridge.catchup), on made-up claims."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

import pytest

from bridge.catchup import (
    FETCH_SLACK_MS,
    KEPT_ELSEWHERE,
    LIVE_MARGIN_MS,
    STALLED_S,
    TOLD_AGAIN_S,
    UNANSWERED_S,
    CatchUp,
)
from bridge.claiming import MISSED_KEPT_S, Held
from bridge.message import Cancel, Scheduled, origin
from bridge.store import Claimed, Shard
from bridge.store.keys import offset_bytes

SHARD = Shard("delay", 0)
T0 = 1_800_000_000_000
NOW = T0 + 60_000  # the claim's now, by Redis's clock: the latest due time the tests claim


def claimed(
    offset: int,
    due_ms: int,
    delay_id: str | None = None,
    *,
    shard: Shard = SHARD,
    redelivery: bool = False,
) -> Claimed:
    record = Scheduled(
        offset,
        due_ms,
        "out",
        b"k",
        b"v",
        [],
        delay_id or origin(shard.topic, shard.partition, offset),
    )
    return Claimed(shard, offset_bytes(offset), record, redelivery)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_read_live_behind_only_own_ids_due_past_the_read_records_wait() -> None:
    clock = Clock()
    catch_up = CatchUp(clock)
    catch_up.read(SHARD, T0)
    catch_up.behind({SHARD: (10, 20)})
    claims = [
        claimed(1, T0 + LIVE_MARGIN_MS, "job-1"),  # produced by the margin before: read already
        claimed(2, T0 + LIVE_MARGIN_MS + 1, "job-2"),  # its cancel may be unread
        claimed(3, T0 + 60_000),  # the default delay-id: nothing can withdraw it
        # Claimed before, by an owner that may have claimed it only to put it back: the same.
        claimed(4, T0 + 60_000, "job-4", redelivery=True),
        claimed(5, T0 + 60_000, "job-5"),  # in flight
    ]
    assert [c.record.offset for c in catch_up.past(claims, {(SHARD, offset_bytes(5))}, NOW)] == [
        2,
        4,
    ]
    catch_up.read(SHARD, T0 + 1)  # the ingress moves on
    assert catch_up.past(claims[1:2], (), NOW) == []


def test_a_shard_at_its_end_or_stalled_with_nothing_open_holds_nothing() -> None:
    clock = Clock()
    catch_up = CatchUp(clock)
    catch_up.read(SHARD, T0)
    late = [claimed(1, T0 + 60_000, "job-1")]
    catch_up.behind({})  # the last fetch saw nothing more
    assert catch_up.past(late, (), NOW) == []
    catch_up.behind({SHARD: (10, 20)})
    assert len(catch_up.past(late, (), NOW)) == 1
    assert catch_up.standing_still() is None  # not yet asked: it has not stood still
    clock.now += STALLED_S  # still behind, at the same position: asked why
    catch_up.behind({SHARD: (10, 20)})
    assert len(catch_up.past(late, (), NOW)) == 1  # not until the answer says so
    assert catch_up.standing_still() == (SHARD, (10, 20))
    catch_up.stable(SHARD, (10, 20), 20)  # everything to the end is decided: nothing to read
    assert catch_up.past(late, (), NOW) == []
    assert catch_up.standing_still() is None
    catch_up.behind({SHARD: (11, 20)})  # it moves again
    assert len(catch_up.past(late, (), NOW)) == 1
    clock.now += STALLED_S
    catch_up.behind({SHARD: (11, 20)})
    catch_up.stable(SHARD, (11, 20), 21)  # the end moved since the fetch: still nothing to read
    assert catch_up.past(late, (), NOW) == []
    # Its end moves, its position not: something came behind what it cannot read (another
    # producer's open transaction), which may be the record's cancel.
    catch_up.behind({SHARD: (11, 21)})
    assert len(catch_up.past(late, (), NOW)) == 1
    catch_up.stop(SHARD)  # revoked: not read here any more
    assert catch_up.past(late, (), NOW) == []


def test_a_shard_behind_an_open_transaction_holds_its_own_ids_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its last stable offset below its end: another producer's transaction is open there, and a
    cancel behind it is unread however long the partition stands still."""
    clock = Clock()
    catch_up = CatchUp(clock)
    catch_up.read(SHARD, T0)
    late = [claimed(1, T0 + 60_000, "job-1"), claimed(2, T0 + 60_000)]
    with caplog.at_level(logging.INFO, logger="bridge.catchup"):
        for _ in range(5):
            clock.now += STALLED_S
            catch_up.behind({SHARD: (11, 14)})
            if (still := catch_up.standing_still()) is not None:
                catch_up.stable(*still, 11)  # open from the read position
            assert [c.record.offset for c in catch_up.past(late, (), NOW)] == [1]
        opened = [r for r in caplog.records if "transaction open from offset 11" in r.getMessage()]
        assert len(opened) == 1  # said once per transaction
        catch_up.behind({SHARD: (11, 15)})  # its end moves: asked again once it stands still
        clock.now += STALLED_S
        catch_up.behind({SHARD: (11, 15)})
        catch_up.stable(SHARD, (11, 15), 11)
        assert len([r for r in caplog.records if "open from offset" in r.getMessage()]) == 1
    assert catch_up.held_partitions()["open-transaction"] == 1
    clock.now += STALLED_S
    catch_up.behind({SHARD: (11, 15)})
    catch_up.stable(SHARD, (11, 15), 15)  # committed: the consumer reads on
    assert catch_up.past(late, (), NOW) == []
    assert catch_up.held_partitions()["open-transaction"] == 0


def test_an_unanswered_ask_holds_every_ask_back_for_a_while() -> None:
    """A broker's outage stands every partition still: one unanswered ask, and none for
    UNANSWERED_S, so the ingress does not spend its turns waiting for answers."""
    clock = Clock()
    catch_up = CatchUp(clock)
    other = Shard("delay", 1)
    catch_up.behind({SHARD: (1, 2), other: (3, 4)})
    clock.now += STALLED_S
    catch_up.behind({SHARD: (1, 2), other: (3, 4)})
    shard, seen = catch_up.standing_still() or (None, (0, 0))
    assert shard in (SHARD, other)
    catch_up.stable(shard, seen, None)
    assert catch_up.standing_still() is None
    clock.now += UNANSWERED_S
    still = catch_up.standing_still()
    assert still is not None and still[0] != shard  # the other, asked first now
    catch_up.stable(*still, None)
    catch_up.stable(shard, seen, 5)  # answered: nothing there to read
    clock.now += UNANSWERED_S
    assert catch_up.standing_still() is not None
    catch_up.block(SHARD, True)  # held at a record: behind whatever the answer
    catch_up.block(other, True)
    assert catch_up.standing_still() is None


def test_a_shard_that_goes_behind_and_level_again_is_said_behind_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A partition written by transactions is behind while one is open and level between: the
    log says so once a minute, not at every put-back."""
    clock = Clock()
    catch_up = CatchUp(clock)
    catch_up.read(SHARD, T0)
    late = [claimed(1, T0 + 60_000, "job-1")]
    with caplog.at_level(logging.INFO, logger="bridge.catchup"):
        for _ in range(10):
            catch_up.behind({SHARD: (10, 20)})
            assert len(catch_up.past(late, (), NOW)) == 1
            catch_up.behind({})  # level again: a claim meanwhile holds nothing
            assert catch_up.past(late, (), NOW) == []
            clock.now += 1
        told = [r for r in caplog.records if "behind" in r.getMessage()]
        assert len(told) == 1
        clock.now += TOLD_AGAIN_S
        catch_up.behind({SHARD: (10, 20)})
        assert len(catch_up.past(late, (), NOW)) == 1
        assert len([r for r in caplog.records if "behind" in r.getMessage()]) == 2


def test_a_catch_up_holds_every_record_past_its_horizon() -> None:
    catch_up = CatchUp(Clock())
    catch_up.start(SHARD, 0, 100)
    catch_up.read(SHARD, T0)
    catch_up.behind({SHARD: (10, 20)})
    claims = [claimed(1, T0), claimed(2, T0 + 1), claimed(3, T0 + 60_000, "job-3")]
    assert [c.record.offset for c in catch_up.past(claims, (), NOW)] == [2, 3]
    catch_up.reached(SHARD, 100)  # caught up; read live from here, still behind the fetch
    assert [c.record.offset for c in catch_up.past(claims, (), NOW)] == [3]


def test_a_shard_read_again_after_a_loss_is_a_reread_until_it_reaches_its_end() -> None:
    """Of the catch-ups, those of shards read again after Redis lost what they stored are
    re-reads (add.lua applies their rule up to the end), until the end is reached, the shard is
    read again otherwise, or it is revoked."""
    catch_up = CatchUp(Clock())
    other = Shard("delay", 1)
    catch_up.start(SHARD, 0, 100, again=True)
    catch_up.start(other, 5, 50)  # a catch-up after a rebalance: stored before, and not lost
    assert catch_up.rereads() == {SHARD: 100}
    catch_up.reached(SHARD, 99)
    assert catch_up.rereads() == {SHARD: 100}
    catch_up.reached(SHARD, 100)
    assert catch_up.rereads() == {}
    catch_up.start(SHARD, 0, 100, again=True)
    catch_up.start(SHARD, 60, 100)  # read again from elsewhere, not after a loss
    assert catch_up.rereads() == {}
    catch_up.start(other, 5, 50, again=True)
    catch_up.stop(other)
    assert catch_up.rereads() == {}


def test_a_held_shard_has_nothing_new_claimed_whatever_is_read() -> None:
    """While what the journal holds is not forgotten in Redis (bridge.ingress.settled), a shard's
    horizon is below every due time, caught up or not; a lease that ran out is claimed again."""
    catch_up = CatchUp(Clock())
    other = Shard("delay", 1)
    catch_up.start(other, 0, 100)
    catch_up.hold(SHARD, True)
    catch_up.read(SHARD, T0 + 60_000)
    assert catch_up.horizons() == {SHARD: -1, other: 0}
    claims = [claimed(1, T0), claimed(2, T0, redelivery=True)]
    assert [c.record.offset for c in catch_up.past(claims, (), NOW)] == [1]
    catch_up.hold(SHARD, False)
    assert catch_up.horizons() == {other: 0} and catch_up.past(claims, (), NOW) == []
    catch_up.hold(SHARD, True)
    catch_up.stop(SHARD)  # revoked
    assert catch_up.horizons() == {other: 0}


def test_a_shard_held_for_two_reasons_is_claimed_from_once_both_are_over() -> None:
    catch_up = CatchUp(Clock())
    catch_up.hold(SHARD, True, "settle")
    catch_up.hold(SHARD, True, "journal")
    catch_up.hold(SHARD, False, "settle")
    assert catch_up.horizons() == {SHARD: -1}, "the journal still holds it"
    catch_up.hold(SHARD, False, "journal")
    assert catch_up.horizons() == {}


def test_a_batch_in_the_ingress_hands_holds_its_shards_behind_until_its_verdict() -> None:
    """A shard read at its end, then a batch of it taken: until the ingress has applied it and
    said how far it reads (behind), a cancel may be in it, read and not applied — its records
    with their own delay-id due past the margin wait. Other shards are not held by it."""
    clock = Clock()
    catch_up = CatchUp(clock)
    other = Shard("delay", 1)
    catch_up.read(SHARD, T0)
    catch_up.read(other, T0)
    catch_up.behind({})  # both read at their end
    due = T0 + LIVE_MARGIN_MS + 1
    claims = [claimed(1, due, "job-1"), claimed(2, due, "job-2", shard=other)]
    assert catch_up.past(claims, (), NOW) == []
    catch_up.taken(frozenset({SHARD}))
    assert [c.record.offset for c in catch_up.past(claims, (), NOW)] == [1]
    catch_up.read(SHARD, T0 + 1)  # the batch applied...
    catch_up.behind({})  # ...and the shard read at its end again
    assert catch_up.past(claims, (), NOW) == []


def test_a_shard_said_at_its_end_is_trusted_only_for_records_due_within_the_margin_of_the_saying() -> (
    None
):
    """Read at its end when the ingress last said so: everything produced FETCH_SLACK_MS before
    that was read, so a record due up to LIVE_MARGIN_MS after that, less the slack, has had its
    cancels read. One due later waits for the ingress to say so again — it may be storing a
    batch of another partition while this one's cancel waits in the consumer's queue. When it
    said so is the claim's now (Redis's clock) less the saying's age (the monotonic clock): the
    bridge's own wall clock, ahead or behind, does not enter."""
    clock = Clock()
    catch_up = CatchUp(clock)
    other = Shard("delay", 1)
    catch_up.read(SHARD, T0 - 5_000)
    catch_up.behind({})  # said as the claim reads Redis's clock at T0: both read at their end
    edge = T0 + LIVE_MARGIN_MS - FETCH_SLACK_MS
    claims = [claimed(1, edge, "job-1"), claimed(2, edge + 1, "job-2", shard=other)]
    claims.append(claimed(3, edge + 1))  # the default delay-id: nothing can withdraw it
    assert [c.record.offset for c in catch_up.past(claims, (), T0)] == [2]
    clock.now += 0.001  # the same saying, a ms older at the next claim
    assert [c.record.offset for c in catch_up.past(claims, (), T0 + 1)] == [2]
    assert [c.record.offset for c in catch_up.past(claims, (), T0)] == [1, 2]
    catch_up.behind({})  # said again
    assert catch_up.past(claims, (), T0 + 1) == []


def test_a_catch_up_the_ingress_never_spoke_to_trusts_every_shard() -> None:
    """A mover without an ingress (a test's, a tool's): no saying to wait for."""
    assert CatchUp(Clock()).past([claimed(1, T0 + 60_000, "job-1")], (), NOW) == []


def test_a_take_back_takes_the_records_out_at_once_holds_the_shard_and_gives_what_was_put_back() -> (
    None
):
    catch_up = CatchUp()
    shard = Shard("delay", 0)
    held = {7: (5_000, (shard, offset_bytes(7))), 8: (6_000, (shard, offset_bytes(8)))}
    woken: list[bool] = []

    def take_out(s: Shard, offsets: Collection[int]) -> list[Held]:
        return [held.pop(o) for o in sorted(offsets) if s == shard and o in held]

    def mover() -> None:  # what the mover's turn does when woken
        for ask in catch_up.asked_back():
            woken.append(catch_up.horizons() == {shard: -1})  # nothing new claimed meanwhile
            ask.answer({int.from_bytes(m, "big"): due for due, (_, m) in ask.taken})

    catch_up.wake = lambda: threading.Thread(target=mover).start()
    catch_up.take_out = take_out
    other = Shard("delay", 1)
    assert catch_up.take_back(other, [7]) == {}  # not held: nothing to ask
    assert catch_up.horizons() == {other: -1} and woken == []  # held until the withdrawal
    catch_up.taken_back(other)
    assert catch_up.take_back(shard, [7, 9]) == {7: 5_000}
    assert list(held) == [8], "taken out of the mover's hands by the ingress itself"
    assert catch_up.horizons() == {shard: -1}
    catch_up.taken_back(shard)
    assert catch_up.horizons() == {}
    assert woken == [True]
    assert catch_up.asked_back() == []


def test_a_take_back_waits_for_a_claim_on_its_way_and_leaves_the_mover_what_it_took_out() -> None:
    catch_up = CatchUp()
    shard = Shard("delay", 0)
    held: list[Held] = []
    began, go = threading.Event(), threading.Event()

    def claim() -> None:  # the mover's: what it claims is held as the claim ends
        with catch_up.claiming():
            began.set()
            go.wait(5)
            held.append((5_000, (shard, offset_bytes(7))))

    claimer = threading.Thread(target=claim)
    claimer.start()
    began.wait(5)
    catch_up.take_out = lambda s, offsets: [held.pop()] if held else []
    threading.Timer(0.05, go.set).start()  # while the take-back waits, or before: either holds
    assert catch_up.take_back(shard, [7], timeout_s=0.2) == {}  # the mover did not answer
    claimer.join()
    assert held == [] and catch_up.horizons() == {shard: -1}
    [ask] = catch_up.asked_back()  # left to the mover, late: put back all the same
    assert ask.taken == ((5_000, (shard, offset_bytes(7))),)
    catch_up.taken_back(shard)
    assert catch_up.horizons() == {}


def test_a_take_back_gives_the_due_times_of_records_put_back_since_the_mark_once_their_claim_ended() -> (
    None
):
    """A record named by its default id that the mover put back (past a catch-up's horizon, or
    into its target's wait index) rather than held: withdrawn by its due time, which the mover
    said as it put it back — after the ingress's mark and before its unmark only."""
    catch_up = CatchUp()
    shard = Shard("delay", 0)

    def put_back(offset: int, due_ms: int) -> None:
        c = claimed(offset, due_ms, shard=shard)
        catch_up.put_back([c, claimed(offset + 100, due_ms, shard=shard)], {(shard, c.member)})

    put_back(6, 4_000)  # before the mark: not looked at
    catch_up.put_backs_mark()
    began, go = threading.Event(), threading.Event()

    def claim() -> None:  # the mover's, on its way: it puts the record back as it ends
        with catch_up.claiming():
            began.set()
            go.wait(5)
            put_back(7, 5_000)

    claimer = threading.Thread(target=claim)
    claimer.start()
    began.wait(5)
    threading.Timer(0.05, go.set).start()
    assert catch_up.take_back(shard, [6, 7, 107]) == {7: 5_000}  # 107 claimed, not put back
    claimer.join()
    assert catch_up.horizons() == {shard: -1}  # no claim of it until the withdrawal is done
    catch_up.taken_back(shard)
    assert catch_up.put_back_since(0) == {shard}
    catch_up.put_backs_unmark()
    put_back(8, 6_000)  # unmarked: not kept
    catch_up.put_backs_mark()
    assert catch_up.take_back(shard, [7, 8]) == {}  # a new mark: what came before is not kept
    catch_up.taken_back(shard)


def test_a_cancel_kept_caps_its_topics_catch_ups_at_its_timestamp_and_holds_them_as_they_end() -> (
    None
):
    """The ingress keeps a cancel read in a topic whose other partition it reads behind its
    end (the record it names may be read yet): that partition claims nothing due after the
    cancel was stamped — a record due later, stored on the way, would be claimed before the
    cancel looks again — and is held as its catch-up ends, until let go. Another topic's
    catch-up goes on."""
    catch_up = CatchUp()
    elsewhere = Shard("other", 0)
    for shard in (SHARD, elsewhere):
        catch_up.start(shard, 0, 100)
        catch_up.read(shard, T0 + 5_000)
    catch_up.kept({SHARD.topic: T0 + 1_000})
    assert catch_up.horizons() == {SHARD: T0 + 1_000, elsewhere: T0 + 5_000}
    assert not catch_up.reached(SHARD, 100)  # not a re-read after a loss ...
    assert catch_up.horizons() == {SHARD: -1, elsewhere: T0 + 5_000}  # ... but held all the same
    assert catch_up.holding(KEPT_ELSEWHERE) == {SHARD}
    catch_up.kept({})
    assert catch_up.horizons()[SHARD] == -1, "let go only by the ingress"
    catch_up.hold(SHARD, False, KEPT_ELSEWHERE)
    catch_up.reached(elsewhere, 100)
    assert catch_up.horizons() == {}


def test_a_re_read_claims_nothing_due_after_what_its_topics_other_partitions_keep() -> None:
    """A shard read again after a loss claims nothing until the ingress first looked at what its
    topic's other partitions keep, then nothing due after what it found (the earliest cancel
    kept, by any replica); a catch-up that is no re-read goes on by its horizon."""
    catch_up = CatchUp()
    other = Shard("delay", 1)
    catch_up.start(SHARD, 0, 100, again=True)
    catch_up.start(other, 0, 100)
    for shard in (SHARD, other):
        catch_up.read(shard, T0 + 5_000)
    assert catch_up.horizons() == {SHARD: -1, other: T0 + 5_000}
    catch_up.kept_elsewhere({SHARD: T0 + 1_000})
    assert catch_up.horizons() == {SHARD: T0 + 1_000, other: T0 + 5_000}
    catch_up.kept_elsewhere({SHARD: T0 + 9_000})  # nothing kept: Redis's clock then
    assert catch_up.horizons() == {SHARD: T0 + 5_000, other: T0 + 5_000}


def test_held_partitions_counts_each_why_a_shard_waits_for_the_ingress() -> None:
    catch_up = CatchUp(Clock())
    other = Shard("delay", 1)
    catch_up.start(SHARD, 0, 100)
    catch_up.hold(SHARD, True, KEPT_ELSEWHERE)
    catch_up.hold(other, True)
    catch_up.hold(other, True, "journal")
    catch_up.block(other, True)
    held = catch_up.held_partitions()
    assert {k: v for k, v in held.items() if v} == {
        "catching-up": 1,
        "kept-elsewhere": 1,
        "settle": 1,
        "journal": 1,
        "dlq-refused": 1,
    }
    catch_up.stop(SHARD)
    catch_up.stop(other)
    assert not any(catch_up.held_partitions().values())


def test_a_cancel_kept_for_its_record_in_flight_puts_it_back_until_it_looked_again() -> None:
    """A cancel that met its record leased by no mover here (an earlier owner claimed it, then
    was killed before its put-back) is kept: the record, claimed again — a redelivery once the
    lease is taken over, at a partition read at its end — is put back while the cancel names
    it, and the cancel looks again once the mover put records back in its shard; records of
    its id after it (a replacement, a schedule carried on) are not held."""
    clock = Clock()
    catch_up = CatchUp(clock)
    catch_up.behind({})
    cancel = Cancel(7, "job-1")
    left = claimed(3, T0, "job-1", redelivery=True)
    assert catch_up.past([left], (), NOW) == []  # nothing kept: a fresh claim, read at its end
    mark = catch_up.put_backs_mark()
    catch_up.put_backs_unmark()
    catch_up.keep_missed([(SHARD, cancel)], mark, clock.now)
    assert catch_up.missed_put_back(clock.now) == []  # nothing put back since
    later = claimed(9, T0, "job-1")
    assert catch_up.past([left, later], (), NOW) == [left]
    assert catch_up.past([left], {(SHARD, left.member)}, NOW) == []  # being produced here
    catch_up.put_back([left], {(SHARD, left.member)})
    assert catch_up.missed_put_back(clock.now) == [(SHARD, cancel)]
    assert catch_up.missed_put_back(clock.now) == []  # until the next put-back
    catch_up.found_missed([(SHARD, cancel)])
    assert catch_up.past([left], (), NOW) == []


def test_a_cancel_kept_for_its_record_in_flight_is_forgotten_after_a_while() -> None:
    clock = Clock()
    catch_up = CatchUp(clock)
    catch_up.behind({})
    left = claimed(3, T0, "job-1", redelivery=True)
    catch_up.keep_missed([(SHARD, Cancel(7, "job-1"))], catch_up.put_backs_mark(), clock.now)
    clock.now += MISSED_KEPT_S + 1
    catch_up.behind({})  # read at its end now
    catch_up.put_back([left], {(SHARD, left.member)})
    assert catch_up.missed_put_back(clock.now) == []
    assert catch_up.past([left], (), NOW) == []
