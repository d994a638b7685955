"""Packed rows (dedup_spark.source.pack_batch / unpack): what goes in comes out, per
partition, in order."""

from __future__ import annotations

import pyarrow as pa

from dedup_spark.source import content_digest, extract_ids, ids_schema, pack_batch, unpack
from dedup_worker.ids import ID_HEADER, IdSpec


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


def test_the_content_digest_sees_key_value_and_headers_and_nothing_else() -> None:
    base = content_digest(b"k", b"v", [("h", b"1")])
    assert content_digest(b"k", b"v", [("h", b"1")]) == base
    changed = [
        content_digest(None, b"v", [("h", b"1")]),
        content_digest(b"k", b"w", [("h", b"1")]),
        content_digest(b"k", b"v", [("h", b"2")]),
        content_digest(b"k", b"v", [("h", None)]),
        content_digest(b"k", b"v", None),
        content_digest(b"kv", b"", [("h", b"1")]),  # the boundary between parts counts
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_an_output_record_is_digested_without_the_workers_id_header() -> None:
    value = b'{"messageId": "a"}'
    kafka_rows = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0], pa.int32()),
            "offset": pa.array([5], pa.int64()),
            "timestamp_ms": pa.array([1], pa.int64()),
            "key": pa.array([None], pa.binary()),
            "value": pa.array([value], pa.binary()),
            "headers": pa.array(
                [[{"key": "t", "value": b"1"}, {"key": ID_HEADER, "value": b"a"}]],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    spec = IdSpec("jsonField", "messageId")
    as_output = extract_ids(kafka_rows, spec, published=True)
    assert as_output.column(5).to_pylist() == [content_digest(None, value, [("t", b"1")])]
    as_input = extract_ids(kafka_rows, spec)
    assert as_input.column(5).to_pylist() != as_output.column(5).to_pylist()
