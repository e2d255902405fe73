"""Small Kafka admin helper for scripts/services: readiness probe and topic creation."""

from __future__ import annotations

import argparse
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


def ready(admin: AdminClient, timeout: float, brokers: int = 1) -> int:
    """Exit 0 when a metadata request lists topics and at least ``brokers`` brokers."""
    metadata = admin.list_topics(timeout=timeout)
    return 0 if len(metadata.brokers) >= brokers else 1


def create(
    admin: AdminClient, name: str, partitions: int, config: dict[str, str], timeout: float
) -> int:
    """Create a topic unless it exists already."""
    if name in admin.list_topics(timeout=timeout).topics:
        return 0
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    futures = admin.create_topics([topic])
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            print(f"kafka_admin: cannot create topic {name}: {exc}", file=sys.stderr)
            return 1
    print(f"created topic {name} ({partitions} partitions)", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--timeout", type=float, default=5.0)
    sub = parser.add_subparsers(dest="command", required=True)
    ready_p = sub.add_parser("ready")
    ready_p.add_argument("--brokers", type=int, default=1, help="how many must be up")
    create_p = sub.add_parser("create")
    create_p.add_argument("name")
    create_p.add_argument("--partitions", type=int, default=3)
    create_p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    admin = AdminClient({"bootstrap.servers": args.bootstrap, "log_level": 0})
    try:
        if args.command == "ready":
            return ready(admin, args.timeout, args.brokers)
        config = dict(item.split("=", 1) for item in args.config)
        return create(admin, args.name, args.partitions, config, args.timeout)
    except KafkaException as exc:
        print(f"kafka_admin: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
