"""How a message id is extracted and hashed: the one place for these rules (which worker
owns an id is `dedup_contract.ownership`'s).

The worker, the Spark jobs and the tests import this module; nothing re-implements it.

Extraction rules (``extract_id``), for every source:

* The id is text. It must be valid UTF-8 (no unpaired surrogates), non-empty and at
  most ``MAX_ID_BYTES`` bytes in UTF-8. It is taken as-is: no trimming, no case
  folding, no Unicode normalisation ("a" and "a " are two ids).
* ``jsonField``: the record value must be one strict JSON document (UTF-8, no BOM, no
  ``NaN``/``Infinity``) whose top level is an object. ``field`` is a dotted path
  (``meta.id``) through nested objects; a name containing a dot cannot be addressed.
  If an object repeats a name, the last occurrence wins (as in Python, Java's Jackson
  default and Spark). The id may be a JSON string or a JSON integer; an integer
  becomes its canonical decimal text, so ``42`` and ``"42"`` are the same id. Numbers
  with a fraction or exponent (``42.0``, ``4.2e1``) are rejected even when integral:
  their text form is ambiguous and other readers lose precision above 2**53. Booleans,
  ``null``, objects and arrays are not ids.
* ``header``: the last header named ``field`` (names are case-sensitive, as in
  Kafka; Java's ``Headers.lastHeader``) holds the id as UTF-8 bytes.
* ``key``: the record key holds the id as UTF-8 bytes.

Anything else raises ``InvalidRecord`` with a stable ``reason`` code, which the worker
puts on the dead-letter record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, Literal, cast, get_args

import orjson

IdSource = Literal["jsonField", "header", "key"]
ID_SOURCES: Final[tuple[IdSource, ...]] = get_args(IdSource)

MAX_ID_BYTES: Final = 512
"""Longest accepted id, in UTF-8 bytes. Longer ids are dead-lettered (``id_too_long``)."""

ID_HEADER: Final = "dedup.id"
"""Header on every output record carrying its id as UTF-8 (read back by catch-up)."""

ID_KEY_BYTES: Final = 16

# Reason codes (stable: they are written into dead-letter headers and metrics labels).
NOT_UTF8: Final = "not_utf8"
NOT_JSON: Final = "not_json"
NOT_OBJECT: Final = "not_object"
NULL_VALUE: Final = "null_value"
EMPTY_VALUE: Final = "empty_value"
MISSING_ID: Final = "missing_id"
ID_NULL: Final = "id_null"
ID_NOT_SCALAR: Final = "id_not_scalar"
ID_BAD_TYPE: Final = "id_bad_type"
ID_EMPTY: Final = "id_empty"
ID_TOO_LONG: Final = "id_too_long"
MISSING_HEADER: Final = "missing_header"
NULL_HEADER: Final = "null_header"
MISSING_KEY: Final = "missing_key"
REASONS: Final = frozenset(
    {
        NOT_UTF8,
        NOT_JSON,
        NOT_OBJECT,
        NULL_VALUE,
        EMPTY_VALUE,
        MISSING_ID,
        ID_NULL,
        ID_NOT_SCALAR,
        ID_BAD_TYPE,
        ID_EMPTY,
        ID_TOO_LONG,
        MISSING_HEADER,
        NULL_HEADER,
        MISSING_KEY,
    }
)


class InvalidRecord(Exception):
    """A record without a valid id. ``reason`` is a stable code, ``detail`` is for humans."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class IdSpec:
    """Where the id comes from. ``field``: dotted JSON path, or header name; unused for key."""

    source: IdSource = "jsonField"
    field: str = "messageId"

    def __post_init__(self) -> None:
        # worded as "<part> ...": the operator prefixes "messageId.", the worker its flag
        if self.source not in ID_SOURCES:
            raise ValueError(
                f"source {self.source!r} is not an id source: one of {', '.join(ID_SOURCES)}"
            )
        if self.source != "key" and not self.field:
            raise ValueError(f"field is required when source is {self.source}")
        if self.source == "jsonField" and "" in self.field.split("."):
            raise ValueError(f"field: JSON path {self.field!r} has an empty segment")

    @property
    def path(self) -> tuple[str, ...]:
        """The JSON path as its names (``("meta", "id")`` for ``meta.id``)."""
        return tuple(self.field.split("."))


def extract_id(
    spec: IdSpec,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> str:
    """The record's id under ``spec`` (see the module docstring), or raise InvalidRecord."""
    if spec.source == "jsonField":
        return _id_from_json(spec.field, value)
    if spec.source == "header":
        return _id_from_bytes(_last_header(spec.field, headers), "header " + spec.field)
    if key is None:
        raise InvalidRecord(MISSING_KEY, "record has no key")
    return _id_from_bytes(key, "key")


def plain_field(spec: IdSpec) -> str | None:
    """The field ``plain_json_id`` can decide ids by under ``spec`` (a top-level JSON
    field), or None when every record takes ``extract_id``."""
    return spec.field if spec.source == "jsonField" and "." not in spec.field else None


def plain_json_id(field: str, value: bytes | None) -> str | None:
    """The common case of ``extract_id`` for a ``jsonField`` spec whose field has no dot:
    the value parses (orjson) to an object whose ``field`` is a non-empty ASCII string of
    at most ``MAX_ID_BYTES``, which is then the id, exactly as ``extract_id`` returns it.
    Anything else returns None and must be decided by ``extract_id`` (which also names
    the reason). One call per record instead of five: the worker's triage loop."""
    if not value:
        return None
    try:
        document = _fast_loads(value)
    except _FastJSONError:
        return None
    if type(document) is not dict:
        return None
    found = document.get(field)
    if type(found) is str and found and len(found) <= MAX_ID_BYTES and found.isascii():
        return found
    return None


def plain_json_ids(field: str, values: Sequence[bytes | None]) -> list[str] | None:
    """The batch form of ``plain_json_id``: the ids of all ``values`` when every one of
    them is decided by ``plain_json_id``'s rule, else None (then each value takes
    ``plain_json_id``, and ``extract_id`` where that defers).

    Driven from C (``map`` over orjson and the ``str`` methods) rather than a Python call
    per record: 1.3 us per record instead of 2.3 in the worker's triage (real messages,
    thread CPU time). Whatever the rule would defer on fails here as a whole: a value
    orjson refuses (None and empty included), a document that is not an object
    (``dict.get`` refuses it), a field that is missing or not a string (``str.isascii``
    refuses it), a non-ASCII, empty or too long id."""
    try:
        found = list(map(_document_get, map(_loads_any, values), repeat(field)))
        if (
            all(map(str.isascii, found))
            and all(found)
            and max(map(len, found), default=0) <= MAX_ID_BYTES
        ):
            return found
    except (_FastJSONError, TypeError):
        pass
    return None


def plain_key_ids(keys: Sequence[bytes | None]) -> list[str] | None:
    """The batch form of ``extract_id`` for the ``key`` source: the ids of all records
    whose ``keys`` are given when every one is an id (bytes, non-empty, at most
    ``MAX_ID_BYTES``, UTF-8), else None (then each record takes ``extract_id``, which
    names the reason). Driven from C (``map`` over ``bytes.decode``): a missing key
    (``None``) or one that is not UTF-8 fails the batch as a whole."""
    try:
        if all(keys) and max(map(len, keys), default=0) <= MAX_ID_BYTES:  # type: ignore[arg-type]
            return list(map(bytes.decode, keys))  # type: ignore[arg-type]
    except (TypeError, UnicodeDecodeError):
        pass
    return None


def plain_header_ids(
    name: str, headers: Sequence[Sequence[tuple[str, bytes | None]] | None]
) -> list[str] | None:
    """The batch form of ``extract_id`` for the ``header`` source: each record's last
    header called ``name`` (a ``dict`` of a record's headers keeps the last value of each
    name, as ``Headers.lastHeader``), decided as ``plain_key_ids`` decides keys. None when
    any record has no headers, no such header or a null one, or its value is no id: then
    each record takes ``extract_id``."""
    try:
        found = list(map(_document_get, map(dict, headers), repeat(name)))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # dict(None); a header that is not a (name, value) pair
        return None
    return plain_key_ids(found)


def id_key(message_id: str) -> bytes:
    """The store key of an id: BLAKE2b, 16-byte digest, over its UTF-8 bytes.

    This is a stable on-disk format (persistent stores and bootstrap SST files hold
    these keys): changing it orphans every existing store.
    """
    hasher = _ID_HASH.copy()
    hasher.update(message_id.encode())
    return hasher.digest()


def id_keys(utf8_ids: Iterable[bytes]) -> list[bytes]:
    """The store keys (``id_key``) of ids given as their UTF-8 bytes, in order."""
    keys: list[bytes] = []
    add = keys.append
    new_hasher = _ID_HASH.copy
    for raw in utf8_ids:
        hasher = new_hasher()
        hasher.update(raw)
        add(hasher.digest())
    return keys


# A fresh BLAKE2b of the key's digest size, copied for each key: a copy costs 0.29 us
# per key where constructing one (its keyword arguments parsed) costs 0.59 us.
_ID_HASH: Final = hashlib.blake2b(digest_size=ID_KEY_BYTES)


# --- extraction helpers ------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


# The C scanner behind json.loads, without its per-call encoding sniffing (the value is
# decoded as strict UTF-8 first) and refusing NaN/Infinity. ~2 us for a 300-byte object.
_scan_once: Callable[[str, int], tuple[Any, int]]
_scan_once = json.JSONDecoder(parse_constant=_reject_constant).scan_once  # type: ignore[attr-defined]
_JSON_SPACE: Final = " \t\n\r"
_ABSENT: Final = object()
_fast_loads: Final = orjson.loads
_FastJSONError: Final = orjson.JSONDecodeError
# For plain_json_ids: orjson.loads refuses None (JSONDecodeError) as any non-JSON input,
# and dict.get unbound raises TypeError for anything but a dict.
_loads_any: Final = cast(Callable[[Any], Any], orjson.loads)
_document_get: Final = cast(Callable[[Any, str], Any], dict.get)


def _id_from_json(field: str, value: bytes | None) -> str:
    if value is None:
        raise InvalidRecord(NULL_VALUE, "record value is null (tombstone)")
    if not value:
        raise InvalidRecord(EMPTY_VALUE, "record value is empty")
    # Fast path: orjson parses ~4x faster and is at least as strict (UTF-8, no BOM, no
    # NaN/Infinity, no trailing data; the last duplicate name wins). What it refuses
    # takes the standard parser, which also names the reason. One difference needs care:
    # orjson turns an integer beyond 64 bits into a float, which these rules would reject,
    # so an id that comes out as a float is decided by the standard parser too.
    try:
        found = _id_field(field, _fast_loads(value))
    except _FastJSONError:
        pass
    else:
        if type(found) is not float:
            return _checked_id(found, field)
    try:
        text = value.decode()
    except UnicodeDecodeError as error:
        raise InvalidRecord(
            NOT_UTF8, f"record value is not UTF-8 ({error.reason} at byte {error.start})"
        ) from None
    return _checked_id(_id_field(field, _parse_json(text)), field)


def _id_field(field: str, document: Any) -> Any:
    """The value at ``field`` in a parsed record value (``_ABSENT`` if missing)."""
    if type(document) is not dict:
        raise InvalidRecord(
            NOT_OBJECT, f"record value is a JSON {_json_type(document)}, not an object"
        )
    if "." not in field:
        found = document.get(field, _ABSENT)
    else:
        found = document
        walked: list[str] = []
        for name in field.split("."):
            if type(found) is not dict:
                raise InvalidRecord(
                    MISSING_ID, f"{'.'.join(walked)} is a JSON {_json_type(found)}, not an object"
                )
            found = found.get(name, _ABSENT)
            walked.append(name)
    return found


def _checked_id(found: Any, field: str) -> str:
    if type(found) is str:
        return _checked_text(found, field)
    if type(found) is int:
        return _checked_text(str(found), field)
    if found is _ABSENT:
        raise InvalidRecord(MISSING_ID, f"no field {field}")
    if found is None:
        raise InvalidRecord(ID_NULL, f"{field} is null")
    if type(found) is dict or type(found) is list:
        raise InvalidRecord(ID_NOT_SCALAR, f"{field} is a JSON {_json_type(found)}")
    raise InvalidRecord(
        ID_BAD_TYPE, f"{field} is a JSON {_json_type(found)}; ids are strings or integers"
    )


def _parse_json(text: str) -> Any:
    start = 0
    if text[0] in _JSON_SPACE:
        start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        document, end = _scan_once(text, start)
    except StopIteration:
        raise InvalidRecord(NOT_JSON, f"expected a JSON value at character {start}") from None
    except RecursionError:
        raise InvalidRecord(NOT_JSON, "JSON nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, NaN/Infinity, integers over 4300 digits
        raise InvalidRecord(NOT_JSON, str(error)) from None
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        raise InvalidRecord(NOT_JSON, f"extra data after the JSON value at character {end}")
    return document


def _json_type(found: object) -> str:
    if found is None:
        return "null"
    if isinstance(found, bool):
        return "boolean"
    if isinstance(found, int | float):
        return "number"
    if isinstance(found, str):
        return "string"
    if isinstance(found, list):
        return "array"
    return "object"


def _last_header(name: str, headers: Sequence[tuple[str, bytes | None]] | None) -> bytes:
    if headers:
        for header_name, header_value in reversed(headers):
            if header_name == name:
                if header_value is None:
                    raise InvalidRecord(NULL_HEADER, f"header {name} has a null value")
                return header_value
    raise InvalidRecord(MISSING_HEADER, f"no header {name}")


def _id_from_bytes(raw: bytes, where: str) -> str:
    if len(raw) > MAX_ID_BYTES:
        raise InvalidRecord(
            ID_TOO_LONG, f"{where} is {len(raw)} bytes; ids are at most {MAX_ID_BYTES}"
        )
    if not raw:
        raise InvalidRecord(ID_EMPTY, f"{where} is empty")
    try:
        return raw.decode()
    except UnicodeDecodeError as error:
        raise InvalidRecord(
            NOT_UTF8, f"{where} is not UTF-8 ({error.reason} at byte {error.start})"
        ) from None


def _checked_text(text: str, where: str) -> str:
    if not text:
        raise InvalidRecord(ID_EMPTY, f"{where} is empty")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError:
            raise InvalidRecord(NOT_UTF8, f"{where} has an unpaired surrogate") from None
    if size > MAX_ID_BYTES:
        raise InvalidRecord(ID_TOO_LONG, f"{where} is {size} bytes; ids are at most {MAX_ID_BYTES}")
    return text
