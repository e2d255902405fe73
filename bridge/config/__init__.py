"""The configuration: its schema, loaded strictly from YAML and the environment, and shown."""

from bridge.config.librdkafka import (
    admin_settings,
    consumer_settings,
    kafka_settings,
    member_instance,
    producer_settings,
    read_back_settings,
    transactional_id,
    transactional_settings,
)
from bridge.config.loader import from_mapping, load
from bridge.config.schema import Config, EgressConfig, IngressConfig, StoreConfig
from bridge.config.show import dump, redact, redact_url

__all__ = [
    "Config",
    "EgressConfig",
    "IngressConfig",
    "StoreConfig",
    "admin_settings",
    "consumer_settings",
    "dump",
    "from_mapping",
    "kafka_settings",
    "load",
    "member_instance",
    "producer_settings",
    "read_back_settings",
    "redact",
    "redact_url",
    "transactional_id",
    "transactional_settings",
]
