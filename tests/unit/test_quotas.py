"""Which quota a target has: the first pattern of limits.max_waiting_per_target that fully
matches it, in the order the config gives them."""

from __future__ import annotations

from typing import cast

from bridge.ingress.quotas import Quotas
from bridge.store import Store


def test_the_first_pattern_that_fully_matches_sets_a_targets_quota() -> None:
    quotas = Quotas({"orders[.]eu": 5, "orders[.].*": 100, "mail": 0}, cast(Store, None))
    assert quotas
    assert quotas.quota_of("orders.eu") == ("orders[.]eu", 5)
    assert quotas.limit("orders.us") == 100
    assert quotas.limit("mail") == 0
    assert quotas.limit("mail.reminders") is None  # fully: "mail" is not a prefix pattern
    assert quotas.limit("ordersXus") is None
    assert not Quotas({}, cast(Store, None))
