"""The store's on-disk format: its versions, metadata records and the checks on opening.

Column family ``default`` of a store holds metadata only, under the keys below: the
format version, the owner (JSON), the ownership generation (format 2), the applied input
and output offsets, the next generation number and one record per live generation (see
``window.Generation``); each column family ``gen-<number>`` (``family_name``) holds the
16-byte id keys (``ids.id_key``, whose BLAKE2b derivation the id rules own) of one
generation, with empty values.

Pure: these functions read and build metadata as ``bytes -> bytes`` mappings and never
touch RocksDB; ``store.Store`` does the reading and writing. A store is refused when its
format is another or unknown, when it has data but no format record, when it was written
under another ownership generation, or when it belongs to another pipeline or partition.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final, TypeAlias

from dedup_contract.release import VERSION
from dedup_contract.window import Generation

FORMAT_VERSION: Final = 1
"""A store of a worker without ownership: its ids are those of one input partition."""
FORMAT_VERSION_OWNED: Final = 2
"""A store of a worker under ownership (`Ownership`): its ids are those it owns. A worker
of a commit before ownership reads format 1 only, so it refuses such a store."""

FORMAT_VERSION_FINALIZED: Final = 3
"""Format 2's layout, written once the pipeline's upgrade to release 0.2.0 (or later) is
finalized (`dedupctl finalize-upgrade`; the worker's --finalized). Releases before 0.2.0
read formats 1 and 2 only and refuse it: the mark that turns a rollback past a finalized
upgrade into a refusal, and the step through which a later release's new layout will be
converted (first written only after a finalize, so a rollback before it stays safe)."""
FINALIZED_SINCE: Final = "0.2.0"
"""The first release that reads FORMAT_VERSION_FINALIZED."""
RELEASES_BEFORE_FINALIZED: Final = ("0.1.0",)
"""The releases that cannot open a store of FORMAT_VERSION_FINALIZED: a rollback to one of
them is refused once a pipeline is finalized (dedupctl's guard)."""

NEWEST_FORMAT: Final = FORMAT_VERSION_FINALIZED
"""The newest format this code reads: a store of a newer one was written by a newer
release, and is refused with both releases named (`refusal`)."""

STORE_TOO_NEW: Final = "StoreTooNew"
"""In the refusal of a store a newer release wrote: the operator's condition reads it from
the worker's last lines (its termination message)."""

FORMAT_KEY: Final = b"format"
WRITER_KEY: Final = b"writer"
"""The release (dedup_contract.release) of the worker that last opened the store to write
it. Releases before 0.2.0 did not record it (and ignore it)."""
OWNER_KEY: Final = b"owner"
OWNERSHIP_KEY: Final = b"ownership"
INPUT_OFFSET_KEY: Final = b"offset/input"
OUTPUT_OFFSET_KEY: Final = b"offset/output"
NEXT_GENERATION_KEY: Final = b"generation/next"
GENERATION_PREFIX: Final = b"generation/"
FAMILY_PREFIX: Final = "gen-"
"""The names of the generations' column families start with it."""

Record: TypeAlias = tuple[bytes, bytes]
"""A metadata record: (key, value) in column family ``default``."""

_OFFSET_PREFIX: Final = b"offset/"
_GENERATION_KEY: Final = struct.Struct(">Q")
_GENERATION_VALUE: Final = struct.Struct(">qqqq")
_OFFSET: Final = struct.Struct(">q")


class StoreError(Exception):
    """The store cannot be opened or used."""


class StoreOwnershipError(StoreError):
    """The store on this volume belongs to another pipeline or partition."""


@dataclass(frozen=True)
class StoreOwner:
    """Who a store belongs to; recorded on first open and checked on every open."""

    namespace: str
    pipeline: str
    partition: int

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pipeline} partition {self.partition}"


@dataclass(frozen=True)
class Ownership:
    """The ownership generation a store was written under: the number of workers the ids
    are divided among (`dedup_contract.ownership.owner`) and how many reshards changed that
    number (0 until resharding exists). A store of another generation holds another share
    of the ids, so a worker refuses it."""

    workers: int
    reshards: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1 or self.reshards < 0:
            raise ValueError(f"invalid ownership generation {self}")

    def __str__(self) -> str:
        return f"workers={self.workers},reshards={self.reshards}"


# --- opening: which format, whose store --------------------------------------------------


class Opening(Enum):
    """What opening a store finds in its format record."""

    CREATE = "create"
    """No format record and no data: a new store, to initialise (`initial_records`)."""
    OPEN = "open"
    """This worker's format."""
    SWITCH = "switch"
    """A format-1 store that a worker under ownership opens to switch it."""
    FINALIZE = "finalize"
    """A format-2 store that a worker of a finalized pipeline marks format 3."""


def format_version(ownership: Ownership | None, finalized: bool = False) -> int:
    """The format a worker writes to a new store: 1 without ownership; under it 2, or 3
    once the pipeline's upgrade is finalized."""
    if ownership is None:
        return FORMAT_VERSION
    return FORMAT_VERSION_FINALIZED if finalized else FORMAT_VERSION_OWNED


def opening(
    meta: Mapping[bytes, bytes],
    path: Path,
    ownership: Ownership | None,
    *,
    switch: bool,
    finalized: bool = False,
) -> Opening:
    """How a worker under ``ownership`` opens the store at ``path`` with metadata ``meta``.

    ``switch``: the worker may switch a format-1 store to ownership (only meaningful with
    an ``ownership``). Under ownership a store of format 2 or 3 opens; ``finalized`` (the
    pipeline's upgrade is finalized) marks a format-2 store format 3, and a format-3 store
    stays so either way (a worker never writes a format back). Raises StoreError for a
    store with data but no format record, or of a format this worker does not read
    (`refusal`).
    """
    recorded = meta.get(FORMAT_KEY)
    if recorded is None:
        if any(key.startswith(GENERATION_PREFIX) or key.startswith(_OFFSET_PREFIX) for key in meta):
            raise StoreError(f"store at {path} has data but no format record")
        return Opening.CREATE
    if switch and ownership is not None and recorded == str(FORMAT_VERSION).encode():
        return Opening.SWITCH
    if ownership is not None and recorded == str(FORMAT_VERSION_FINALIZED).encode():
        return Opening.OPEN
    if finalized and ownership is not None and recorded == str(FORMAT_VERSION_OWNED).encode():
        return Opening.FINALIZE
    if recorded != str(format_version(ownership)).encode():
        writer = meta.get(WRITER_KEY)
        raise StoreError(
            refusal(
                path,
                recorded.decode(errors="replace"),
                ownership,
                writer=None if writer is None else writer.decode(errors="replace"),
            )
        )
    return Opening.OPEN


def refusal(
    path: Path,
    recorded: str,
    ownership: Ownership | None,
    *,
    writer: str | None = None,
    this_release: str = VERSION,
) -> str:
    """Why a store of format ``recorded`` (last written by release ``writer``, where
    recorded) is refused by a worker of ``this_release`` under ``ownership``."""
    if recorded.isdigit() and int(recorded) > NEWEST_FORMAT:
        return (
            f"store at {path} has format {recorded}, written by release "
            f"{writer or 'unknown'}; this worker is release {this_release} and reads formats "
            f"up to {NEWEST_FORMAT}: a newer release wrote it ({STORE_TOO_NEW}; run that release "
            "or a later one)"
        )
    if ownership is None and recorded in (str(FORMAT_VERSION_OWNED), str(FORMAT_VERSION_FINALIZED)):
        return (
            f"store at {path} has format {recorded}: it was written under "
            "ownership (--owned-topic), and this worker runs without it"
        )
    if ownership is not None and recorded == str(FORMAT_VERSION):
        return (
            f"store at {path} has format {recorded}: it was written before "
            "ownership, and its ids are those of one input partition; a pipeline is "
            "switched to ownership as a whole, never one worker at a time (dedupctl "
            "switch-ownership; the worker then runs with --ownership-switch)"
        )
    return (
        f"store at {path} has format {recorded}; this worker reads format "
        f"{format_version(ownership)}"
    )


def check_owner(
    meta: Mapping[bytes, bytes],
    path: Path,
    owner: StoreOwner,
    ownership: Ownership | None,
    *,
    switching: bool,
) -> None:
    """Refuse a store written under another ownership generation (StoreError; not checked
    while ``switching``, the store has none yet) or owned by another pipeline or partition
    (StoreOwnershipError)."""
    recorded_ownership = meta.get(OWNERSHIP_KEY)
    if ownership is not None and not switching and recorded_ownership != str(ownership).encode():
        raise StoreError(
            f"store at {path} was written under ownership generation "
            f"{(recorded_ownership or b'none').decode(errors='replace')}, this worker runs "
            f"under {ownership}; its ids are another share, so it is refused"
        )
    recorded_owner = decode_owner(meta.get(OWNER_KEY), path)
    if recorded_owner != owner:
        raise StoreOwnershipError(
            f"store at {path} belongs to {recorded_owner}, not {owner}; "
            "refusing to use another partition's ids"
        )


def initial_records(
    owner: StoreOwner, ownership: Ownership | None, finalized: bool = False
) -> list[Record]:
    """The metadata a new store starts with: its format, owner and ownership generation."""
    records = [
        (FORMAT_KEY, str(format_version(ownership, finalized)).encode()),
        (OWNER_KEY, encode_owner(owner)),
    ]
    if ownership is not None:
        records.append((OWNERSHIP_KEY, str(ownership).encode()))
    return records


def writer_record(release: str = VERSION) -> Record:
    """The metadata naming the release that opens the store to write it."""
    return (WRITER_KEY, release.encode())


def finalized_records() -> list[Record]:
    """The metadata that marks a format-2 store format 3 (its layout is the same)."""
    return [(FORMAT_KEY, str(FORMAT_VERSION_FINALIZED).encode())]


def switched_records(ownership: Ownership) -> list[Record]:
    """The metadata that marks a switched store as one of format 2 under ``ownership``."""
    return [
        (FORMAT_KEY, str(FORMAT_VERSION_OWNED).encode()),
        (OWNERSHIP_KEY, str(ownership).encode()),
    ]


# --- what a store holds: offsets and generations ------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """The offsets and generations recorded in a store's metadata."""

    input_next_offset: int | None
    output_next_offset: int | None
    generations: tuple[Generation, ...]
    """Every generation with a record, by number (whether or not its data survived)."""
    next_generation: int
    """The number the next generation gets: above every recorded one."""


def read_recorded(meta: Mapping[bytes, bytes]) -> Recorded:
    """The offsets and generations of the metadata ``meta``."""
    generations = sorted(
        (decode_generation(key, value) for key, value in meta.items() if is_generation_key(key)),
        key=lambda generation: generation.number,
    )
    next_generation = decode_offset(meta.get(NEXT_GENERATION_KEY))
    return Recorded(
        input_next_offset=decode_offset(meta.get(INPUT_OFFSET_KEY)),
        output_next_offset=decode_offset(meta.get(OUTPUT_OFFSET_KEY)),
        generations=tuple(generations),
        next_generation=max(
            [next_generation or 0] + [generation.number + 1 for generation in generations]
        ),
    )


@dataclass(frozen=True)
class Reconciled:
    """Generation records matched with the column families found (after a crash
    mid-expiry or mid-rollover the two may differ)."""

    live: list[Generation]
    """Recorded, with a column family: the store's generations."""
    lost: list[Generation]
    """Recorded, without a column family: records to delete."""
    orphans: list[str]
    """Column families without a record (left by an interrupted write): to drop, sorted."""


def reconcile(generations: Iterable[Generation], families: Iterable[str]) -> Reconciled:
    """Match the recorded ``generations`` with the column family names ``families`` (the
    names that are not generations' are ignored)."""
    found = {name for name in families if is_generation_family(name)}
    recorded = list(generations)
    live = [g for g in recorded if family_name(g.number) in found]
    lost = [g for g in recorded if family_name(g.number) not in found]
    orphans = sorted(found - {family_name(g.number) for g in live})
    return Reconciled(live, lost, orphans)


# --- encoding ----------------------------------------------------------------------------


def family_name(number: int) -> str:
    """The column family of generation ``number``."""
    return f"{FAMILY_PREFIX}{number:010d}"


def is_generation_family(name: str) -> bool:
    return name.startswith(FAMILY_PREFIX)


def generation_key(number: int) -> bytes:
    """The metadata key of generation ``number``'s record."""
    return GENERATION_PREFIX + _GENERATION_KEY.pack(number)


def is_generation_key(key: bytes) -> bool:
    return key.startswith(GENERATION_PREFIX) and len(key) == len(GENERATION_PREFIX) + (
        _GENERATION_KEY.size
    )


def encode_generation(generation: Generation) -> bytes:
    return _GENERATION_VALUE.pack(
        generation.opened_ms, generation.oldest_ms, generation.newest_ms, generation.keys
    )


def decode_generation(key: bytes, value: bytes) -> Generation:
    (number,) = _GENERATION_KEY.unpack_from(key, len(GENERATION_PREFIX))
    opened_ms, oldest_ms, newest_ms, keys = _GENERATION_VALUE.unpack(value)
    return Generation(number, opened_ms, oldest_ms, newest_ms, keys)


def encode_owner(owner: StoreOwner) -> bytes:
    return json.dumps(
        {"namespace": owner.namespace, "pipeline": owner.pipeline, "partition": owner.partition},
        sort_keys=True,
    ).encode()


def decode_owner(raw: bytes | None, path: Path) -> StoreOwner:
    """The owner record ``raw`` of the store at ``path``; StoreError if unreadable."""
    try:
        fields = json.loads(raw or b"")
        return StoreOwner(
            str(fields["namespace"]), str(fields["pipeline"]), int(fields["partition"])
        )
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(f"store at {path} has an unreadable owner record: {raw!r}") from error


def encode_offset(offset: int) -> bytes:
    """An offset (or the next generation number) as recorded: 8 bytes, big-endian."""
    return _OFFSET.pack(offset)


def decode_offset(raw: bytes | None) -> int | None:
    return None if raw is None else int(_OFFSET.unpack(raw)[0])


def check_offset(which: str, offset: int | None) -> None:
    """ValueError for a negative offset (None: not given)."""
    if offset is not None and offset < 0:
        raise ValueError(f"{which} offset must not be negative, not {offset}")
