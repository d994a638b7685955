"""The audit under ownership (issue 26): ids grouped across partitions, its own hash."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from dedup_contract.ownership import murmur2_reference
from dedup_spark.audit_model import (
    AuditRange,
    DeadLetter,
    Forwarded,
    InputRecord,
    OutputRecord,
    Retention,
)
from dedup_spark.audit_result import passed
from dedup_spark.audit_rules import audit_records
from dedup_spark.murmur2 import murmur2, owners
from support.audit_oracle import reference_records

W = 1_000  # window, ms
ALL = AuditRange()
WORKERS = 3


def owner(mid: str) -> int:
    return int(owners(pa.array([mid]), WORKERS)[0])


def test_murmur2_on_kafkas_vectors() -> None:
    assert murmur2(pa.array(["21", "foobar"])).tolist() == [-973932308, -790332482]


def test_murmur2_agrees_with_a_plain_loop_on_random_bytes() -> None:
    rng = random.Random(7)
    data = [bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(2000)]
    got = murmur2(pa.array(data, pa.binary()).slice(3)).tolist()
    assert got == [murmur2_reference(d) for d in data[3:]]
    text = ["", "é", "ünïcode-id", None]
    assert murmur2(pa.array(text)).tolist() == [murmur2_reference((t or "").encode()) for t in text]


def spread(n: int, partitions: int = 4) -> tuple[list[InputRecord], list[OutputRecord]]:
    """n ids, each on input partition i % partitions, published once to its owner."""
    inputs = [
        InputRecord(i // partitions, 10 * i, f"id-{i}", partition=i % partitions) for i in range(n)
    ]
    offsets = [0] * WORKERS
    outputs = []
    for rec in inputs:
        assert rec.id is not None
        w = owner(rec.id)
        outputs.append(OutputRecord(offsets[w], rec.timestamp_ms, rec.id, partition=w))
        offsets[w] += 1
    return inputs, outputs


def run(*args: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("workers", WORKERS)
    kwargs.setdefault("audit_range", ALL)
    kwargs.setdefault("window_ms", W)
    kwargs.setdefault("slack_ms", W // 4)
    got = audit_records(*args, **kwargs)
    want = reference_records(*args, **kwargs)
    assert got.totals() == want.totals()
    assert sorted(got.findings, key=repr) == sorted(want.findings, key=repr)
    return got


def test_ids_on_every_partition_published_by_their_owners_pass() -> None:
    inputs, outputs = spread(60)
    result = run(inputs, outputs, [])
    totals = result.totals()
    assert passed(totals) and totals["published"] == 60 and totals["distinct"] == 60


def test_repeats_across_partitions_within_the_window_may_be_dropped() -> None:
    """Each id also arrives on another input partition, earlier or later in time than
    the published copy: the owner publishes whichever it meets first."""
    inputs, outputs = spread(40)
    repeats = [
        InputRecord(
            100 + i,
            r.timestamp_ms + (300 if i % 2 else -300),
            r.id,
            partition=(r.partition + 1) % 4,
        )
        for i, r in enumerate(inputs)
    ]
    result = run(inputs + repeats, outputs, [])
    totals = result.totals()
    assert passed(totals), result.findings
    assert (totals["valid"], totals["distinct"]) == (80, 40)
    # per partition, the counts still add up
    assert sum(result.partition_totals(p)["valid"] for p in range(4)) == 80


def test_a_cross_partition_duplicate_fails() -> None:
    inputs, outputs = spread(20)
    copy = inputs[5]._replace(partition=2, offset=99, timestamp_ms=inputs[5].timestamp_ms + 100)
    assert copy.id is not None
    dup = OutputRecord(50, copy.timestamp_ms, copy.id, partition=owner(copy.id))
    result = run([*inputs, copy], [*outputs, dup], [])
    assert [(f.kind, f.id, f.partition, f.offset) for f in result.findings] == [
        ("duplicate", "id-5", owner("id-5"), 50)
    ]
    assert not passed(result.totals())


def test_a_duplicate_on_two_output_partitions_is_both_duplicate_and_misplaced() -> None:
    inputs, outputs = spread(20)
    first = outputs[7]
    wrong = (first.partition + 1) % WORKERS
    result = run(
        inputs, [*outputs, OutputRecord(90, first.timestamp_ms, first.id, partition=wrong)], []
    )
    totals = result.totals()
    assert (totals["duplicates"], totals["misplaced"]) == (1, 1)


def test_a_misplaced_publication_fails() -> None:
    inputs, outputs = spread(20)
    moved = outputs[3]._replace(partition=(outputs[3].partition + 1) % WORKERS, offset=77)
    result = run(inputs, [*outputs[:3], *outputs[4:], moved], [])
    # (published at the end of the wrong partition, it is also out of its input order)
    assert ("misplaced", moved.id, moved.partition) in [
        (f.kind, f.id, f.partition) for f in result.findings
    ]
    assert result.totals()["misplaced"] == 1 and not passed(result.totals())


def test_forwarded_input_its_owner_has_not_consumed_is_pending_not_missing() -> None:
    inputs, outputs = spread(20)
    waiting = [r for r in inputs if r.id is not None and owner(r.id) != r.partition][:3]
    kept = [o for o in outputs if o.id not in {r.id for r in waiting}]
    forwarded = [Forwarded(r.id, r.partition, r.offset) for r in waiting]
    result = run(inputs, kept, [], forwarded)
    totals = result.totals()
    assert passed(totals), result.findings
    assert (totals["pending"], totals["input"]) == (3, 17)
    without = audit_records(inputs, kept, [], workers=WORKERS, audit_range=ALL, window_ms=W)
    assert without.totals()["missing"] == 3


def test_a_lost_occurrence_is_not_hidden_by_a_later_one_of_its_own_partition() -> None:
    """`a` at offsets 0 and 1 of one input partition: the owner met offset 0 first, so a
    publication of offset 1 only cannot account for it. The same pair on two input
    partitions is fine either way."""
    a = "a"
    same = [InputRecord(0, 0, a, partition=1), InputRecord(1, 100, a, partition=1)]
    out = [OutputRecord(0, 100, a, partition=owner(a))]
    result = run(same, out, [])
    assert [(f.kind, f.partition, f.offset) for f in result.findings] == [("missing", 1, 0)]
    apart = [InputRecord(0, 0, a, partition=1), InputRecord(0, 100, a, partition=2)]
    assert run(apart, out, []).passed


def test_order_holds_per_input_and_output_partition_pair_only() -> None:
    inputs, outputs = spread(40)
    # interleave the owner's publications across input partitions: still in order per pair
    w = owner("id-0")
    mine = sorted((o for o in outputs if o.partition == w), key=lambda o: -o.timestamp_ms)
    by_pair: dict[int, list[OutputRecord]] = {}
    for o in mine:
        src = next(r for r in inputs if r.id == o.id)
        by_pair.setdefault(src.partition, []).append(o)
    for group in by_pair.values():
        group.reverse()  # ascending within each input partition
    interleaved = [o for group in by_pair.values() for o in group]
    renumbered = [o._replace(offset=i) for i, o in enumerate(interleaved)]
    others = [o for o in outputs if o.partition != w]
    assert run(inputs, [*others, *renumbered], []).passed
    # swap two of one pair: one violation
    group = next(g for g in by_pair.values() if len(g) > 1)
    swapped = [*group[1:2], group[0], *group[2:]]
    rest = [o for g in by_pair.values() if g is not group for o in g]
    renumbered = [o._replace(offset=i) for i, o in enumerate([*swapped, *rest])]
    result = run(inputs, [*others, *renumbered], [])
    assert [f.kind for f in result.findings] == ["order_violation"]


def test_content_is_compared_with_any_occurrence_of_the_id_at_that_time() -> None:
    a = "a"
    inputs = [
        InputRecord(0, 5, a, digest=1, partition=0),
        InputRecord(0, 5, a, digest=2, partition=1),
    ]
    ok = [OutputRecord(0, 5, a, digest=2, partition=owner(a))]
    assert run(inputs, ok, []).passed
    changed = [OutputRecord(0, 5, a, digest=3, partition=owner(a))]
    assert [f.kind for f in run(inputs, changed, []).findings] == ["content_mismatch"]


@pytest.mark.parametrize("seed", range(40))
def test_the_vectorised_audit_agrees_with_the_loops_across_partitions(seed: int) -> None:
    rng = random.Random(seed)
    ids = [f"id-{n}" for n in range(rng.randint(1, 30))]
    partitions = rng.randint(1, 5)
    inputs: list[InputRecord] = []
    for p in range(partitions):
        for o in range(rng.randint(0, 50)):
            mid = None if rng.random() < 0.1 else rng.choice(ids)
            inputs.append(
                InputRecord(
                    o,
                    rng.randrange(0, 5 * W, 50),
                    mid,
                    None if mid else "id_null",
                    rng.randrange(3),
                    p,
                )
            )
    valid = [r for r in inputs if r.id]
    outputs: list[OutputRecord] = []
    offsets = [0] * WORKERS
    for rec in rng.sample(valid, k=min(60, len(valid) // 2)):
        assert rec.id is not None
        w = owner(rec.id) if rng.random() < 0.95 else rng.randrange(WORKERS)
        outputs.append(
            OutputRecord(
                offsets[w],
                rec.timestamp_ms if rng.random() < 0.9 else rng.randrange(0, 5 * W),
                None if rng.random() < 0.03 else rec.id if rng.random() < 0.95 else "stray",
                rec.digest if rng.random() < 0.9 else rng.choice([None, 7]),
                w,
            )
        )
        offsets[w] += 1
    dead = [
        DeadLetter(None if rng.random() < 0.1 else r.offset, r.timestamp_ms, r.reason, r.partition)
        for r in inputs
        if r.id is None and rng.random() < 0.7
    ]
    forwarded = [Forwarded(r.id, r.partition, r.offset) for r in valid if rng.random() < 0.1]
    ranges = [ALL, AuditRange(from_ms=W, to_ms=3 * W), AuditRange(offsets={0: (5, 40), 1: (0, 20)})]
    retentions = [
        None,
        {0: Retention(input_start=7, input_first_ms=rng.randrange(0, 5 * W))},
        {
            p: Retention(
                output_start=3, output_first_ms=rng.choice([None, rng.randrange(0, 5 * W)])
            )
            for p in range(WORKERS)
        },
    ]
    for audit_range in ranges:
        for committed in (None, {0: 30, 1: 10}):
            for retention in retentions:
                run(
                    inputs,
                    outputs,
                    dead,
                    forwarded,
                    audit_range=audit_range,
                    committed=committed,
                    retention=retention,
                )


def test_copies_with_one_timestamp_are_told_apart_by_their_contents() -> None:
    """Two copies of an id in one millisecond on two partitions, with other payloads: the
    owner published the second partition's copy (it read that partition directly). The
    output's contents say which occurrence it is, so the first partition's order holds
    and nothing is missing."""
    x = "copy-x"
    w = owner(x)
    z = next(f"copy-z{i}" for i in range(100) if owner(f"copy-z{i}") == w)
    inputs = [
        InputRecord(0, 100, x, digest=11, partition=0),
        InputRecord(1, 101, z, digest=19, partition=0),
        InputRecord(0, 100, x, digest=12, partition=1),
    ]
    outputs = [
        OutputRecord(0, 101, z, digest=19, partition=w),
        OutputRecord(1, 100, x, digest=12, partition=w),
    ]
    totals = run(inputs, outputs, []).totals()
    assert passed(totals), {k: v for k, v in totals.items() if v}
    assert (totals["orderViolations"], totals["missing"], totals["contentMismatches"]) == (0, 0, 0)
