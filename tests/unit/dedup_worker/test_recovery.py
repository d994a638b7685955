"""When start-up may skip reading the output partition (pure rule)."""

from __future__ import annotations

from dedup_worker.recovery import nothing_to_read


def test_empty_partition_needs_no_read() -> None:
    assert nothing_to_read(first=0, end=0)


def test_only_the_marker_of_the_last_applied_transaction_needs_no_read() -> None:
    # last applied record at 41, its commit marker at 42: the store's applied offset is 42
    assert nothing_to_read(first=42, end=43)


def test_a_later_transaction_is_read() -> None:
    # one more committed record (43) and its marker (44) after the applied one's marker
    assert not nothing_to_read(first=42, end=45)
    # a record at 43 written outside a transaction (by something other than the worker)
    assert not nothing_to_read(first=42, end=44)


def test_a_rebuild_from_the_start_reads_whatever_is_there() -> None:
    assert not nothing_to_read(first=0, end=2)
