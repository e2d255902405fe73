"""The chart's values.schema.json, from values.yaml and the bridge's own config dataclasses.

    python scripts/chart_schema.py          print it
    python scripts/chart_schema.py --write  rewrite helm/delay-bridge/values.schema.json

Every value of the chart gets the type of its default; the chart's own groups take no unknown
key. Under ``config`` the schema mirrors :class:`bridge.config.Config`: the same keys and no
other (a typo fails ``helm lint`` / ``helm template`` naming it), lists as arrays, flags as
booleans, durations as text or milliseconds — and the single-value rules of ``delay-bridge
check-config`` (duration syntax, enums, minimums, topic names; ``CONFIG_RULES``). The rules that
span several keys, or need a duration's value, are the chart's ``delay-bridge.validate`` template.
Kubernetes objects passed through as they are (probes, security contexts, resources, affinity,
...) are only checked to be objects or lists.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bridge.config import Config  # noqa: E402
from bridge.message import DIALECTS  # noqa: E402

CHART = ROOT / "helm" / "delay-bridge"
SCHEMA = CHART / "values.schema.json"
# Values whose contents are Kubernetes' (or Prometheus' / the user's own labels): any keys.
PASSTHROUGH = {
    "imagePullSecrets",
    "extraEnv",
    "envFrom",
    "extraVolumes",
    "extraVolumeMounts",
    "serviceAccount.annotations",
    "podAnnotations",
    "podLabels",
    "podSecurityContext",
    "securityContext",
    "updateStrategy",
    "startupProbe",
    "livenessProbe",
    "readinessProbe",
    "resources",
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "metrics.serviceMonitor.labels",
    "metrics.serviceMonitor.relabelings",
    "metrics.serviceMonitor.metricRelabelings",
    "metrics.serviceMonitor.namespaceSelector",
    "metrics.prometheusRule.labels",
    "metrics.prometheusRule.ruleLabels",
    "metrics.prometheusRule.additionalRules",
    "metrics.grafanaDashboard.labels",
    "console.ingress.annotations",
    "console.ingress.tls",
}
REQUIRED_CONFIG = {"kafka": ["bootstrap_servers"], "redis": ["url"]}
SCALAR = ["string", "number", "boolean"]
# parse_duration_ms: digits alone (ms), or units from the largest to the smallest, at least one.
DURATION = {
    "allOf": [
        {"pattern": r"^\s*([0-9]+|([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)\s*$"},
        {"pattern": "[0-9]"},
    ]
}
# A duration that must be above 0: no digit but zeros.
POSITIVE_DURATION = {"minimum": 1, "not": {"type": "string", "pattern": r"^\s*[0dhms]*\s*$"}}
TOPIC = {"pattern": r"^[a-zA-Z0-9._-]{1,249}$", "not": {"enum": [".", ".."]}}
# check-config's rules on single values (config._validate), by config path.
CONFIG_RULES: dict[str, dict[str, Any]] = {
    "kafka.bootstrap_servers": {"minLength": 1},
    "kafka.group_id": {"minLength": 1},
    "kafka.group_instance_id": {"pattern": r"^[a-zA-Z0-9._-]{0,249}$"},
    "redis.url": {"minLength": 1, "pattern": "^(redis|rediss|unix)://"},
    "redis.key_prefix": {"pattern": "^[^{}]+$"},
    "redis.socket_timeout": POSITIVE_DURATION,
    "redis.sentinel.nodes": {"items": {"type": "string", "pattern": "^.+:[0-9]+$"}},
    "topics.delay": {"minItems": 1, "items": {"type": "string", **TOPIC}},
    "topics.dead_letter": TOPIC,
    # <delay>: the first delay topic's name (bridge.config.schema.FIRST_DELAY).
    "tracing.mode": {"enum": ["continue", "link"]},
    "topics.journal": {"pattern": r"^([a-zA-Z0-9._-]|<delay>)*$", "not": {"enum": [".", ".."]}},
    "topics.dialect": {"additionalProperties": {"enum": list(DIALECTS)}},
    "ingress.batch_size": {"minimum": 1},
    "egress.batch_size": {"minimum": 1, "maximum": 10_000},
    "egress.lease": POSITIVE_DURATION,
    "egress.max_attempts": {"minimum": 1},
    "egress.max_rate": {"minimum": 0},
    "egress.max_rate_per_target": {
        "propertyNames": TOPIC,
        "additionalProperties": {"type": "integer", "minimum": 0},
    },
    **{
        path: {"minimum": 0, "maximum": 1000}
        for path in (
            "ingress.linger",
            "ingress.hold",
            "egress.tick",
            "egress.send_tick",
            "egress.ahead",
        )
    },
    "store.fetch_ahead": POSITIVE_DURATION,
    "limits.max_delay": POSITIVE_DURATION,
    "limits.max_record_bytes": {"minimum": 1},
    "limits.max_waiting_per_target": {
        "propertyNames": {"minLength": 1},
        "additionalProperties": {"type": "integer", "minimum": 0},
    },
    "http.port": {"minimum": 0, "maximum": 65535},
    "logging.level": {
        "pattern": "^(?i)(critical|fatal|error|warn|warning|info|debug|notset)$",
    },
}
# One alert's values (metrics.prometheusRule.rules.<alert>).
ALERT_RULE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "disabled": {"type": "boolean"},
        "severity": {"type": "string", "minLength": 1},
        "for": {
            "type": ["string", "integer"],
            "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$",
            "maximum": 0,
            "minimum": 0,
        },
        "threshold": {"type": "number", "minimum": 0},
    },
}
# The chart's own values that take one of a few.
VALUE_RULES: dict[str, dict[str, Any]] = {
    "workloadKind": {"enum": ["StatefulSet", "Deployment"]},
    "replicaCount": {"minimum": 0},
    "service.port": {"minimum": 1, "maximum": 65535},
    "metrics.serviceMonitor.scrapeTimeout": {"pattern": "^(([0-9]+(ms|s|m|h))+)?$"},
}


def of_value(value: Any, path: str) -> dict[str, Any]:
    """The schema of a chart value, from its default."""
    return {**_of_value(value, path), **VALUE_RULES.get(path, {})}


def _of_value(value: Any, path: str) -> dict[str, Any]:
    if path == "config":
        return of_dataclass(Config, "")
    if path.startswith("metrics.prometheusRule.rules."):
        return ALERT_RULE
    if path in PASSTHROUGH:
        return {"type": "array" if isinstance(value, list) else "object"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    if isinstance(value, dict):
        props = {k: of_value(v, f"{path}.{k}".lstrip(".")) for k, v in value.items()}
        return {"type": "object", "additionalProperties": False, "properties": props}
    raise TypeError(f"{path}: no schema for {value!r}")


def of_dataclass(cls: type[Any], path: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    props = {
        f.name: of_field(hints[f.name], f, f"{path}.{f.name}".lstrip("."))
        for f in dataclasses.fields(cls)
    }
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if path in REQUIRED_CONFIG:
        out["required"] = REQUIRED_CONFIG[path]
    if not path:
        out["required"] = sorted(REQUIRED_CONFIG)
    return out


def of_field(hint: Any, f: dataclasses.Field[Any], path: str) -> dict[str, Any]:
    return {**_of_field(hint, f, path), **CONFIG_RULES.get(path, {})}


def _of_field(hint: Any, f: dataclasses.Field[Any], path: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(hint):
        return of_dataclass(hint, path)  # type: ignore[arg-type]
    origin = typing.get_origin(hint)
    if f.metadata.get("duration"):
        return {
            "type": ["string", "integer"],
            "minimum": 0,
            **DURATION,
            "description": "a duration: 30s, 15m, 2h, 1h30m, or ms",
        }
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is str:
        return {"type": "string"}
    if origin is tuple:
        return {"type": "array", "items": {"type": "string"}}
    if origin is dict:
        return {"type": "object", "additionalProperties": {"type": SCALAR}}
    if origin in (typing.Union, types.UnionType):
        return {"type": SCALAR}
    raise TypeError(f"config.{path}: no schema for {hint!r}")


def schema() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    top = of_value(values, "")
    top["properties"]["global"] = {"type": "object"}  # what Helm passes a subchart
    top["$schema"] = "https://json-schema.org/draft-07/schema#"
    top["title"] = "delay-bridge chart values"
    return top


def main() -> int:
    text = json.dumps(schema(), indent=2) + "\n"
    if sys.argv[1:] == ["--write"]:
        SCHEMA.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
