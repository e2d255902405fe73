"""A delay-topic record read against the contract's rules: scheduled, cancelled or rejected.

Everything here is pure: no I/O, no clock. Callers pass the record's fields and ``now_ms``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bridge.message.headers import (
    CONTROL_HEADERS,
    H_AFTER,
    H_CANCEL,
    H_CONTINUES,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ENDED,
    H_ID,
    H_MAX_LATENESS,
    H_PAUSE,
    H_PRIORITY,
    H_PRODUCED,
    H_RESUME,
    H_TARGET_TOPIC,
    MAX_ID_BYTES,
    SCHEDULING,
    Cancel,
    Headers,
    Priority,
    Reason,
    Rejected,
    Scheduled,
    origin,
    record_size,
)
from bridge.message.recurrence import BadSchedule, Recurrence, recurrence_of
from bridge.message.values import (
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    format_duration_ms,
    format_time_ms,
    parse_count,
    parse_duration_ms,
    parse_time_ms,
    topic_refusal,
)

_REFUSALS_KEPT = 10_000


@dataclass(frozen=True)
class Rules:
    """What the contract lets through, from the config."""

    delay_topics: frozenset[str]
    default_targets: dict[str, str]
    allowed_targets: tuple[re.Pattern[str], ...]
    dead_letter: str
    max_delay_ms: int
    max_record_bytes: int
    dialects: dict[str, str] = field(default_factory=dict)  # delay topic -> header set
    # Answers of target_refusal by target: a handful of targets take every record.
    _refusals: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    def target_refusal(self, target: str) -> str | None:
        """Why ``target`` may not receive records, or None when it may."""
        if target in self._refusals:
            return self._refusals[target]
        if len(self._refusals) >= _REFUSALS_KEPT:
            self._refusals.clear()
        answer = self._refusal(target)
        self._refusals[target] = answer
        return answer

    def _refusal(self, target: str) -> str | None:
        always = topic_refusal(target)
        if always is not None:
            return always
        if target in self.delay_topics:
            return f"{target!r} is a delay topic"
        if target == self.dead_letter:
            return f"{target!r} is the dead-letter topic"
        if not any(p.fullmatch(target) for p in self.allowed_targets):
            return f"{target!r} matches no pattern in topics.allowed_targets"
        return None


def _control(headers: Headers) -> tuple[dict[str, bytes], list[bytes]]:
    """The control headers by name, and every ``delay-cancel`` (the one header a record may
    carry more than once: it cancels each id it names)."""
    found: dict[str, bytes] = {}
    cancels: list[bytes] = []
    for name, value in headers:
        if name in CONTROL_HEADERS:
            if name == H_CANCEL:
                cancels.append(value or b"")
                if name in found:
                    continue
            elif name in found:
                raise Rejected(Reason.BAD_HEADER, f"header {name} appears more than once")
            found[name] = value or b""
    return found, cancels


# The control headers read as text, in the order their encoding is checked.
_TEXT_HEADERS = (H_TARGET_TOPIC, H_DELIVER_AT, H_AFTER, H_ID, H_CANCEL, H_PRIORITY, H_MAX_LATENESS)


def _texts(control: dict[str, bytes]) -> dict[str, str]:
    """The control headers read as text, by name; :class:`Rejected` naming the first of
    _TEXT_HEADERS that is not UTF-8. One loop, not a call per header (per record read)."""
    texts: dict[str, str] = {}
    for name in _TEXT_HEADERS:
        raw = control.get(name)
        if raw is not None:
            try:
                texts[name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise Rejected(Reason.BAD_HEADER, f"header {name} is not valid UTF-8") from None
    return texts


def _cancel(offset: int, base_ms: int, ids: list[bytes], hints: list[bytes | None]) -> Cancel:
    """The cancel of a record with the ``delay-cancel`` headers ``ids`` and the ``delay-due-at``
    ``hints`` (none, or one per id in the same order)."""
    if hints and len(hints) != len(ids):
        raise Rejected(
            Reason.BAD_HEADER,
            f"a {H_CANCEL} record carries one {H_DUE_AT} per {H_CANCEL} or none: "
            f"{len(hints)} for {len(ids)}",
        )
    named: list[tuple[str, int | None]] = []
    for i, raw in enumerate(ids):
        if not 1 <= len(raw) <= MAX_ID_BYTES:
            raise Rejected(
                Reason.BAD_HEADER, f"header {H_CANCEL} must be 1 to {MAX_ID_BYTES} bytes"
            )
        try:
            delay_id = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejected(Reason.BAD_HEADER, f"header {H_CANCEL} is not valid UTF-8") from None
        if not hints:
            named.append((delay_id, None))
            continue
        hint = parse_count(hints[i])
        if hint is None:
            text = (hints[i] or b"").decode("ascii", errors="replace").strip()
            raise Rejected(
                Reason.BAD_HEADER,
                f"a {H_CANCEL} record's {H_DUE_AT} is the due time of the record it cancels, "
                f"in epoch milliseconds: not {text[:40]!r}",
            )
        named.append((delay_id, hint))
    (first, due), *more = named
    return Cancel(offset, first, base_ms, due, tuple(more))


def _schedule(control: dict[str, bytes], base_ms: int) -> tuple[Recurrence, int | None]:
    """A recurring schedule and the offset of the record it carries on from (its
    ``delay-continues``; None: a producer wrote it), or :class:`Rejected` as bad-schedule naming
    what is wrong."""
    schedule = _recurrence(control, base_ms)
    continues = None
    if H_CONTINUES in control:
        text = control[H_CONTINUES].decode("ascii", "replace")
        continues = parse_count(text.strip())
        if continues is None:
            raise Rejected(Reason.BAD_SCHEDULE, f"{H_CONTINUES}: an offset, not {text[:40]!r}")
    return schedule, continues


def _recurrence(control: dict[str, bytes], base_ms: int) -> Recurrence:
    """The schedule the control headers describe (its start from ``base_ms`` when they give
    none), or :class:`Rejected` as bad-schedule."""
    texts: dict[str, str] = {}
    for name, raw in control.items():
        try:
            texts[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejected(Reason.BAD_SCHEDULE, f"header {name} is not valid UTF-8") from None
    try:
        lateness = texts.get(H_MAX_LATENESS)
        return recurrence_of(texts, base_ms, None if lateness is None else _duration(lateness))
    except BadSchedule as exc:
        raise Rejected(Reason.BAD_SCHEDULE, str(exc)) from None


def recurrence_at(record: Scheduled) -> Recurrence:
    """The schedule a stored recurring record describes. Its start is in its headers: a
    producer's ``delay-after`` (or none) was made a ``delay-deliver-at`` when it was read
    (:func:`parse`), so its own timestamp is not needed. Raises :class:`Rejected` (bad-schedule)
    for a record that was not read as a recurring schedule."""
    return _recurrence(_control(record.headers)[0], 0)


# What the record carrying a schedule on may add to the schedule's own (bridge.egress.recurring):
# an absolute start, its count, the offset it continues and when it was produced (names and
# values at their longest), and that it is paused.
CARRIED_BYTES = 3 * (16 + 19) + (17 + 19) + 12 + 1


def _carried_within(size: int, rules: Rules, headers: Headers) -> bool:
    """Whether a record over the size limit is one the bridge wrote to carry a schedule on (its
    ``delay-continues``) within what that adds: the schedule was held to the limit when it came."""
    return size <= rules.max_record_bytes + CARRIED_BYTES and any(
        name == H_CONTINUES for name, _ in headers
    )


def _carried(
    schedule: Recurrence, control: dict[str, bytes], headers: Headers, base_ms: int, rules: Rules
) -> tuple[int, Headers]:
    """A recurring record's due time and the headers it is stored with.

    It falls due at its next occurrence, or sooner: no record of a schedule waits longer than
    half of ``limits.max_delay``, which the delay topic's retention covers (bridge.topics), so
    a schedule whose occurrences are further apart (a yearly one under the default, a monthly one
    under 30 days) is carried on between them with nothing delivered (bridge.egress.recurring).
    The start of a producer's record is written into its headers as ``delay-deliver-at``, so the
    egress reads the same schedule from the stored record (:func:`recurrence_at`)."""
    first = schedule.first()
    assert first is not None  # recurrence_of refuses a schedule with none
    if H_CONTINUES not in control:  # a producer's: stamped as produced (H_PRODUCED)
        headers = [(k, v) for k, v in headers if k not in (H_AFTER, H_PRODUCED)]
        if H_DELIVER_AT not in control:
            headers.append((H_DELIVER_AT, str(schedule.start_ms).encode()))
        headers.append((H_PRODUCED, str(base_ms).encode()))
    return min(first, base_ms + rules.max_delay_ms // 2), headers


def _duration(text: str) -> int | None:
    """A duration header's ms (None: not one; its own checks say so elsewhere)."""
    try:
        return parse_duration_ms(text)
    except ValueError:
        return None


def parse(
    rules: Rules,
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    now_ms: int,
) -> Scheduled | Cancel:
    """Turn a delay-topic record into a :class:`Scheduled` (or a :class:`Cancel`), or raise
    :class:`Rejected`.

    ``timestamp_ms`` is the record's own timestamp (relative delays count from it, so a record
    read twice gets the same due time); when the record has none, ``now_ms`` stands in.
    """
    size = record_size(key, value, headers)
    if size > rules.max_record_bytes and not _carried_within(size, rules, headers):
        raise Rejected(
            Reason.TOO_LARGE,
            f"record is {size} bytes, limits.max_record_bytes is {rules.max_record_bytes}",
        )
    control, cancels = _control(headers)
    base_ms = timestamp_ms if timestamp_ms is not None and timestamp_ms >= 0 else now_ms
    recurring = not SCHEDULING.isdisjoint(control)
    texts = _texts(control)
    target = texts.get(H_TARGET_TOPIC)
    deliver_at = texts.get(H_DELIVER_AT)
    after = texts.get(H_AFTER)
    delay_id = texts.get(H_ID)
    cancel = texts.get(H_CANCEL)
    priority_text = texts.get(H_PRIORITY)
    max_lateness = texts.get(H_MAX_LATENESS)

    # (the ids a cancel names are checked by _cancel)
    if delay_id is not None and not 1 <= len(control[H_ID]) <= MAX_ID_BYTES:
        raise Rejected(Reason.BAD_HEADER, f"header {H_ID} must be 1 to {MAX_ID_BYTES} bytes")
    if cancel is not None:
        if recurring:
            named = ", ".join(h for h in sorted(SCHEDULING) if h in control)
            raise Rejected(
                Reason.BAD_SCHEDULE,
                f"a {H_CANCEL} record ends a schedule and starts none: it must not carry {named}",
            )
        extra = [h for h in (H_DELIVER_AT, H_AFTER, H_TARGET_TOPIC) if h in control]
        if extra:
            raise Rejected(
                Reason.BAD_HEADER,
                f"a {H_CANCEL} record schedules nothing: it must not carry {' or '.join(extra)}",
            )
        return _cancel(offset, base_ms, cancels, [v for k, v in headers if k == H_DUE_AT])
    if H_PAUSE in control or H_RESUME in control:
        return _hold(offset, base_ms, control)
    if H_ENDED in control:
        return _ended(offset, base_ms, control)
    continues = None
    if recurring:  # its due-time headers say when its occurrences start
        schedule, continues = _schedule(control, base_ms)
        if continues is None and schedule.start_ms - now_ms > rules.max_delay_ms:
            raise Rejected(
                Reason.DELAY_TOO_LONG,
                f"the schedule starts {format_time_ms(schedule.start_ms)}, further out than "
                f"limits.max_delay ({format_duration_ms(rules.max_delay_ms)})",
            )
        due_ms, headers = _carried(schedule, control, headers, base_ms, rules)
    else:
        due_ms = _due_ms(deliver_at, after, base_ms)
    if due_ms - now_ms > rules.max_delay_ms:
        raise Rejected(
            Reason.DELAY_TOO_LONG,
            f"due {format_time_ms(due_ms)} is further out than limits.max_delay "
            f"({format_duration_ms(rules.max_delay_ms)})",
        )
    if not MIN_EPOCH_MS <= due_ms <= MAX_EPOCH_MS:  # delay-after from a record's own timestamp
        raise Rejected(
            Reason.BAD_DUE_TIME,
            f"due {format_time_ms(due_ms)} ({H_AFTER} from the record's timestamp {base_ms}) "
            "is outside 2000-01-01 to 9999-12-31",
        )

    priority = Priority.NORMAL
    if priority_text is not None:
        try:
            priority = Priority.of(priority_text)
        except ValueError as exc:
            raise Rejected(Reason.BAD_HEADER, str(exc)) from None

    if max_lateness is not None:
        try:
            parse_duration_ms(max_lateness)
        except ValueError as exc:
            raise Rejected(Reason.BAD_HEADER, f"header {H_MAX_LATENESS}: {exc}") from None

    if not target:
        target = rules.default_targets.get(topic)
        if not target:
            raise Rejected(
                Reason.MISSING_TARGET,
                f"no {H_TARGET_TOPIC} header and no default target for {topic}",
            )
    refusal = rules.target_refusal(target)
    if refusal is not None:
        raise Rejected(Reason.TARGET_NOT_ALLOWED, refusal)

    # Per record read: its fields in order (by keyword, the call costs twice as much).
    return Scheduled(
        offset,
        due_ms,
        target,
        key,
        value,
        headers,
        delay_id if delay_id is not None else origin(topic, partition, offset),
        now_ms if due_ms < now_ms else None,  # stored_ms
        (topic, partition) if delay_id is None else None,  # default_of
        priority,
        base_ms,  # timestamp_ms
        recurring,
        continues,
    )


def _hold(offset: int, base_ms: int, control: dict[str, bytes]) -> Cancel:
    """A record that pauses (``delay-pause: <id>``) or resumes (``delay-resume``) a recurring
    schedule: nothing else may it carry."""
    pause = H_PAUSE in control
    name = H_PAUSE if pause else H_RESUME
    extra = sorted(h for h in control if h != name)
    if extra:
        raise Rejected(
            Reason.BAD_SCHEDULE,
            f"a {name} record changes a schedule and starts none: it must not carry "
            f"{', '.join(extra)}",
        )
    raw = control[name]
    try:
        delay_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected(Reason.BAD_SCHEDULE, f"header {name} is not valid UTF-8") from None
    if not 1 <= len(raw) <= MAX_ID_BYTES:
        raise Rejected(Reason.BAD_SCHEDULE, f"header {name} must be 1 to {MAX_ID_BYTES} bytes")
    return Cancel(offset, delay_id, base_ms, hold=pause)


def _ended(offset: int, base_ms: int, control: dict[str, bytes]) -> Cancel:
    """The record the bridge writes with a schedule's last occurrence: ``delay-id``,
    ``delay-continues`` (the record it ends at) and ``delay-ended``, nothing else."""
    ends = parse_count((control.get(H_CONTINUES) or b"").decode("ascii", "replace").strip())
    extra = sorted(h for h in control if h not in (H_ENDED, H_CONTINUES, H_ID))
    raw = control.get(H_ID, b"")
    if ends is None or extra or not 1 <= len(raw) <= MAX_ID_BYTES:
        raise Rejected(
            Reason.BAD_SCHEDULE,
            f"a {H_ENDED} record names a schedule ({H_ID}) and the record it ends at "
            f"({H_CONTINUES}), and nothing else",
        )
    try:
        delay_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected(Reason.BAD_SCHEDULE, f"header {H_ID} is not valid UTF-8") from None
    return Cancel(offset, delay_id, base_ms, ends=ends)


def _due_ms(deliver_at: str | None, after: str | None, base_ms: int) -> int:
    """A one-shot record's due time, from ``delay-deliver-at`` or ``delay-after`` (counted from
    ``base_ms``)."""
    if deliver_at is None and after is None:
        raise Rejected(Reason.MISSING_DUE_TIME, f"neither {H_DELIVER_AT} nor {H_AFTER} is set")
    if deliver_at is not None and after is not None:
        raise Rejected(Reason.CONFLICTING_DUE_TIME, f"both {H_DELIVER_AT} and {H_AFTER} are set")
    try:
        if deliver_at is not None:
            return parse_time_ms(deliver_at)
        return base_ms + parse_duration_ms(after or "")
    except ValueError as exc:
        raise Rejected(Reason.BAD_DUE_TIME, str(exc)) from None
