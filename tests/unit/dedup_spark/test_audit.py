"""The reconciliation audit's rules (spark/dedup_spark/audit_rules.py), pure."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dedup_spark.audit_model import AuditRange, DeadLetter, InputRecord, OutputRecord, Retention
from dedup_spark.audit_result import add_totals, passed
from dedup_spark.audit_rules import audit_partition
from support.audit_oracle import reference_audit

W = 1_000  # window, ms
ALL = AuditRange()


def clean(n: int) -> tuple[list[InputRecord], list[OutputRecord]]:
    inputs = [InputRecord(i, 10 * i, f"id-{i}") for i in range(n)]
    outputs = [OutputRecord(i, 10 * i, f"id-{i}") for i in range(n)]
    return inputs, outputs


def test_a_clean_partition_passes_with_zeros() -> None:
    inputs, outputs = clean(50)
    result = audit_partition(0, inputs, outputs, [], audit_range=ALL, window_ms=W)
    totals = result.totals()
    assert result.passed and passed(totals)
    assert totals["input"] == totals["valid"] == totals["distinct"] == totals["published"] == 50
    assert totals["inputDuplicateRate"] == 0.0
    assert all(totals[k] == 0 for k in ("duplicates", "missing", "unexpected", "orderViolations"))


def test_repeats_within_the_window_are_dropped_and_counted_in_the_rate() -> None:
    inputs = [InputRecord(0, 0, "a"), InputRecord(1, 5, "b"), InputRecord(2, 10, "a")]
    outputs = [OutputRecord(0, 0, "a"), OutputRecord(1, 5, "b")]
    totals = audit_partition(0, inputs, outputs, [], audit_range=ALL, window_ms=W).totals()
    assert passed(totals)
    assert (totals["valid"], totals["distinct"]) == (3, 2)
    assert totals["inputDuplicateRate"] == pytest.approx(1 / 3, abs=1e-6)


def test_planted_duplicates_missing_unexpected_and_reordering_are_each_counted() -> None:
    inputs, outputs = clean(20)
    outputs = [o for o in outputs if o.id not in ("id-3", "id-4")]  # 2 missing
    outputs.append(OutputRecord(100, 10 * 7, "id-7"))  # duplicate
    outputs.append(OutputRecord(101, 10 * 8, "id-8"))  # duplicate
    outputs.append(OutputRecord(102, 500, "ghost"))  # unexpected
    # reorder: swap the outputs of id-10 and id-11 (id-10 now after id-11: one violation)
    i10 = next(i for i, o in enumerate(outputs) if o.id == "id-10")
    outputs[i10], outputs[i10 + 1] = outputs[i10 + 1], outputs[i10]
    outputs = [OutputRecord(i, o.timestamp_ms, o.id) for i, o in enumerate(outputs)]
    result = audit_partition(3, inputs, outputs, [], audit_range=ALL, window_ms=W)
    totals = result.totals()
    assert (totals["duplicates"], totals["missing"], totals["unexpected"]) == (2, 2, 1)
    assert totals["orderViolations"] == 1
    assert not result.passed
    assert {f.id for f in result.findings if f.kind == "missing"} == {"id-3", "id-4"}


def test_repeats_beyond_the_window_must_be_published_again() -> None:
    inputs = [InputRecord(0, 0, "a"), InputRecord(1, 3 * W, "a")]
    both = [OutputRecord(0, 0, "a"), OutputRecord(1, 3 * W, "a")]
    ok = audit_partition(0, inputs, both, [], audit_range=ALL, window_ms=W, slack_ms=W // 4)
    assert ok.passed
    first_only = audit_partition(
        0, inputs, both[:1], [], audit_range=ALL, window_ms=W, slack_ms=W // 4
    )
    assert first_only.totals()["missing"] == 1


def test_a_repeat_within_the_slack_may_be_dropped() -> None:
    inputs = [InputRecord(0, 0, "a"), InputRecord(1, W + W // 8, "a")]
    outputs = [OutputRecord(0, 0, "a")]
    assert audit_partition(
        0, inputs, outputs, [], audit_range=ALL, window_ms=W, slack_ms=W // 4
    ).passed


def test_dead_letters_are_counted_by_reason_and_required() -> None:
    inputs = [
        InputRecord(0, 0, None, "not_json"),
        InputRecord(1, 1, "a"),
        InputRecord(2, 2, None, "missing_id"),
    ]
    outputs = [OutputRecord(0, 1, "a")]
    dead = [DeadLetter(0, 0, "not_json")]
    result = audit_partition(0, inputs, outputs, dead, audit_range=ALL, window_ms=W)
    totals = result.totals()
    assert totals["deadLettered"] == 1 and dict(result.dead_lettered_by_reason) == {"not_json": 1}
    assert totals["missingDeadLetters"] == 1  # offset 2 has none
    assert (totals["input"], totals["valid"]) == (3, 1)


def test_only_committed_input_is_checked() -> None:
    inputs, outputs = clean(10)
    result = audit_partition(
        0, inputs, outputs[:6], [], audit_range=ALL, window_ms=W, committed_offset=6
    )
    assert result.passed
    assert (result.input, result.pending) == (6, 4)


def test_a_time_range_checks_its_records_and_looks_a_window_back_for_publications() -> None:
    inputs = [InputRecord(0, 0, "a"), InputRecord(1, 500, "b"), InputRecord(2, 1200, "a")]
    outputs = [OutputRecord(0, 0, "a"), OutputRecord(1, 500, "b")]
    result = audit_partition(
        0, inputs, outputs, [], audit_range=AuditRange(400, 2000), window_ms=W, slack_ms=300
    )
    assert result.passed  # "a" at 1200 is covered by its publication at 0 (window + slack)
    assert (result.input, result.published) == (2, 1)


def test_an_offset_range() -> None:
    inputs, outputs = clean(10)
    result = audit_partition(
        2, inputs, outputs[:5], [], audit_range=AuditRange(offsets={2: (0, 5)}), window_ms=W
    )
    assert result.passed and result.input == 5 and result.published == 5


def test_totals_add_up_across_partitions() -> None:
    a = {"input": 10, "valid": 8, "distinct": 4, "duplicates": 1}
    b = {"input": 5, "valid": 2, "distinct": 2}
    totals = add_totals([a, b])
    assert (totals["input"], totals["valid"], totals["distinct"]) == (15, 10, 6)
    assert totals["inputDuplicateRate"] == pytest.approx(0.4)
    assert not passed(totals)


def test_a_range_is_times_or_offsets() -> None:
    with pytest.raises(ValueError, match="not both"):
        AuditRange(from_ms=0, offsets={0: (0, 1)})
    with pytest.raises(ValueError, match="before its end"):
        AuditRange(5, 5)


@pytest.mark.parametrize("seed", range(40))
def test_the_vectorised_audit_agrees_with_the_loop_over_records(seed: int) -> None:
    """Random partitions with every kind of defect, ranges and committed offsets: the
    same counts and findings as the rules written as a loop (support/audit_oracle.py)."""
    rng = random.Random(seed)
    ids = [f"id-{n}" for n in range(rng.randint(1, 30))]
    inputs = [
        InputRecord(o, rng.randrange(0, 5 * W, 50), None if rng.random() < 0.1 else rng.choice(ids))
        for o in range(rng.randint(0, 120))
    ]
    inputs = [
        (r if r.id else r._replace(reason="id_null"))._replace(digest=rng.randrange(3))
        for r in inputs
    ]
    outputs = [
        OutputRecord(
            o,
            rec.timestamp_ms if rng.random() < 0.9 else rng.randrange(0, 5 * W),
            None if rng.random() < 0.03 else rec.id if rng.random() < 0.95 else "stray",
            rec.digest if rng.random() < 0.9 else rng.choice([None, 7]),
        )
        for o, rec in enumerate(
            rng.sample([r for r in inputs if r.id], k=min(60, len(inputs) // 2))
        )
        if rng.random() < 0.9
    ]
    dead = [
        DeadLetter(None if rng.random() < 0.1 else r.offset, r.timestamp_ms, r.reason)
        for r in inputs
        if r.id is None and rng.random() < 0.7
    ]
    ranges = [
        ALL,
        AuditRange(from_ms=W, to_ms=3 * W),
        AuditRange(offsets={seed % 3: (10, 80)}),
        AuditRange(offsets={}),
    ]
    retentions = [
        None,
        Retention(input_start=15, input_first_ms=rng.randrange(0, 5 * W)),
        Retention(output_start=5, output_first_ms=rng.choice([None, rng.randrange(0, 5 * W)])),
    ]
    for audit_range in ranges:
        for committed in (None, 0, 70):
            for retention in retentions:
                kwargs: dict[str, Any] = {
                    "audit_range": audit_range,
                    "window_ms": W,
                    "slack_ms": W // 4,
                    "committed_offset": committed,
                    "retention": retention,
                }
                want = reference_audit(seed % 3, inputs, outputs, dead, **kwargs)
                got = audit_partition(seed % 3, inputs, outputs, dead, **kwargs)
                assert got.totals() == want.totals()
                assert got.dead_lettered_by_reason == want.dead_lettered_by_reason
                assert sorted(got.findings, key=repr) == sorted(want.findings, key=repr)


def test_a_partition_without_a_single_valid_id() -> None:
    inputs = [InputRecord(0, 0, None, "not_json"), InputRecord(1, 5, None, "id_null")]
    result = audit_partition(
        0,
        inputs,
        [OutputRecord(0, 0, None)],
        [DeadLetter(0, 0, "not_json")],
        audit_range=ALL,
        window_ms=W,
    )
    assert [(f.kind, f.offset) for f in result.findings] == [
        ("unexpected", 0),
        ("missing_dead_letter", 1),
    ]
    assert (result.input, result.valid, result.distinct, result.dead_lettered) == (2, 0, 0, 1)


@pytest.mark.parametrize("check", [audit_partition, reference_audit])
def test_a_lost_occurrence_is_missing_though_a_repeat_after_the_window_is_published(
    check: Any,
) -> None:
    """`a` at 0 never reached the output; its repeat at 3 W rightly did. The repeat's
    publication is later than the lost occurrence, so it accounts for nothing before it
    (the rule before issue 18 counted any publication at or after ts - window)."""
    inputs = [InputRecord(0, 0, "a"), InputRecord(1, 10, "b"), InputRecord(2, 3 * W, "a")]
    outputs = [OutputRecord(0, 10, "b"), OutputRecord(1, 3 * W, "a")]
    result = check(0, inputs, outputs, [], audit_range=ALL, window_ms=W, slack_ms=W // 4)
    assert [(f.kind, f.id, f.offset) for f in result.findings] == [("missing", "a", 0)]
    assert not passed(result.totals())


def test_a_dropped_repeat_is_accounted_for_only_by_an_earlier_publication() -> None:
    # `a` published at 0; repeats at W/2 (inside) and at W + W/8 (inside the slack) may
    # be dropped; at 3 W it must be published; a repeat of the lost one at 3 W + 10 is
    # not accounted for either (nothing published within the window before it).
    inputs = [
        InputRecord(0, 0, "a"),
        InputRecord(1, W // 2, "a"),
        InputRecord(2, W + W // 8, "a"),
        InputRecord(3, 3 * W, "a"),
        InputRecord(4, 3 * W + 10, "a"),
    ]
    result = audit_partition(
        0, inputs, [OutputRecord(0, 0, "a")], [], audit_range=ALL, window_ms=W, slack_ms=W // 4
    )
    assert [(f.kind, f.offset) for f in result.findings] == [("missing", 3), ("missing", 4)]


@pytest.mark.parametrize("check", [audit_partition, reference_audit])
def test_a_published_record_whose_contents_changed_is_reported(check: Any) -> None:
    inputs = [InputRecord(0, 0, "a", digest=11), InputRecord(1, 5, "b", digest=22)]
    outputs = [OutputRecord(0, 0, "a", digest=11), OutputRecord(1, 5, "b", digest=23)]
    result = check(0, inputs, outputs, [], audit_range=ALL, window_ms=W)
    assert [(f.kind, f.id, f.offset) for f in result.findings] == [("content_mismatch", "b", 1)]
    assert result.totals()["contentMismatches"] == 1 and not passed(result.totals())


@pytest.mark.parametrize("check", [audit_partition, reference_audit])
def test_input_past_retention_is_reported_as_unverifiable(check: Any) -> None:
    """Offsets 0-3 of the range 0-10 were deleted before the audit read them: 4 offsets
    it could not verify, named, and the audit fails unless told to only warn."""
    inputs, outputs = clean(10)
    result = check(
        0,
        inputs[4:],
        outputs[4:],
        [],
        audit_range=AuditRange(offsets={0: (0, 10)}),
        window_ms=W,
        retention=Retention(input_start=4, input_first_ms=40),
    )
    totals = result.totals()
    assert totals["unverifiable"] == 4 and totals["missing"] == 0
    assert [(f.kind, f.offset, f.detail) for f in result.findings] == [
        ("unverifiable", 0, "input offsets 0-3 deleted by retention")
    ]
    assert not passed(totals)
    assert passed(totals, fail_on_unverifiable=False)


def test_a_time_range_older_than_the_retained_input_is_unverifiable() -> None:
    inputs, outputs = clean(10)
    kept = Retention(input_start=4, input_first_ms=40)
    late = audit_partition(
        0, inputs[4:], outputs, [], audit_range=AuditRange(50, 90), window_ms=W, retention=kept
    )
    assert late.passed  # the retained input reaches back before the range
    early = audit_partition(
        0, inputs[4:], outputs[4:], [], audit_range=AuditRange(0, 90), window_ms=W, retention=kept
    )
    assert early.unverifiable == 4  # an upper bound: the deleted offsets' times are gone
    assert "starts before the oldest retained record" in early.findings[0].detail


def test_an_unpublished_occurrence_whose_publication_may_be_deleted_is_unverifiable() -> None:
    """The output kept only what was published from 500 on: an occurrence at 300 that
    has no publication cannot be called missing, but it is not verified either."""
    inputs, outputs = clean(100)
    result = audit_partition(
        0,
        inputs,
        [o for o in outputs if o.timestamp_ms >= 500],
        [],
        audit_range=AuditRange(offsets={0: (30, 100)}),
        window_ms=W,
        retention=Retention(output_start=50, output_first_ms=500),
    )
    totals = result.totals()
    assert (totals["missing"], totals["unverifiable"]) == (0, 20)
    assert {f.kind for f in result.findings} == {"unverifiable"}
