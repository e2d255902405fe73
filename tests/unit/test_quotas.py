"""Which quota a target has: the first pattern of limits.max_waiting_per_target that fully
matches it, in the order the config gives them."""

from __future__ import annotations

from typing import cast

from bridge.ingress.quotas import Quotas
from bridge.store import Store
from bridge.store.calls import targets_argv


def test_the_first_pattern_that_fully_matches_sets_a_targets_quota() -> None:
    quotas = Quotas({"orders[.]eu": 5, "orders[.].*": 100, "mail": 0}, cast(Store, None))
    assert quotas
    assert quotas.quota_of("orders.eu") == ("orders[.]eu", 5)
    assert quotas.limit("orders.us") == 100
    assert quotas.limit("mail") == 0
    assert quotas.limit("mail.reminders") is None  # fully: "mail" is not a prefix pattern
    assert quotas.limit("ordersXus") is None
    assert not Quotas({}, cast(Store, None))


def test_each_items_target_is_named_once_and_numbered_in_two_bytes() -> None:
    """The per-target counts' argument (named_targets in _lib.lua): T names in first-seen order,
    then 2 bytes per item — "" is 0 (a cancel or a reference, not counted), past 255 targets
    the numbers take both bytes."""
    assert targets_argv([]) == [0, b""]
    assert targets_argv(["a", "", "b", "a"]) == [2, "a", "b", b"\x00\x01\x00\x00\x00\x02\x00\x01"]
    many = [f"t{i}" for i in range(300)]
    argv = targets_argv([*many, "t299", ""])
    assert argv[0] == 300 and argv[1:301] == many
    numbers = argv[301]
    assert len(numbers) == 2 * 302
    assert [int.from_bytes(numbers[i : i + 2], "big") for i in range(0, len(numbers), 2)] == [
        *range(1, 301),
        300,
        0,
    ]
