"""The effective config shown with its secrets redacted (check-config, logs)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import fields
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from bridge.config.schema import Config
from bridge.message import (
    format_duration_ms,
)

REDACTED = "***"
_SECRET_KEY = re.compile(
    r"password|secret|token|credential|jaas|oauthbearer\.config|key\.pem", re.I
)


def redact(config: Config) -> dict[str, Any]:
    """The effective config as plain data, with secrets replaced by ``***``."""
    return _shown(config)


def _shown(value: Any) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for f in fields(value):
        item = getattr(value, f.name)
        if dataclasses.is_dataclass(item):
            item = _shown(item)
        elif f.metadata.get("duration"):
            item = format_duration_ms(item)
        elif isinstance(item, tuple):
            item = list(item)
        elif isinstance(item, dict):
            item = {k: (REDACTED if _SECRET_KEY.search(k) else v) for k, v in item.items()}
        elif f.name == "password" and item:
            item = REDACTED
        elif f.name == "url" and isinstance(item, str):
            item = redact_url(item)
        shown[f.name] = item
    return shown


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced: for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}{port}"))


def dump(config: Config) -> str:
    """YAML of :func:`redact`."""
    return yaml.safe_dump(redact(config), sort_keys=False)
