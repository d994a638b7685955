"""Kubernetes' `Time` and `MicroTime`, written and read by dedup_contract.timefmt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from dedup_contract.timefmt import (
    format_micro_time,
    format_time,
    format_time_exact,
    parse_rfc3339,
    parse_time,
)

T = datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=UTC)
WHOLE = T.replace(microsecond=0)


def test_time_is_whole_seconds_in_utc_with_z() -> None:
    assert format_time(T) == "2026-11-22T10:00:00Z"
    assert format_time(T.astimezone(timezone(timedelta(hours=2)))) == "2026-11-22T10:00:00Z"


def test_micro_time_always_has_six_fraction_digits() -> None:
    assert format_micro_time(T) == "2026-11-22T10:00:00.123456Z"
    assert format_micro_time(WHOLE) == "2026-11-22T10:00:00.000000Z"


def test_an_exact_time_keeps_its_fraction_only_when_it_has_one() -> None:
    """What `isoformat()` gave these fields before, with `Z` for `+00:00`."""
    assert format_time_exact(T) == T.isoformat().replace("+00:00", "Z")
    assert format_time_exact(WHOLE) == WHOLE.isoformat().replace("+00:00", "Z")


def test_either_format_reads_back_as_an_aware_utc_datetime() -> None:
    assert parse_time(format_micro_time(T)) == T
    assert parse_time(format_time(T)) == WHOLE
    assert parse_time("2026-11-22T12:00:00+02:00") == WHOLE.replace(hour=10)
    assert parse_time(None) is None and parse_time("") is None
    naive = datetime(2026, 11, 22, 10, 0)  # as the client's models may hold one
    assert parse_time(naive) == WHOLE


def test_a_time_a_person_gives_must_name_its_zone() -> None:
    assert parse_rfc3339("2026-11-22T10:00:00.123456Z") == T
    with pytest.raises(ValueError, match="has no zone"):
        parse_rfc3339("2026-11-22T10:00:00")
    with pytest.raises(ValueError, match="not an RFC 3339 time: 'yesterday'"):
        parse_rfc3339("yesterday")
