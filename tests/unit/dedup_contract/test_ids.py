"""Id extraction and hashing: the rules every part imports from dedup_contract.ids."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from dedup_contract import ids
from dedup_contract.ids import (
    ID_HEADER,
    MAX_ID_BYTES,
    REASONS,
    IdSpec,
    InvalidRecord,
    extract_id,
    id_key,
)
from support.id_corpus import FAST_PATH_CORPUS, MALFORMED_JSON, PLAIN_JSON_CASES

JSON = IdSpec()
NESTED = IdSpec("jsonField", "meta.id")
HEADER = IdSpec("header", "event-id")
KEY = IdSpec("key")


def from_value(value: bytes | None, spec: IdSpec = JSON) -> str:
    return extract_id(spec, None, value, None)


def reason(
    spec: IdSpec,
    key: bytes | None = None,
    value: bytes | None = None,
    headers: Sequence[tuple[str, bytes | None]] | None = None,
) -> str:
    with pytest.raises(InvalidRecord) as caught:
        extract_id(spec, key, value, headers)
    assert caught.value.reason in REASONS
    assert str(caught.value) == f"{caught.value.reason}: {caught.value.detail}"
    return caught.value.reason


# --- jsonField -----------------------------------------------------------------------


def test_string_id_is_taken_as_is() -> None:
    assert from_value(b'{"messageId": "abc-1", "x": 1}') == "abc-1"
    assert from_value(b'{"messageId": " padded "}') == " padded "
    assert from_value(b' \n{"messageId": "ws"} \r\n') == "ws"


def test_unicode_ids_round_trip() -> None:
    value = json.dumps({"messageId": "zürich-東京-🚀"}).encode()
    assert from_value(value) == "zürich-東京-🚀"
    raw = '{"messageId": "zürich-東京-🚀"}'.encode()
    assert from_value(raw) == "zürich-東京-🚀"


def test_integer_id_becomes_canonical_decimal() -> None:
    assert from_value(b'{"messageId": 42}') == "42"
    assert from_value(b'{"messageId": -7}') == "-7"
    big = 2**80 + 1
    assert from_value(f'{{"messageId": {big}}}'.encode()) == str(big)


@pytest.mark.parametrize("literal", ["42.0", "4.2e1", "1.5", "true", "false"])
def test_floats_and_booleans_are_not_ids(literal: str) -> None:
    assert reason(JSON, value=f'{{"messageId": {literal}}}'.encode()) == "id_bad_type"


def test_null_and_structured_ids() -> None:
    assert reason(JSON, value=b'{"messageId": null}') == "id_null"
    assert reason(JSON, value=b'{"messageId": {"a": 1}}') == "id_not_scalar"
    assert reason(JSON, value=b'{"messageId": [1]}') == "id_not_scalar"


def test_nested_path() -> None:
    value = b'{"meta": {"id": "n-1", "other": 2}, "id": "top"}'
    assert from_value(value, NESTED) == "n-1"
    assert reason(NESTED, value=b'{"meta": {"other": 1}}') == "missing_id"
    assert reason(NESTED, value=b'{"id": "top"}') == "missing_id"
    assert reason(NESTED, value=b'{"meta": "flat"}') == "missing_id"
    assert reason(NESTED, value=b'{"meta": null}') == "missing_id"
    assert reason(NESTED, value=b'{"meta": {"id": ""}}') == "id_empty"


def test_missing_and_empty_ids() -> None:
    assert reason(JSON, value=b'{"id": "x"}') == "missing_id"
    assert reason(JSON, value=b"{}") == "missing_id"
    assert reason(JSON, value=b'{"messageId": ""}') == "id_empty"


def test_repeated_name_last_wins() -> None:
    assert from_value(b'{"messageId": "first", "messageId": "last"}') == "last"


@pytest.mark.parametrize("value", MALFORMED_JSON)
def test_malformed_json(value: bytes) -> None:
    assert reason(JSON, value=value) == "not_json"


def test_binary_garbage_is_not_utf8() -> None:
    assert reason(JSON, value=bytes(range(256))) == "not_utf8"
    assert reason(JSON, value=b'{"messageId": "\xff"}') == "not_utf8"
    assert reason(JSON, value=b"\xed\xa0\x80") == "not_utf8"  # encoded surrogate


def test_unpaired_surrogate_escape_is_not_an_id() -> None:
    assert reason(JSON, value=b'{"messageId": "a\\ud800b"}') == "not_utf8"
    assert from_value(b'{"messageId": "\\ud83d\\ude80"}') == "🚀"


@pytest.mark.parametrize("value", [b'"just a string"', b"[1, 2]", b"42", b"null", b"true"])
def test_top_level_must_be_an_object(value: bytes) -> None:
    assert reason(JSON, value=value) == "not_object"


def test_null_and_empty_values() -> None:
    assert reason(JSON, value=None) == "null_value"
    assert reason(JSON, value=b"") == "empty_value"


def test_id_length_limit_counts_utf8_bytes() -> None:
    assert from_value(json.dumps({"messageId": "a" * MAX_ID_BYTES}).encode()) == "a" * MAX_ID_BYTES
    assert (
        reason(JSON, value=json.dumps({"messageId": "a" * (MAX_ID_BYTES + 1)}).encode())
        == "id_too_long"
    )
    euro = "€" * (MAX_ID_BYTES // 3)  # 3 bytes each: fits
    assert from_value(json.dumps({"messageId": euro}, ensure_ascii=False).encode()) == euro
    over = "€" * (MAX_ID_BYTES // 3 + 1)
    assert reason(JSON, value=json.dumps({"messageId": over}).encode()) == "id_too_long"
    huge = b'{"messageId": "' + b"x" * 1_000_000 + b'"}'
    assert reason(JSON, value=huge) == "id_too_long"
    assert reason(JSON, value=f'{{"messageId": {10**600}}}'.encode()) == "id_too_long"


# --- header and key sources ------------------------------------------------------------


def test_header_source() -> None:
    headers = [("other", b"x"), ("event-id", b"h-1")]
    assert extract_id(HEADER, b"key", b"not json", headers) == "h-1"
    assert extract_id(HEADER, None, None, [("event-id", b"old"), ("event-id", b"new")]) == "new"
    assert extract_id(HEADER, None, None, [("event-id", "ü".encode())]) == "ü"


def test_header_source_errors() -> None:
    assert reason(HEADER, headers=None) == "missing_header"
    assert reason(HEADER, headers=[]) == "missing_header"
    assert reason(HEADER, headers=[("Event-Id", b"x")]) == "missing_header"  # case-sensitive
    assert reason(HEADER, headers=[("event-id", None)]) == "null_header"
    assert reason(HEADER, headers=[("event-id", b"")]) == "id_empty"
    assert reason(HEADER, headers=[("event-id", b"\xff\xfe")]) == "not_utf8"
    assert reason(HEADER, headers=[("event-id", b"x" * (MAX_ID_BYTES + 1))]) == "id_too_long"


def test_key_source() -> None:
    assert extract_id(KEY, b"k-1", None, None) == "k-1"
    assert extract_id(KEY, "ключ".encode(), b"{}", [("event-id", b"h")]) == "ключ"
    assert reason(KEY, key=None) == "missing_key"
    assert reason(KEY, key=b"") == "id_empty"
    assert reason(KEY, key=b"\x80abc") == "not_utf8"
    assert reason(KEY, key=b"k" * (MAX_ID_BYTES + 1)) == "id_too_long"
    assert extract_id(KEY, b"k" * MAX_ID_BYTES, None, None) == "k" * MAX_ID_BYTES


def test_id_spec_validation() -> None:
    assert IdSpec() == IdSpec("jsonField", "messageId")
    assert NESTED.path == ("meta", "id")
    with pytest.raises(ValueError, match="id source"):
        IdSpec("body", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="field is required when source is header"):
        IdSpec("header", "")
    with pytest.raises(ValueError, match="empty segment"):
        IdSpec("jsonField", "meta..id")
    assert IdSpec("key", "").source == "key"


# --- hashing and partitioning --------------------------------------------------------


def test_id_key_is_blake2b_128_of_utf8() -> None:
    # Stable on-disk format: these bytes must never change.
    assert id_key("abc").hex() == "cf4ab791c62b8d2b2109c90275287816"
    assert id_key("") == bytes.fromhex("cae66941d9efbd404e4d88758ea67670")
    assert len(id_key("x" * MAX_ID_BYTES)) == 16
    assert id_key("zürich") != id_key("zurich")
    assert ID_HEADER == "dedup.id"


# The fast JSON path (orjson) must decide exactly as the standard parser does.


def outcome(value: bytes) -> str:
    try:
        return "id:" + extract_id(JSON, None, value, None)
    except InvalidRecord as invalid:
        return "reason:" + invalid.reason


@pytest.mark.parametrize("value", FAST_PATH_CORPUS)
def test_fast_json_path_agrees_with_the_standard_parser(
    value: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = outcome(value)

    def refuse(_: bytes) -> None:
        raise ids._FastJSONError("forced onto the standard parser", "", 0)

    monkeypatch.setattr(ids, "_fast_loads", refuse)
    assert fast == outcome(value)


@pytest.mark.parametrize("value", PLAIN_JSON_CASES)
def test_plain_json_id_is_extract_id_or_defers(value: bytes | None) -> None:
    """The triage fast path returns exactly what `extract_id` returns, or None (defer)."""
    fast = ids.plain_json_id("messageId", value)
    try:
        full: str | None = ids.extract_id(ids.IdSpec(), None, value, None)
    except ids.InvalidRecord:
        full = None
    assert fast is None or fast == full
    if full is not None and full.isascii() and value is not None and b'messageId":"' in value:
        assert fast == full  # plain string ids take the fast path


@pytest.mark.parametrize("value", PLAIN_JSON_CASES)
def test_plain_json_ids_decides_a_batch_as_plain_json_id_decides_each(
    value: bytes | None,
) -> None:
    """The batch form: every id when each value is decided, None when any one defers."""
    plain = b'{"messageId":"p"}'
    one = ids.plain_json_id("messageId", value)
    for batch in ([value], [plain, value, plain]):
        expected = None if one is None else [ids.plain_json_id("messageId", v) for v in batch]
        assert ids.plain_json_ids("messageId", batch) == expected


def test_plain_json_ids_of_an_empty_batch_is_empty() -> None:
    assert ids.plain_json_ids("messageId", []) == []


def test_id_keys_are_the_id_key_of_each_utf8_id() -> None:
    texts = ["abc", "", "zürich", "x" * MAX_ID_BYTES]
    assert ids.id_keys([t.encode() for t in texts]) == [id_key(t) for t in texts]
    assert ids.id_keys([b"abc"]) == [bytes.fromhex("cf4ab791c62b8d2b2109c90275287816")]
