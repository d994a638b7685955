"""The worker's id window on disk: RocksDB (rocksdict) with one column family per generation.

Layout (one RocksDB per worker, on its volume): column family ``default`` holds metadata
only -- format version, owner, the applied input and output offsets, and one record per
live generation; each column family ``gen-<number>`` holds the 16-byte id keys of one
generation. The format, its records and the checks on opening are ``store_format``'s.

Why generations (``bench/store.py`` at 10M ids; bench/HISTORY.md, "Why generations"):
expiry drops a whole column family, which deletes its files: no tombstones, no scan, no
compaction debt and no expiry index. An id costs its 16-byte key plus RocksDB overhead,
17.6 bytes on disk after compaction (zstd at the bottommost level compresses away the
zeroed sequence numbers), where one key per id plus a sequence index deleted oldest
first took 47.4, 3.7 s instead of 25 ms to expire 1/8 of the window, and 40% slower
lookups over its tombstones. The price: a miss is a bloom probe in every live
generation, so there are few of them (``StoreConfig.generations``, 4: half as many
probes as 8, 30% more lookups/s at half hits) and the window is coarse by
``1/generations`` (see ``window.py``).

Consistency: ``record_batch`` writes ids, generation records and offsets in one atomic
write batch (WAL on, not fsynced: after a power loss the store is an older but
consistent state, repaired by the worker's catch-up from the output topic). Expiry and
reset fsync their metadata change before dropping column families, and open reconciles
the two (column families not in the metadata are dropped). A ``Store`` is not
thread-safe: one worker thread owns it; inside, ``contains_many`` shares large batches
with its own lookup threads (read-only; see ``StoreConfig``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import compress, pairwise, repeat
from operator import is_not, not_
from pathlib import Path
from types import TracebackType
from typing import Final, Self, cast

from rocksdict import (
    BlockBasedOptions,
    BottommostLevelCompaction,
    Cache,
    ColumnFamily,
    CompactOptions,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from dedup_contract import store_format as fmt
from dedup_contract.store_format import (
    FORMAT_VERSION,
    FORMAT_VERSION_OWNED,
    Ownership,
    StoreError,
    StoreOwner,
    StoreOwnershipError,
)
from dedup_contract.window import Generation, WindowPolicy, generations_to_drop, place_batch

log = logging.getLogger(__name__)

MiB: Final = 1 << 20
PARALLEL_LOOKUP_MIN: Final = 1024
"""Smallest batch that ``contains_many`` splits across the lookup threads."""

__all__ = [
    "FORMAT_VERSION",
    "FORMAT_VERSION_OWNED",
    "PARALLEL_LOOKUP_MIN",
    "MiB",
    "Ownership",
    "Store",
    "StoreConfig",
    "StoreError",
    "StoreOwner",
    "StoreOwnershipError",
    "wipe",
]
"""With the format's names that the store's users import from here (`store_format`)."""


@dataclass(frozen=True)
class StoreConfig:
    """RocksDB resources and the number of generations.

    Memory is about ``block_cache_bytes + write_buffer_bytes * max_write_buffers`` plus
    the bloom filters and indexes, which are held outside the cache so they are never
    re-read: about ``bloom_bits_per_key / 8 + 0.3`` bytes per id (16 MiB per 10M ids,
    3 GiB per 2 billion). Size the container for that.

    ``generations``: a miss is one bloom probe per live generation, and the window is
    coarse by ``1/generations`` (see ``window.py``). 4 measured twice as fast on misses
    as 8 at 10M ids.

    ``lookup_threads``: threads that share each batched lookup (the caller's included);
    1 looks up inline. Match it to the cores the worker may use.
    """

    block_cache_bytes: int = 64 * MiB
    # 8 MiB, not 32: a memtable insert is a skip-list walk that misses the CPU caches;
    # with 4x smaller memtables a batch of 5,000 ids is written in 2.7 ms instead of
    # 6 ms, under the GIL (worker: +5% records/s; store bench: 2x inserts/s).
    write_buffer_bytes: int = 8 * MiB
    max_write_buffers: int = 2
    bloom_bits_per_key: int = 10
    generations: int = 4
    lookup_threads: int = 2

    def __post_init__(self) -> None:
        if self.block_cache_bytes < MiB:
            raise ValueError(f"block cache must be at least 1 MiB, not {self.block_cache_bytes}")
        if self.write_buffer_bytes < MiB:
            raise ValueError(f"write buffer must be at least 1 MiB, not {self.write_buffer_bytes}")
        if self.max_write_buffers < 2:
            raise ValueError(f"need at least 2 write buffers, not {self.max_write_buffers}")
        if not 0 <= self.bloom_bits_per_key <= 30:
            raise ValueError(f"bloom bits per key must be 0..30, not {self.bloom_bits_per_key}")
        if not 2 <= self.generations <= 64:
            raise ValueError(f"generations must be 2..64, not {self.generations}")
        if not 1 <= self.lookup_threads <= 64:
            raise ValueError(f"lookup threads must be 1..64, not {self.lookup_threads}")


class Store:
    """The ids a worker has published, in a bounded window, plus its applied offsets."""

    def __init__(
        self,
        path: Path,
        db: Rdict,
        owner: StoreOwner,
        window: WindowPolicy,
        config: StoreConfig,
        cf_options: Options,
        ownership: Ownership | None = None,
        switch: bool = False,
        finalized: bool = False,
    ) -> None:
        """Use ``Store.open``."""
        self._path = path
        self._db: Rdict | None = db
        self._owner = owner
        self._ownership = ownership
        self._may_switch = switch and ownership is not None
        self._finalized = finalized
        self._switching = False  # a store written before ownership, being switched
        self._window = window
        self._config = config
        self._cf_options = cf_options
        self._generations: list[Generation] = []
        self._tables: dict[int, Rdict] = {}
        self._handles: dict[int, ColumnFamily] = {}
        self._newest_first: list[Rdict] = []
        self._next_generation = 0
        self._input_next_offset: int | None = None
        self._output_next_offset: int | None = None
        self._known_absent: frozenset[bytes] = frozenset()
        self._lookup_pool = (
            ThreadPoolExecutor(config.lookup_threads - 1, thread_name_prefix="store-lookup")
            if config.lookup_threads > 1
            else None
        )
        self._sync = WriteOptions()
        self._sync.sync = True

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        owner: StoreOwner,
        window: WindowPolicy,
        config: StoreConfig = StoreConfig(),
        ownership: Ownership | None = None,
        switch: bool = False,
        finalized: bool = False,
    ) -> Store:
        """Open the store at ``path``, creating it (owned by ``owner``) if there is none.

        ``ownership``: the generation of a worker under ownership (format 2), None for
        one without (format 1). A store written under another generation, or in the other
        format, is refused; but with ``switch``, a store written before ownership (format
        1) is opened to be switched (`switching`): the caller adds the ids this worker owns
        from the other output partitions, then calls `complete_switch`. ``finalized``:
        the pipeline's upgrade is finalized; a new store is created at format 3 and a
        format-2 one is marked so (store_format.FORMAT_VERSION_FINALIZED).

        Raises StoreOwnershipError if it belongs to someone else, StoreError if it
        cannot be opened (locked by another process, corrupt, another format or
        ownership generation).
        """
        path = Path(path)
        db_options, cf_options = _options(config)
        existing = _existing_column_families(path)
        families = {name: cf_options for name in existing if name != "default"}
        try:
            db = Rdict(str(path), db_options, column_families=families)
        except Exception as error:  # rocksdict raises bare Exception for RocksDB errors
            raise StoreError(f"cannot open store at {path}: {error}") from error
        store = cls(path, db, owner, window, config, cf_options, ownership, switch, finalized)
        try:
            store._load()
        except BaseException:
            store._release()
            raise
        return store

    def close(self) -> None:
        """Flush memtables (so the next open replays no WAL) and release the database."""
        if self._db is None:
            return
        try:
            self.flush()
        finally:
            self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- reads -----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def owner(self) -> StoreOwner:
        return self._owner

    @property
    def window(self) -> WindowPolicy:
        return self._window

    @property
    def input_next_offset(self) -> int | None:
        """Next input offset to consume, as last recorded (None: never recorded)."""
        return self._input_next_offset

    @property
    def output_next_offset(self) -> int | None:
        """Next output offset whose id is not yet in the store (None: never recorded)."""
        return self._output_next_offset

    @property
    def key_count(self) -> int:
        """Distinct ids in the window (exact: kept in the metadata with every write)."""
        return sum(generation.keys for generation in self._generations)

    @property
    def oldest_timestamp_ms(self) -> int | None:
        """Oldest timestamp still in the window (the effective window age), None if empty."""
        return min((g.oldest_ms for g in self._generations if g.keys), default=None)

    @property
    def generations(self) -> tuple[Generation, ...]:
        """Live generations, oldest first."""
        return tuple(self._generations)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is in the window, in order.

        Batches of at least ``PARALLEL_LOOKUP_MIN`` keys are split into
        ``StoreConfig.lookup_threads`` slices looked up at once (this thread takes one):
        rocksdict's multi-get releases the GIL while RocksDB reads, so the slices use
        every core the worker has (measured at 10M ids, 50% hits: 236k/s on one thread,
        364k/s on two).
        Smaller batches, and stores with one lookup thread, are looked up inline.
        """
        self._open_db()
        pool = self._lookup_pool
        tables = self._newest_first
        if pool is None or len(keys) < PARALLEL_LOOKUP_MIN:
            found, absent = _lookup(tables, keys, batched=False)
        else:
            *others, own = _slices(keys, self._config.lookup_threads)
            pending = [pool.submit(_lookup, tables, other) for other in others]
            own_result = _lookup(tables, own)  # this thread takes the last slice itself
            found, absent = [], []
            for slice_found, slice_absent in [*(p.result() for p in pending), own_result]:
                found += slice_found
                absent += slice_absent
        self._known_absent = frozenset(absent)
        return found

    def disk_bytes(self) -> int:
        """Bytes of live SST files and write-ahead logs."""
        db = self._open_db()
        return sum(int(file["size"]) for file in db.live_files()) + _wal_bytes(self._path)

    # --- writes ----------------------------------------------------------------------

    def record_batch(
        self,
        keys: Sequence[bytes],
        timestamp_ms: int,
        *,
        input_next_offset: int | None,
        output_next_offset: int | None,
        known_new: bool = False,
    ) -> None:
        """Add ``keys`` at ``timestamp_ms`` and set the offsets (None: unchanged), atomically.

        Keys already in the window (or repeated in ``keys``) are skipped, so replaying
        ids is harmless and ``key_count`` stays exact. Keys that the last
        ``contains_many`` reported absent are not looked up again. ``known_new``: the
        caller guarantees the keys are distinct and none is in the window (the worker,
        which looked them up itself), so none is looked up.
        """
        db = self._open_db()
        fmt.check_offset("input", input_next_offset)
        fmt.check_offset("output", output_next_offset)
        new = list(keys) if known_new else self._absent(keys)
        batch = WriteBatch(raw_mode=True)
        before = self._generations
        generations = list(before)
        created: list[int] = []
        try:
            if new:
                self._place(batch, generations, created, new, timestamp_ms)
            if input_next_offset is not None:
                batch.put(fmt.INPUT_OFFSET_KEY, fmt.encode_offset(input_next_offset))
            if output_next_offset is not None:
                batch.put(fmt.OUTPUT_OFFSET_KEY, fmt.encode_offset(output_next_offset))
            if batch.is_empty():
                return
            db.write(batch)
        except BaseException:
            for number in created:  # empty and unrecorded; open would drop them anyway
                self._detach(number)
            raise
        self._generations = generations
        self._known_absent = frozenset()
        if input_next_offset is not None:
            self._input_next_offset = input_next_offset
        if output_next_offset is not None:
            self._output_next_offset = output_next_offset
        newest = generations[-1].number if generations else None
        for number in [before[-1].number, *created] if before else created:
            if number != newest:
                # Closed: no more writes go there, so free its memtable and WAL share now.
                self._tables[number].flush(wait=False)

    def _place(
        self,
        batch: WriteBatch,
        generations: list[Generation],
        created: list[int],
        new: list[bytes],
        timestamp_ms: int,
    ) -> None:
        """Put ``new`` into ``batch``: into the newest generation, then into new ones."""
        current = generations[-1] if generations else None
        placed = place_batch(
            self._window, current, len(new), timestamp_ms, self._config.generations
        )
        start = 0
        for index, count in enumerate(placed):
            if count == 0:
                continue
            if index > 0:  # the newest generation is full or too old: open another
                generations.append(self._create_generation(timestamp_ms))
                created.append(generations[-1].number)
            target = generations[-1].with_keys(count, timestamp_ms)
            generations[-1] = target
            handle = self._handles[target.number]
            # Sorted: consecutive memtable inserts share their skip-list path (measured
            # 25% less write time for 5,000 random keys into a 32 MiB memtable).
            # (Driven from C: no Python loop iteration per key.)
            deque(
                map(batch.put, sorted(new[start : start + count]), repeat(b""), repeat(handle)), 0
            )
            start += count
            batch.put(fmt.generation_key(target.number), fmt.encode_generation(target))
        if created:
            batch.put(fmt.NEXT_GENERATION_KEY, fmt.encode_offset(self._next_generation))

    def expire(self, now_ms: int) -> int:
        """Enforce the window at ``now_ms``; drops whole generations. Returns ids removed."""
        self._open_db()
        drop = generations_to_drop(self._window, self._generations, now_ms)
        if not drop:
            return 0
        return self._drop_generations(self._generations[:drop])

    def reset(self) -> None:
        """Forget every id and both offsets (rebuild from the output topic); keeps the owner."""
        self._open_db()
        self._drop_generations(list(self._generations), forget_offsets=True)

    def flush(self) -> None:
        """Write all memtables to SST files (and sync the WAL)."""
        db = self._open_db()
        db.flush_wal(sync=True)
        db.flush(wait=True)
        for table in self._tables.values():
            table.flush(wait=True)

    def compact(self) -> None:
        """Compact every generation fully (bottommost level, zeroed sequence numbers).

        Not needed for correctness; background compaction gets there gradually.
        Blocks the caller for about a second per few million ids.
        """
        self.flush()
        options = CompactOptions()
        options.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
        for table in self._tables.values():
            table.compact_range(None, None, options)

    # --- internals -------------------------------------------------------------------

    def _open_db(self) -> Rdict:
        if self._db is None:
            raise StoreError(f"store at {self._path} is closed")
        return self._db

    def _load(self) -> None:
        db = self._open_db()
        meta = _metadata(db)
        opening = fmt.opening(
            meta, self._path, self._ownership, switch=self._may_switch, finalized=self._finalized
        )
        if opening is fmt.Opening.CREATE:
            self._write(fmt.initial_records(self._owner, self._ownership, self._finalized))
            meta = _metadata(db)
        self._switching = opening is fmt.Opening.SWITCH
        fmt.check_owner(meta, self._path, self._owner, self._ownership, switching=self._switching)
        writer = fmt.writer_record()
        if meta.get(writer[0]) != writer[1]:
            self._write([writer])
        if opening is fmt.Opening.FINALIZE:  # after the owner check: never another's store
            self._write(fmt.finalized_records())
        recorded = fmt.read_recorded(meta)
        self._input_next_offset = recorded.input_next_offset
        self._output_next_offset = recorded.output_next_offset
        self._next_generation = recorded.next_generation
        self._reconcile(db, recorded.generations)

    @property
    def switching(self) -> bool:
        """Whether this store was written before ownership and is being switched."""
        return self._switching

    def complete_switch(self) -> None:
        """Mark a store being switched as an ownership store (format 2, this worker's
        generation), durably: call it once the ids this worker owns from the other output
        partitions are in. Until then a crash leaves it a format-1 store, switched again
        at the next start."""
        if not self._switching or self._ownership is None:
            raise StoreError(f"store at {self._path} is not being switched to ownership")
        self._write(fmt.switched_records(self._ownership))
        self._switching = False

    def _write(self, puts: Iterable[fmt.Record] = (), deletes: Iterable[bytes] = ()) -> None:
        """Put and delete metadata records in one synced batch."""
        batch = WriteBatch(raw_mode=True)
        for key, value in puts:
            batch.put(key, value)
        for key in deletes:
            batch.delete(key)
        self._open_db().write(batch, self._sync)

    def _reconcile(self, db: Rdict, generations: Sequence[Generation]) -> None:
        """Match generation records and column families after a crash mid-expiry/rollover."""
        found = fmt.reconcile(generations, Rdict.list_cf(str(self._path)))
        if found.lost:
            log.warning(
                "store %s: generations %s have records but no data; forgetting %d ids",
                self._path,
                [g.number for g in found.lost],
                sum(g.keys for g in found.lost),
            )
            self._write(deletes=[fmt.generation_key(g.number) for g in found.lost])
        for name in found.orphans:
            log.info(
                "store %s: dropping column family %s left by an interrupted write", self._path, name
            )
            db.drop_column_family(name)
        for generation in found.live:
            self._attach(generation.number)
        self._generations = found.live

    def _attach(self, number: int) -> None:
        db = self._open_db()
        name = fmt.family_name(number)
        self._tables[number] = db.get_column_family(name)
        self._handles[number] = db.get_column_family_handle(name)
        self._newest_first = [self._tables[n] for n in sorted(self._tables, reverse=True)]

    def _detach(self, number: int) -> None:
        del self._tables[number], self._handles[number]
        self._newest_first = [self._tables[n] for n in sorted(self._tables, reverse=True)]

    def _create_generation(self, timestamp_ms: int) -> Generation:
        number = self._next_generation
        self._open_db().create_column_family(fmt.family_name(number), self._cf_options)
        self._next_generation = number + 1
        self._attach(number)
        return Generation.opened(number, timestamp_ms)

    def _absent(self, keys: Sequence[bytes]) -> list[bytes]:
        """``keys`` without repeats and without those already in the window."""
        unique = list(dict.fromkeys(keys))
        if not unique or not self._generations:
            return unique
        known = self._known_absent
        unknown = [key for key in unique if key not in known]
        if not unknown:
            return unique
        present = {
            key for key, hit in zip(unknown, self.contains_many(unknown), strict=True) if hit
        }
        return [key for key in unique if key not in present]

    def _drop_generations(
        self, doomed: Sequence[Generation], *, forget_offsets: bool = False
    ) -> int:
        db = self._open_db()
        deletes = [fmt.generation_key(generation.number) for generation in doomed]
        if forget_offsets:
            deletes += [fmt.INPUT_OFFSET_KEY, fmt.OUTPUT_OFFSET_KEY]
        self._write(deletes=deletes)
        numbers = {generation.number for generation in doomed}
        self._generations = [g for g in self._generations if g.number not in numbers]
        if forget_offsets:
            self._input_next_offset = None
            self._output_next_offset = None
        for number in sorted(numbers):
            # Drop before letting go of the handle: rocksdict flushes a column family
            # when its last handle goes, which would write out doomed ids.
            db.drop_column_family(fmt.family_name(number))
            self._detach(number)
        return sum(generation.keys for generation in doomed)

    def _release(self) -> None:
        db, self._db = self._db, None
        # Column family objects keep the database alive; drop them before closing it.
        self._tables.clear()
        self._handles.clear()
        self._newest_first = []
        self._known_absent = frozenset()
        if self._lookup_pool is not None:
            self._lookup_pool.shutdown()
            self._lookup_pool = None
        if db is not None:
            db.close()


def _lookup(
    tables: Sequence[Rdict], keys: Sequence[bytes], batched: bool = True
) -> tuple[list[bool], list[bytes]]:
    """(whether each key is in the generations ``tables``, the keys that are not); safe
    on any thread.

    ``Store`` passes its generations newest first (a duplicate is most likely recent);
    each is asked only for the keys not found yet. ``batched``: one multi-get per
    generation, which releases the GIL (for the lookup threads); otherwise ``map(get)``
    driven from C, ~1.5x faster for bloom misses (~0.25 us vs ~0.4 us per key and
    generation) when there is no second core to gain.
    """
    found = [False] * len(keys)
    positions: Sequence[int] = range(len(keys))
    pending = list(keys)
    for table in tables:
        if not pending:
            break
        values: list[bytes | None] = (
            _multi_get(table, pending) if batched else list(map(table.get, pending))
        )
        hits = list(map(is_not, values, repeat(None)))
        if not any(hits):
            continue
        for position in compress(positions, hits):
            found[position] = True
        misses = list(map(not_, hits))
        positions = list(compress(positions, misses))
        pending = list(compress(pending, misses))
    return found, pending


def _wal_bytes(path: Path) -> int:
    """Bytes of the write-ahead logs in the store's directory ``path``."""
    wal = 0
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name.endswith(".log"):
                with contextlib.suppress(FileNotFoundError):  # recycled meanwhile
                    wal += entry.stat().st_size
    return wal


def _multi_get(table: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """One batched get (it releases the GIL); rocksdict's stub types it as any value."""
    return cast(list[bytes | None], table.get(cast(list[str | int | float | bytes | bool], keys)))


def _slices(keys: Sequence[bytes], count: int) -> list[Sequence[bytes]]:
    """``keys`` cut into ``count`` contiguous slices of near-equal length, in order."""
    size, extra = divmod(len(keys), count)
    bounds = [index * size + min(index, extra) for index in range(count + 1)]
    return [keys[start:stop] for start, stop in pairwise(bounds)]


def wipe(path: str | Path) -> None:
    """Delete the store at ``path`` entirely, owner record included. It must be closed."""
    path = Path(path)
    if not path.exists():
        return
    try:
        if (path / "CURRENT").exists():
            Rdict.destroy(str(path), Options(raw_mode=True))  # fails while the store is open
        if path.exists():  # destroy removes the directory when nothing else is in it
            shutil.rmtree(path)
    except Exception as error:
        raise StoreError(f"cannot wipe store at {path}: {error}") from error


# --- RocksDB options -------------------------------------------------------------------


def _options(config: StoreConfig) -> tuple[Options, Options]:
    """(database options, generation column family options) for ``config``."""
    cache = Cache(config.block_cache_bytes)
    db = _family_options(config, cache, write_buffer_bytes=4 * MiB)
    db.create_if_missing(True)
    db.create_missing_column_families(True)
    db.set_max_background_jobs(2)
    db.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
    # Bound memtables across all column families, and the WAL they pin.
    db.set_db_write_buffer_size(config.write_buffer_bytes * config.max_write_buffers)
    db.set_max_total_wal_size(config.write_buffer_bytes * config.max_write_buffers * 2)
    db.set_keep_log_file_num(3)
    db.set_max_log_file_size(8 * MiB)
    generation = _family_options(config, cache, write_buffer_bytes=config.write_buffer_bytes)
    return db, generation


def _family_options(config: StoreConfig, cache: Cache, *, write_buffer_bytes: int) -> Options:
    options = Options(raw_mode=True)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    if config.bloom_bits_per_key:
        table.set_bloom_filter(config.bloom_bits_per_key, False)
    # Index and filter blocks stay with their table readers, outside the cache: with them
    # in a 64 MiB cache, data blocks evicted the multi-megabyte filters and lookups fell
    # from ~165k/s to ~20-45k/s at 10M ids (bench/HISTORY.md, "Store").
    table.set_cache_index_and_filter_blocks(False)
    # 2 KiB blocks: a hit decompresses half as much; +0.3 bytes/id, +20% lookups at 10M.
    table.set_block_size(2048)
    options.set_block_based_table_factory(table)
    # Whole-key bloom in the memtable: misses skip the skip-list walk of the newest generation.
    options.set_memtable_prefix_bloom_ratio(0.1)
    options.set_memtable_whole_key_filtering(True)
    options.set_write_buffer_size(write_buffer_bytes)
    options.set_max_write_buffer_number(config.max_write_buffers)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_bottommost_compression_type(DBCompressionType.zstd())
    options.set_level_compaction_dynamic_level_bytes(True)
    return options


def _metadata(db: Rdict) -> dict[bytes, bytes]:
    return cast(dict[bytes, bytes], dict(db.items()))


def _existing_column_families(path: Path) -> list[str]:
    if not (path / "CURRENT").exists():
        return []
    try:
        return Rdict.list_cf(str(path), Options(raw_mode=True))
    except Exception as error:
        raise StoreError(f"cannot read store at {path}: {error}") from error
