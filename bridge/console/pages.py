"""The console's pages at ``/ui``: HTML rendered in the bridge from the API's own answers.

Every figure on a page comes from the API call a script would make (:class:`Api`), so the page and
the API never disagree. The reads are plain links and GET forms (they work with JavaScript off);
the actions are forms that ``console.js`` posts to the API with the console token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from bridge.console.api import Api, Reply
from bridge.console.chart import SPANS, svg
from bridge.message import cut, format_time_ms, parse_count

NAV = (
    ("/ui", "Overview"),
    ("/ui/records", "Records"),
    ("/ui/schedules", "Schedules"),
    ("/ui/dlq", "Dead letters"),
)


def _e(value: object) -> str:
    return escape("" if value is None else str(value))


def _c(value: object, limit: int = 80) -> str:
    """A cell's text, escaped and cut with an ellipsis past ``limit`` characters (a producer's
    5,000-character target would widen every row; the API's JSON has it whole)."""
    return _e(cut("" if value is None else str(value), limit))


def _when(ms: int | None) -> str:
    return "-" if ms is None or ms < 0 else format_time_ms(ms)


def page(title: str, here: str, body: str) -> str:
    """A whole page: the navigation, the token field the actions use, ``body``."""
    links = "".join(
        f'<a href="{href}"{" class=here" if href == here else ""}>{name}</a>' for href, name in NAV
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} · delay-bridge</title>"
        '<link rel="stylesheet" href="/ui/static/console.css">'
        '<script src="/ui/static/console.js" defer></script></head><body>'
        f'<header><a class="brand" href="/ui">delay-bridge</a>{links}'
        '<label class="token">console token (for actions)'
        '<input id="token" type="password" autocomplete="off"></label></header>'
        f"<main><h1>{_e(title)}</h1>{body}</main></body></html>"
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """A table of ``rows`` (cells already HTML); columns in ``numeric`` right-aligned."""

    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(
            f"<{tag}{' class=num' if i in numeric else ''}>{cell}</{tag}>"
            for i, cell in enumerate(row)
        )

    head = f"<tr>{cells('th', [_e(h) for h in header])}</tr>"
    return (
        f"<table><thead>{head}</thead><tbody>"
        + "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
        + "</tbody></table>"
    )


def _failed(reply: Reply) -> str:
    return f'<p class="error">{_e(reply.body.get("error", reply.status))}</p>'


def _notes(reply: Reply) -> str:
    return "".join(f'<p class="note">{_e(m)}</p>' for m in reply.body.get("messages", []))


def _action(api: str, fields: Mapping[str, object], buttons: str, inline: bool = False) -> str:
    """A form ``console.js`` posts to ``api``: hidden ``fields``, then ``buttons`` (HTML)."""
    hidden = "".join(
        f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">' for k, v in fields.items() if v
    )
    kind = "act inline" if inline else "act"
    return (
        f'<form class="{kind}" data-api="{api}" method="post">{hidden}{buttons}'
        "<output></output></form>"
    )


def _button(
    text: str, options: Mapping[str, object] | None = None, confirm: str = "", api: str = ""
) -> str:
    """A form's button: ``options`` added to the fields, ``confirm`` asked first, ``api`` the
    call it makes instead of the form's."""
    extra = f" data-options='{_e(json.dumps(options))}'" if options else ""
    extra += f' data-confirm="{_e(confirm)}" class=danger' if confirm else ""
    extra += f' data-api="{api}"' if api else ""
    return f"<button{extra}>{_e(text)}</button>"


def overview(api: Api) -> str:
    """Per delay-topic partition what status says, totals, and the due charts."""
    reply = api.get("/api/status", {})
    if reply.status != 200:
        return page("Overview", "/ui", _failed(reply))
    result: dict[str, Any] = reply.body["result"]
    totals = result["totals"]
    figures = "".join(
        f'<div class="figure" data-figure="{key}"><b>{_e(_count(totals[key]))}</b>'
        f"<span>{label}</span></div>"
        for key, label in (
            ("waiting", "waiting"),
            ("overdue", "overdue"),
            ("in_flight", "in flight"),
            ("references", "references"),
            ("lag", "lag"),
        )
    )
    rows = [
        [
            _e(p["topic"]),
            _e(p["partition"]),
            _count(p["waiting"]),
            _count(p["overdue"]),
            _count(p["in_flight"]),
            _count(p["references"]),
            _count(p["lag"]),
            _e(_when(p["next_due_ms"])),
        ]
        for p in result["partitions"]
    ]
    header = ["topic", "partition", "waiting", "overdue", "in flight", "references", "lag"]
    table = _table([*header, "next due"], rows, {2, 3, 4, 5, 6})
    charts = "".join(_chart(api, span) for span in SPANS)
    body = (
        f'<div class="figures">{figures}</div>'
        f'<section class="card"><h2>Falling due</h2><div class="charts">{charts}</div></section>'
        f'<section class="card"><h2>Partitions</h2>{table}'
        f'<p class="note">Redis time {_e(_when(result["now_ms"]))}</p></section>'
    )
    return page("Overview", "/ui", body)


def _count(figure: int | None) -> str:
    return "-" if figure is None else f"{figure:,}"


def _chart(api: Api, span: str) -> str:
    reply = api.get("/api/due", {"span": [span]})
    if reply.status != 200:
        return _failed(reply)
    due = reply.body["result"]
    return (
        f'<figure data-span="{span}"><figcaption>next {span}: '
        f"{sum(due['counts']):,} due; {due['overdue']:,} overdue now, {due['later']:,} later"
        f"</figcaption>{svg(due)}</figure>"
    )


RECORD_FILTERS = ("topic", "partition", "id", "due_before", "limit")
PAGE = 20  # list's own --limit
BULK_FILTERS = ("target", "key_prefix", "due_after", "due_before", "topic")


def _inputs(names: Sequence[str], query: Mapping[str, str]) -> str:
    return "".join(
        f"<label>{_e(name.replace('_', ' '))}"
        f'<input name="{name}" value="{_e(query.get(name, ""))}"></label>'
        for name in names
    )


def _asked(
    query: Mapping[str, str], shown: Sequence[str], passed: Sequence[str], button: str = "show"
) -> tuple[dict[str, list[str]], str]:
    """A page's filters: the API options ``passed`` on from ``query`` (those given), and the GET
    form of the filters ``shown``, filled in."""
    asked = {k: [v] for k, v in query.items() if k in passed and v}
    form = (
        f'<form class="filters" method="get">{_inputs(shown, query)}'
        f"<button>{button}</button></form>"
    )
    return asked, form


def records(api: Api, query: Mapping[str, str]) -> str:
    """Waiting records in due order with the ``list`` filters; actions on a row and in bulk."""
    asked, form = _asked(query, RECORD_FILTERS, (*RECORD_FILTERS, "skip"))
    reply = api.get("/api/records", asked)
    if reply.status != 200:
        return page("Records", "/ui/records", form + _failed(reply))
    rows = []
    for r in reply.body["result"]:
        origin = f"{r['topic']}:{r['partition']}:{r['offset']}"
        link = "/ui/record?" + urlencode({"origin": origin})
        ids = {"id": r["delay_id"], "topic": r["topic"]}
        actions = _action("/api/cancel", ids, _button("cancel", None, "Cancel this record?"), True)
        actions += _action("/api/fire", ids, _button("fire now"), True)
        rows.append(
            [
                _e(_when(r["due_ms"])),
                f'<a href="{_e(link)}">{_c(r["delay_id"])}</a>',
                _c(r["target"]),
                _e(r["priority"]),
                _c(r["key"]),
                _count(r["value_bytes"]),
                _e(f"{r['topic']}[{r['partition']}]@{r['offset']}"),
                actions,
            ]
        )
    header = ["due", "delay-id", "target", "priority", "key", "bytes", "where", ""]
    listing = _table(header, rows, {5}) if rows else '<p class="note">no waiting records</p>'
    listing += _pages(query, len(rows))
    bulk = "<h2>Act on every waiting record a filter matches</h2>" + _action(
        "/api/cancel",
        {},
        _inputs(BULK_FILTERS, {})
        + _button("count", {"dry_run": True})
        + _button("cancel all", {"yes": True}, "Cancel every record the filter matches?")
        + _button("fire all", {"yes": True}, "Deliver them all now?", "/api/fire")
        + '<label>shift by<input name="shift" data-only="/api/reschedule"></label>'
        + _button("reschedule all", {"yes": True}, "Move them all?", "/api/reschedule"),
    )
    return page("Records", "/ui/records", _body(form, reply, listing, bulk))


def _pages(query: Mapping[str, str], shown: int) -> str:
    """Links to the previous and next page of records (the filters kept)."""
    limit = parse_count(query.get("limit")) or PAGE
    skip = parse_count(query.get("skip")) or 0
    kept = {k: v for k, v in query.items() if v}
    links = []
    if skip > 0:
        link = "?" + urlencode({**kept, "skip": max(0, skip - limit)})
        links.append(f'<a rel="prev" href="{_e(link)}">previous page</a>')
    if shown == limit:
        link = "?" + urlencode({**kept, "skip": skip + limit})
        links.append(f'<a rel="next" href="{_e(link)}">next page</a>')
    return f'<p class="pages">{" · ".join(links)}</p>' if links else ""


def record(api: Api, query: Mapping[str, str], *, reveal: bool = False) -> str:
    """A record's fate and life (``trace``), its headers and the start of its value (the value
    and the headers outside the contract only if ``reveal``: the request carried a token);
    actions while it waits."""
    asked, form = _asked(
        query, ("id", "origin", "since"), ("id", "origin", "topic", "since"), "trace"
    )
    if not asked:
        return page("Record", "", form + '<p class="note">a delay-id, or an origin</p>')
    reply = api.get("/api/trace", asked, reveal=reveal)
    traced = reply.body.get("result")
    if traced is None:
        return page("Record", "", form + _failed(reply))
    fate = traced["fate"]
    events = _table(
        ["at", "event", "due", "where", "detail"],
        [
            [
                _e(_when(ev.get("at"))),
                _e(ev["event"]),
                _e(_when(ev.get("due"))),
                _e(f"{ev['topic']}[{ev['partition']}]@{ev['offset']}" if "topic" in ev else ""),
                _e(
                    ", ".join(
                        f"{k} {ev[k]}" for k in ("late_ms", "by", "reason", "target") if k in ev
                    )
                ),
            ]
            for ev in traced["events"]
        ],
        set(),
    )
    others = "".join(
        f'<li><a href="?origin={_e(u["origin"])}">{_e(u["origin"])}</a> {_e(u["fate"])}</li>'
        for u in traced.get("uses", [])
    )
    body = (
        f"{form}<section class=card><p>delay-id <code>{_e(traced['id'])}</code> · origin "
        f"<code>{_e(traced['origin'])}</code></p>"
        f'<p class="fate fate-{_e(fate)}" data-fate="{_e(fate)}">{_e(fate)}</p>{_notes(reply)}'
        f"{events}</section>"
    )
    if others:
        body += f"<section class=card><h2>Other records that held this id</h2><ul>{others}</ul>"
        body += "</section>"
    if fate == "waiting":
        ids = {"id": traced["id"], "topic": traced["origin"].rsplit(":", 2)[0]}
        body += (
            "<section class=card><h2>Act on it</h2>"
            + _action(
                "/api/cancel",
                ids,
                _button("cancel", None, "Cancel this record?")
                + _button("fire now", None, "", "/api/fire")
                + '<label>new due time<input name="at" data-only="/api/reschedule" '
                'placeholder="2h, or a time"></label>'
                + _button("reschedule", None, "", "/api/reschedule"),
            )
            + "</section>"
        )
    if traced.get("record"):
        rec = traced["record"]
        headers = _table(
            ["header", "value"], [[_c(n), _c(v, 200)] for n, v in rec["headers"]], set()
        )
        cut = " (the first 1 KiB)" if rec["value_bytes"] > len(rec["value"] or "") else ""
        if rec["value"] is None and rec["value_bytes"]:
            cut = " (shown only to a request with the console's token)"
        body += (
            f"<section class=card><h2>As produced</h2><p>key <code>{_e(rec['key'])}</code></p>"
            f"{headers}<h2>Value: {rec['value_bytes']:,} bytes{cut}</h2>"
            f'<pre class="payload">{_e(rec["value"])}</pre></section>'
        )
    return page("Record", "", body)


DLQ_FILTERS = ("reason", "since", "until", "limit")


def schedules(api: Api, query: Mapping[str, str]) -> str:
    """The live recurring schedules, each with its next three occurrences in its zone and in
    UTC; pause, resume and cancel on each row."""
    asked, form = _asked(query, ("topic",), ("topic", "limit"))
    reply = api.get("/api/schedules", asked)
    if reply.status not in (200, 404) or "result" not in reply.body:
        return page("Schedules", "/ui/schedules", form + _failed(reply))
    rows = []
    for r in reply.body["result"]:
        ids = {"id": r["delay_id"], "topic": r["topic"]}
        state = "paused" if r["paused"] else "running"
        actions = _action("/api/schedules/pause", ids, _button("pause"), True)
        actions += _action("/api/schedules/resume", ids, _button("resume"), True)
        actions += _action("/api/cancel", ids, _button("cancel", None, "End this schedule?"), True)
        upcoming = "<br>".join(
            f"{_e(local)} ({_e(_when(at))})"
            for at, local in zip(r["upcoming_ms"], r["upcoming_local"], strict=True)
        )
        how = f"{r['cron']} ({r['zone']})" if r["cron"] else f"every {r['every']}"
        rows.append(
            [
                _c(r["delay_id"]),
                _c(how),
                _c(r["target"]),
                _e(state),
                upcoming,
                _e(f"{r['topic']}[{r['partition']}]@{r['offset']}"),
                actions,
            ]
        )
    header = ["delay-id", "when", "target", "state", "next occurrences", "where", ""]
    listing = _table(header, rows, set()) if rows else '<p class="note">no recurring schedule</p>'
    return page("Schedules", "/ui/schedules", form + _notes(reply) + listing)


def dead_letters(api: Api, query: Mapping[str, str]) -> str:
    """The DLQ: counts by reason, the records with their detail, and a replay."""
    asked, form = _asked(query, DLQ_FILTERS, DLQ_FILTERS)
    reply = api.get("/api/dlq", asked)
    if reply.status != 200:
        return page("Dead letters", "/ui/dlq", form + _failed(reply))
    rows = [
        [
            _e(_when(d["at_ms"])),
            f'<a href="?{_e(urlencode({"reason": d["reason"]}))}">{_e(d["reason"])}</a>',
            _link_origin(d["origin"]),
            _c(d["target"]),
            _c(d["key"]),
            _count(d["value_bytes"]),
            _c(d["detail"], 200),
        ]
        for d in reply.body["result"]
    ]
    header = ["dead-lettered", "reason", "origin", "target", "key", "bytes", "detail"]
    listing = _table(header, rows, {5}) if rows else '<p class="note">no dead letters match</p>'
    replay = "<h2>Replay to the delay topic</h2>" + _action(
        "/api/dlq/replay",
        {},
        _inputs(DLQ_FILTERS, query)
        + '<label>from the beginning<input type="checkbox" name="from_beginning"></label>'
        + _button("count", {"dry_run": True})
        + _button("replay", None, "Send the matching dead letters back to be scheduled again?"),
    )
    return page("Dead letters", "/ui/dlq", _body(form, reply, listing, replay))


def _body(form: str, reply: Reply, *cards: str) -> str:
    return form + _notes(reply) + "".join(f"<section class=card>{c}</section>" for c in cards)


def _link_origin(origin: str) -> str:
    if not origin:
        return ""
    return f'<a href="/ui/record?{_e(urlencode({"origin": origin}))}">{_e(origin)}</a>'
