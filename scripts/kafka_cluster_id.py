"""Print a new Kafka cluster id for ``kafka-storage format -t`` (scripts/services)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable


def cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """16 random bytes in URL-safe base64 without padding, as Kafka writes a Uuid — drawn again
    while the text holds a "-": one starting with it reads as an option to ``kafka-storage``
    ("argument --cluster-id/-t: expected one argument"), and Kafka's own generator skips ids
    with a "-" anywhere."""
    while True:
        text = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if "-" not in text:
            return text


if __name__ == "__main__":
    print(cluster_id())
