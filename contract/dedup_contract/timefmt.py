"""Kubernetes' two time formats, written and read in one place.

`Time` (metav1.Time: creationTimestamp, lastTransitionTime, an Event's firstTimestamp
and lastTimestamp, the times our status records): RFC 3339 in UTC to the second,
`2026-11-22T10:00:00Z`; the API server keeps no fraction of a second in one.
`MicroTime` (metav1.MicroTime: a Lease's renewTime and acquireTime, an Event's
eventTime): always six fraction digits, `2026-11-22T10:00:00.123456Z` (Python's
isoformat() drops them when the microseconds are 0, and writes `+00:00`).
`format_time_exact` is for a time a status carries as it was measured (an audit's end,
a handover's start): the fraction only when there is one.

Reading: `parse_time` takes either format (or a datetime, as the client's models hold
them) and gives an aware UTC datetime; `parse_rfc3339` is the strict reading of a time a
person typed, which must name its zone.
"""

from __future__ import annotations

from datetime import UTC, datetime


def format_time(t: datetime) -> str:
    """`Time`: RFC 3339 in UTC, whole seconds, `Z`."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(t: datetime) -> str:
    """`MicroTime`: RFC 3339 in UTC with six fraction digits, `Z`."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_time_exact(t: datetime) -> str:
    """RFC 3339 in UTC, `Z`, with six fraction digits only when the time has a fraction."""
    return format_micro_time(t) if t.microsecond else format_time(t)


def parse_time(value: object) -> datetime | None:
    """`Time` or `MicroTime` text (any RFC 3339) or a datetime, as an aware UTC datetime;
    None for None or empty text. A datetime without a zone is taken as UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)


def parse_rfc3339(text: str) -> datetime:
    """A time a person gave (a command-line flag): RFC 3339 with its zone, as an aware
    UTC datetime. ValueError, naming the text, for anything else."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"time {text!r} has no zone (add Z)")
    return moment.astimezone(UTC)
