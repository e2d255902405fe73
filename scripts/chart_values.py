"""The chart README's values table, from the ``# --`` comments of values.yaml.

    python scripts/chart_values.py          print the table
    python scripts/chart_values.py --write  rewrite it between the markers in the chart README

A comment block starting with ``# --`` documents the key on the line after it; a documented
mapping documents everything under it. ``problems()`` lists keys nobody documented.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "delay-bridge"
START, END = "<!-- values:start -->", "<!-- values:end -->"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-]+):")


@dataclass(frozen=True)
class Value:
    key: str
    default: Any
    description: str


def documented(text: str) -> dict[str, str]:
    """Key path → description, for every key with a ``# --`` comment."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        match = _KEY.match(line)
        if not match or not stripped:
            pending = None if not stripped else pending
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if pending is not None:
            out[".".join(k for _, k in stack)] = " ".join(pending)
            pending = None
    return out


def _lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def values(chart: Path = CHART) -> list[Value]:
    text = (chart / "values.yaml").read_text()
    loaded = yaml.safe_load(text)
    return [Value(k, _lookup(loaded, k), d) for k, d in documented(text).items()]


def problems(chart: Path = CHART) -> list[str]:
    """Keys of values.yaml that no ``# --`` comment covers, and comments on no key."""
    text = (chart / "values.yaml").read_text()
    docs = documented(text)
    out = []
    for leaf in _leaves(yaml.safe_load(text)):
        parts = leaf.split(".")
        if not any(".".join(parts[:i]) in docs for i in range(1, len(parts) + 1)):
            out.append(f"{leaf}: no '# --' comment on it or a parent")
    return out


def table(chart: Path = CHART) -> str:
    rows = ["| key | default | description |", "|---|---|---|"]
    for v in values(chart):
        default = json.dumps(v.default, separators=(", ", ": "))
        rows.append(f"| `{v.key}` | `{default}` | {v.description} |")
    return "\n".join(rows)


def write(chart: Path = CHART) -> None:
    readme = chart / "README.md"
    text = readme.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table(chart)}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(table())
