"""A bridge process a test starts with this folder on PYTHONPATH and ``STORE_FAULT_VALUE`` set
fails to store any batch of a partition that holds a record with that value, as a bug in the
bridge would (a ``ValueError`` while add.lua's arguments are made): the ingress must dead-letter
that record alone and store the rest (bridge.ingress.careful)."""

import os

_VALUE = os.environ.get("STORE_FAULT_VALUE", "").encode()

if _VALUE:
    from typing import Any

    from bridge.message import Scheduled
    from bridge.store import adding

    _add_call = adding.add_call

    def _failing(*args: Any, **kwargs: Any) -> Any:
        _, records = args[3]
        if any(isinstance(r, Scheduled) and r.value == _VALUE for r in records):
            raise ValueError("a record this bridge cannot store (injected by the test)")
        return _add_call(*args, **kwargs)

    setattr(adding, "add_call", _failing)  # noqa: B010
