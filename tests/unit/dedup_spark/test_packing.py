"""Packed rows (dedup_spark.source.pack_batch / unpack): what goes in comes out, per
partition, in order."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dedup_contract.ids import IdSpec, InvalidRecord, extract_id
from dedup_spark.source import extract_ids, ids_schema, pack_batch, unpack


def batch(partitions: list[int | None]) -> pa.RecordBatch:
    n = len(partitions)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(partitions, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([1000 + i for i in range(n)], pa.int64()),
            pa.array([f"id-{i}" if i % 3 else None for i in range(n)], pa.string()),
            pa.array([None if i % 3 else "not_json" for i in range(n)], pa.string()),
            pa.array([i * 7919 for i in range(n)], pa.int64()),
        ],
        schema=ids_schema(),
    )


def test_one_partition_packs_into_one_row_and_back() -> None:
    b = batch([4] * 10)
    packed = list(pack_batch(b))
    assert [p.column(0).to_pylist() for p in packed] == [[4]]
    assert unpack(packed[0].column(1), ids_schema()).to_batches()[0].equals(b)


def test_mixed_partitions_pack_apart_with_their_own_rows() -> None:
    partitions = [0, 1, 0, None, 1, 0]
    b = batch(partitions)
    packed = {p.column(0)[0].as_py(): p.column(1) for p in pack_batch(b)}
    assert set(packed) == {0, 1, None}
    for partition, rows in packed.items():
        table = unpack(rows, ids_schema())
        expected = [i for i, p in enumerate(partitions) if p == partition]
        assert table.column("offset").to_pylist() == expected
        assert table.column("partition").to_pylist() == [partition] * len(expected)


def test_several_packed_rows_unpack_into_one_table_and_none_into_an_empty_one() -> None:
    rows = [p.column(1) for b in (batch([2] * 3), batch([2] * 2)) for p in pack_batch(b)]
    table = unpack(pa.chunked_array(rows), ids_schema())
    assert table.column("offset").to_pylist() == [0, 1, 2, 0, 1]
    empty = unpack(pa.array([], pa.binary()), ids_schema())
    assert empty.num_rows == 0 and empty.schema == ids_schema()
    assert list(pack_batch(batch([]))) == []


def test_ids_and_reasons_come_from_the_worker_rules_and_the_digest_is_passed_on() -> None:
    kafka_rows = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0, 0], pa.int32()),
            "offset": pa.array([5, 6], pa.int64()),
            "timestamp_ms": pa.array([1, 2], pa.int64()),
            "value": pa.array([b'{"messageId": "a"}', b"not json"], pa.binary()),
            "digest": pa.array([11, -12], pa.int64()),
        }
    )
    out = extract_ids(kafka_rows, IdSpec("jsonField", "messageId"))
    assert out.schema == ids_schema()
    assert out.column("id").to_pylist() == ["a", None]
    assert out.column("reason").to_pylist()[0] is None
    assert out.column("reason").to_pylist()[1]  # the worker's dead-letter reason code
    assert out.column("digest").to_pylist() == [11, -12]
    assert out.column("offset").to_pylist() == [5, 6]


VALUES = [
    b'{"messageId": "a"}',  # plain: decided by the fast path
    b'{"messageId": 42}',  # an integer id: the full rules
    b'{"messageId": "\xc3\xa9t\xc3\xa9"}',  # non-ASCII: the full rules
    b'{"messageId": ""}',
    b'{"messageId": null}',
    b'{"meta": {"id": "n"}, "messageId": "b"}',
    b"[1]",
    b"not json",
    b"",
    None,
]


@pytest.mark.parametrize(
    "spec",
    [
        IdSpec("jsonField", "messageId"),
        IdSpec("jsonField", "meta.id"),
        IdSpec("header", "id"),
        IdSpec("key"),
    ],
    ids=lambda s: f"{s.source}:{s.field}",
)
def test_each_row_gets_what_extract_id_gives_that_record(spec: IdSpec) -> None:
    n = len(VALUES)
    keys = [b"k", None, b"", b"\xff", b"x" * 600, b"k2", b"k3", None, b"k4", b"k5"]
    headers: list[list[dict[str, bytes | None]] | None] = [
        [{"key": "id", "value": b"h"}],
        None,
        [],
        [{"key": "id", "value": None}],
        [{"key": "id", "value": b"1"}, {"key": "id", "value": b"2"}],
        [{"key": "other", "value": b"o"}],
        [{"key": "id", "value": b""}],
        None,
        [{"key": "id", "value": b"\xff"}],
        [{"key": "id", "value": b"z"}],
    ]
    rows = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp_ms": pa.array([1] * n, pa.int64()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(VALUES, pa.binary()),
            "headers": pa.array(
                headers,
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
            "digest": pa.array([0] * n, pa.int64()),
        }
    )
    out = extract_ids(rows, spec)
    for i in range(n):
        hs = None if headers[i] is None else [(h["key"], h["value"]) for h in headers[i]]
        try:
            want: tuple[str | None, str | None] = (extract_id(spec, keys[i], VALUES[i], hs), None)
        except InvalidRecord as invalid:
            want = (None, invalid.reason)
        got = (out.column("id")[i].as_py(), out.column("reason")[i].as_py())
        assert got == want, (i, VALUES[i])
