"""The corpus of records without a valid id, or with an id a fast path must get right,
that the id rules' tests use: `dedup_contract.ids`'s own (test_ids) and the batch paths'
against the record-by-record rules (test_batch)."""

from __future__ import annotations

MALFORMED_JSON: list[bytes] = [
    b"{",
    b'{"messageId": "a"',
    b'{"messageId": "a"} trailing',
    b'{"messageId": "a"}{"messageId": "b"}',
    b"{'messageId': 'a'}",
    b'{"messageId": NaN}',
    b'{"messageId": "a", "x": Infinity}',
    b'{"messageId": "a", "x": -Infinity}',
    b"   ",
    b"\xef\xbb\xbf{}",  # UTF-8 byte-order mark
    b"[" * 100_000,  # nesting beyond the recursion limit
    b'{"messageId": "a", "n": ' + b"9" * 5000 + b"}",  # int beyond CPython's digit limit
]
"""Values that are not one strict JSON document: each is `not_json`."""

FAST_PATH_CORPUS = [
    b'{"messageId": "a"}',
    b'{"messageId": "a", "messageId": "b"}',
    b'{"messageId": 42}',
    b'{"messageId": -0}',
    b'{"messageId": 18446744073709551615}',
    b'{"messageId": 18446744073709551616}',
    b'{"messageId": -9223372036854775809}',
    b'{"messageId": 100000000000000000000000000000001}',
    b'{"messageId": 1e2}',
    b'{"messageId": 42.0}',
    b'{"messageId": "\\ud800"}',
    b'{"messageId": "\\ud83d\\ude00"}',
    b'\xef\xbb\xbf{"messageId": "bom"}',
    b'{"messageId": NaN}',
    b'{"messageId": Infinity}',
    b'{"messageId": "x"} trailing',
    b' \n{"messageId": "spaces"}\t ',
    b"[" * 2000 + b"]" * 2000,
    b'{"messageId": "' + b"x" * 600 + b'"}',
    b'{"messageId": ""}',
    b'{"messageId": true}',
    b'{"meta": {"id": 1}}',
    b'"just a string"',
    b"\xff\xfe",
    b'{"messageId": "caf\xc3\xa9"}',
    b'{"messageId": "caf\xe9"}',
]
"""Values the fast JSON path (orjson) must decide exactly as the standard parser does."""

PLAIN_JSON_CASES: list[bytes | None] = [
    None,
    b"",
    b"{}",
    b"[1]",
    b'"a"',
    b'{"messageId":"a"}',
    b' {"messageId":"x"} ',
    b'{"messageId":"a","messageId":"b"}',
    b'{"messageId":""}',
    b'{"messageId":"a b "}',
    b'{"messageId":"\xc3\xa9"}',
    b'{"messageId":"\\ud800"}',
    b'{"messageId":1}',
    b'{"messageId":12345678901234567890123}',
    b'{"messageId":null}',
    b'{"messageId":{"a":1}}',
    b'{"messageId":"' + b"a" * 512 + b'"}',
    b'{"messageId":"' + b"a" * 513 + b'"}',
    b'\xef\xbb\xbf{"messageId":"a"}',
    b'{"messageId":"a"} x',
    b'{"messageId":NaN}',
    b"\xff",
]
"""Values the plain-id fast path decides, or defers on, each as `extract_id` does."""

BAD_ID_BYTES: list[bytes | None] = [
    None,
    b"",
    b"\x80abc",
    b"\xff\xfe",
    b"\xed\xa0\x80",  # an encoded surrogate
    b"k" * 513,
    "ключ".encode(),  # a valid one among them
    b"k" * 512,
]
"""Keys and header values: missing, empty, not UTF-8, too long, and two valid ids."""
