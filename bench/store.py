"""The RocksDB window store against the straightforward design, in one invocation.

    python bench/store.py [--keys 10000000] [--huge] [--skip-baseline] [--dir DIR]

Ours: ``dedup_contract.store.Store`` -- generations as column families, bloom filters,
shared bounded block cache, zstd at the bottommost level; expiry drops a generation.
Baseline: the straightforward design on rocksdict with default options -- one key per
id (value: its sequence number) plus a sequence index (sequence number -> id) in a
second column family; expiry walks the index and deletes both entries.

Both get the same ids (``id_key`` of ``bench-<n>``), written in batches of 5,000, then
flushed and fully compacted. Measured: inserts/s (ours both as the worker calls it,
after ``contains_many``, and alone, as catch-up does, where it checks presence
itself), on-disk bytes per id, reopen time (open until the first batched lookup has
answered), batched lookups/s (5,000 per batch, after a short warm-up; half hits and
half misses, then 1% hits as in real traffic), the time to expire the oldest 1/8 of
the ids, and lookups/s right after that expiry. Targets at 10M ids: <= 20 bytes/id,
>= 300,000 lookups/s (half hits), reopen < 5 s.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import resource
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import results as bench_results
from rocksdict import (
    BottommostLevelCompaction,
    CompactOptions,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
)

from dedup_contract.ids import id_key
from dedup_contract.store import MiB, Store, StoreConfig, StoreOwner
from dedup_contract.window import WindowPolicy

BATCH = 5_000
OWNER = StoreOwner("bench", "store", 0)
SEQ = struct.Struct(">Q")
TARGET_BYTES_PER_KEY = 20.0
TARGET_LOOKUPS_PER_S = 300_000
TARGET_REOPEN_S = 5.0

Batch = list[bytes]


@dataclass
class Result:
    inserts_per_s: float = 0.0
    catch_up_inserts_per_s: float = 0.0
    bytes_per_key: float = 0.0
    reopen_s: float = 0.0
    lookups_per_s: float = 0.0
    lookups_per_cpu_s: float = 0.0
    realistic_lookups_per_s: float = 0.0
    expire_s: float = 0.0
    lookups_after_expiry_per_s: float = 0.0
    peak_rss_mib: float = 0.0


def ids(start: int, stop: int) -> Batch:
    return [id_key(f"bench-{n}") for n in range(start, stop)]


@dataclass(frozen=True)
class Workload:
    mixed: list[Batch]  # half hits: the stress target
    realistic: list[Batch]  # 1% hits: duplicates are rare in real traffic
    warmup: int


def lookup_batches(keys: int, batches: int, seed: int, hit_share: float) -> list[Batch]:
    """Batches of BATCH ids: inserted ids (hits) and never inserted ones (misses), shuffled."""
    rng = random.Random(seed)
    out = []
    hit_count = round(BATCH * hit_share)
    for _ in range(batches):
        hits = [id_key(f"bench-{rng.randrange(keys)}") for _ in range(hit_count)]
        misses = [id_key(f"miss-{rng.randrange(1 << 62)}") for _ in range(BATCH - hit_count)]
        batch = hits + misses
        rng.shuffle(batch)
        out.append(batch)
    return out


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def directory_bytes(path: Path) -> int:
    return sum(
        entry.stat().st_size for entry in os.scandir(path) if entry.name.endswith((".sst", ".log"))
    )


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_lookups(
    lookup: Callable[[Batch], Sequence[bool]], batches: list[Batch], warmup: int
) -> tuple[float, float]:
    """(lookups per wall-clock second, lookups per CPU second of this process)."""
    for batch in batches[:warmup]:
        lookup(batch)
    started, cpu = time.perf_counter(), time.process_time()
    for batch in batches[warmup:]:
        lookup(batch)
    count = BATCH * (len(batches) - warmup)
    return rate(count, time.perf_counter() - started), rate(count, time.process_time() - cpu)


def progress(message: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# --- ours ------------------------------------------------------------------------------


class Lookups(Protocol):
    def contains_many(self, keys: Batch) -> list[bool]: ...


L = TypeVar("L", bound=Lookups)


def measure_reads(label: str, reopen: Callable[[], L], work: Workload, result: Result) -> L:
    """Reopen (timed until the first batched lookup answered), then lookups/s."""
    began = time.perf_counter()
    store = reopen()
    first = store.contains_many(work.mixed[0])
    result.reopen_s = time.perf_counter() - began
    assert sum(first) == BATCH // 2, sum(first)
    progress(f"{label}: lookups")
    result.lookups_per_s, result.lookups_per_cpu_s = timed_lookups(
        store.contains_many, work.mixed, work.warmup
    )
    result.realistic_lookups_per_s, _ = timed_lookups(
        store.contains_many, work.realistic, work.warmup
    )
    return store


def bench_ours(path: Path, keys: int, work: Workload, config: StoreConfig) -> Result:
    result = Result()
    window = WindowPolicy(max_keys=keys)
    worker_spent = catch_up_spent = 0.0
    worker_ids = catch_up_ids = 0
    with Store.open(path, OWNER, window, config) as store:
        for number, start in enumerate(range(0, keys, BATCH)):
            batch = ids(start, min(keys, start + BATCH))
            worker_path = number % 2 == 0
            if worker_path:  # as the worker loop does: look up first (untimed), record the new
                batch = [
                    key
                    for key, hit in zip(batch, store.contains_many(batch), strict=True)
                    if not hit
                ]
            began = time.perf_counter()
            store.record_batch(
                batch, number, input_next_offset=start + BATCH, output_next_offset=None
            )
            spent = time.perf_counter() - began
            if worker_path:
                worker_spent += spent
                worker_ids += len(batch)
            else:  # catch-up from the output topic: record_batch checks presence itself
                catch_up_spent += spent
                catch_up_ids += len(batch)
            if start and start % 1_000_000 == 0:
                progress(f"ours: {start:,} ids")
        result.inserts_per_s = rate(worker_ids, worker_spent)
        result.catch_up_inserts_per_s = rate(catch_up_ids, catch_up_spent)
        progress("ours: flush + compact")
        store.compact()
        assert store.key_count == keys, (store.key_count, keys)
        result.bytes_per_key = store.disk_bytes() / keys
    gc.collect()
    store = measure_reads("ours", lambda: Store.open(path, OWNER, window, config), work, result)
    store.close()
    # Expire the oldest eighth: reopen with a window one eighth smaller.
    store = Store.open(path, OWNER, WindowPolicy(max_keys=keys - keys // 8), config)
    began = time.perf_counter()
    expired = store.expire(0)
    result.expire_s = time.perf_counter() - began
    assert expired >= keys // 8, expired
    result.lookups_after_expiry_per_s, _ = timed_lookups(
        store.contains_many, work.mixed, work.warmup
    )
    store.close()
    result.peak_rss_mib = peak_rss_mib()
    return result


# --- baseline ------------------------------------------------------------------------------


class Baseline:
    """Id -> sequence number, plus sequence number -> id; rocksdict defaults otherwise."""

    def __init__(self, path: Path) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        self.db = Rdict(str(path), options, column_families={"seq": Options(raw_mode=True)})
        self.ids = self.db.get_column_family_handle("default")
        self.seq_handle = self.db.get_column_family_handle("seq")
        self.seq = self.db.get_column_family("seq")
        self.next_seq = 0

    def insert(self, keys: Batch) -> None:
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            seq = SEQ.pack(self.next_seq)
            self.next_seq += 1
            batch.put(key, seq, self.ids)
            batch.put(seq, key, self.seq_handle)
        self.db.write(batch)

    def contains_many(self, keys: Batch) -> list[bool]:
        values = cast(list[bytes | None], self.db.get(list[Any](keys)))
        return [value is not None for value in values]

    def expire_oldest(self, count: int) -> None:
        options = ReadOptions()
        options.set_iterate_upper_bound(SEQ.pack(count))
        batch = WriteBatch(raw_mode=True)
        for seq, key in self.seq.items(read_opt=options):
            batch.delete(key, self.ids)
            batch.delete(seq, self.seq_handle)
            if len(batch) >= 2 * BATCH:
                self.db.write(batch)
                batch = WriteBatch(raw_mode=True)
        if not batch.is_empty():
            self.db.write(batch)

    def compact(self) -> None:
        self.db.flush()
        self.seq.flush()
        options = CompactOptions()
        options.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
        self.db.compact_range(None, None, options)
        self.seq.compact_range(None, None, options)

    def close(self) -> None:
        del self.ids, self.seq_handle, self.seq
        self.db.close()


def bench_baseline(path: Path, keys: int, work: Workload) -> Result:
    result = Result()
    base = Baseline(path)
    spent = 0.0
    for start in range(0, keys, BATCH):
        batch = ids(start, min(keys, start + BATCH))
        began = time.perf_counter()
        base.insert(batch)
        spent += time.perf_counter() - began
        if start and start % 1_000_000 == 0:
            progress(f"baseline: {start:,} ids")
    result.inserts_per_s = rate(keys, spent)
    progress("baseline: flush + compact")
    base.compact()
    base.close()
    gc.collect()
    result.bytes_per_key = directory_bytes(path) / keys
    base = measure_reads("baseline", lambda: Baseline(path), work, result)
    began = time.perf_counter()
    base.expire_oldest(keys // 8)
    result.expire_s = time.perf_counter() - began
    result.lookups_after_expiry_per_s, _ = timed_lookups(
        base.contains_many, work.mixed, work.warmup
    )
    base.close()
    return result


# --- report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    fmt: str
    value: Callable[[Result], float]
    target: str = ""
    met: Callable[[float], bool] | None = None


ROWS = (
    Row(
        "inserts/s (record_batch after contains_many, as the worker)",
        "{:,.0f}",
        lambda r: r.inserts_per_s,
    ),
    Row(
        "inserts/s (record_batch alone, as catch-up)", "{:,.0f}", lambda r: r.catch_up_inserts_per_s
    ),
    Row(
        "lookups/s (contains_many, 50% hits)",
        "{:,.0f}",
        lambda r: r.lookups_per_s,
        f">= {TARGET_LOOKUPS_PER_S:,}",
        lambda v: v >= TARGET_LOOKUPS_PER_S,
    ),
    Row("  the same, per CPU-second of this process", "{:,.0f}", lambda r: r.lookups_per_cpu_s),
    Row("lookups/s (contains_many, 1% hits)", "{:,.0f}", lambda r: r.realistic_lookups_per_s),
    Row(
        "bytes/id on disk (flushed, compacted)",
        "{:.2f}",
        lambda r: r.bytes_per_key,
        f"<= {TARGET_BYTES_PER_KEY:g}",
        lambda v: v <= TARGET_BYTES_PER_KEY,
    ),
    Row(
        "reopen to first lookup (s)",
        "{:.2f}",
        lambda r: r.reopen_s,
        f"< {TARGET_REOPEN_S:g}",
        lambda v: v < TARGET_REOPEN_S,
    ),
    Row("expire the oldest 1/8 (s)", "{:.3f}", lambda r: r.expire_s),
    Row("lookups/s right after that expiry", "{:,.0f}", lambda r: r.lookups_after_expiry_per_s),
)


def report(
    keys: int,
    config: StoreConfig,
    ours: Result,
    baseline: Result | None,
    command: str,
    load: tuple[float, float],
) -> str:
    lines = [
        f"$ {command}",
        "",
        f"{keys:,} ids; {os.cpu_count()} CPUs; Python {platform.python_version()}; "
        f"rocksdict {version('rocksdict')}; load average {load[0]:.1f} at start, "
        f"{load[1]:.1f} at end; peak RSS {ours.peak_rss_mib:,.0f} MiB after ours",
        f"ours: {config.generations} generations, block cache {config.block_cache_bytes // MiB} MiB, "
        f"write buffers {config.max_write_buffers} x {config.write_buffer_bytes // MiB} MiB, "
        f"bloom {config.bloom_bits_per_key} bits/id, {config.lookup_threads} lookup thread(s)",
        "",
        "| metric | ours (generations) | baseline (id + sequence index) | ours / baseline | target |",
        "|---|---:|---:|---:|---|",
    ]
    for row in ROWS:
        mine = row.value(ours)
        theirs = None if baseline is None else row.value(baseline) or None  # 0: not measured
        shown = "" if theirs is None else row.fmt.format(theirs)
        ratio = f"{mine / theirs:.2f}x" if theirs else ""
        verdict = ""
        if row.met is not None:
            verdict = " met" if row.met(mine) else " **missed**"
        lines.append(
            f"| {row.name} | {row.fmt.format(mine)} | {shown} | {ratio} | {row.target}{verdict} |"
        )
    return "\n".join(lines)


def figures(keys: int, ours: Result, baseline: Result | None) -> list[bench_results.Figure]:
    """The results table's rows of this run: with the baseline, lookups and disk; without
    it, one row of ours alone."""
    label = bench_results.count_label(keys)
    bench = f"store, {label} ids"
    size_targets = (
        f"<= {TARGET_BYTES_PER_KEY:g} bytes/id: "
        f"{bench_results.verdict(ours.bytes_per_key <= TARGET_BYTES_PER_KEY)}; "
        f"reopen < {TARGET_REOPEN_S:g} s: {bench_results.verdict(ours.reopen_s < TARGET_REOPEN_S)}"
    )
    if baseline is None:
        return [
            bench_results.Figure(
                f"store.{label}",
                bench,
                f"lookups {ours.lookups_per_s:,.0f}/s at 50% hits, "
                f"{ours.realistic_lookups_per_s:,.0f}/s at 1% hits; "
                f"{ours.bytes_per_key:.2f} bytes/id; reopen {ours.reopen_s:.2f} s; "
                f"inserts {ours.inserts_per_s:,.0f}/s",
                size_targets,
            )
        ]
    return [
        bench_results.Figure(
            f"store.{label}.lookups",
            bench,
            f"lookups {ours.lookups_per_s:,.0f}/s at 50% hits (baseline "
            f"{baseline.lookups_per_s:,.0f}/s: "
            f"{ours.lookups_per_s / baseline.lookups_per_s:.2f}x), "
            f"{ours.realistic_lookups_per_s:,.0f}/s at 1% hits "
            f"({ours.realistic_lookups_per_s / baseline.realistic_lookups_per_s:.2f}x)",
            f">= {TARGET_LOOKUPS_PER_S:,}/s at 50% hits: "
            f"{bench_results.verdict(ours.lookups_per_s >= TARGET_LOOKUPS_PER_S)}",
        ),
        bench_results.Figure(
            f"store.{label}.disk",
            bench,
            f"{ours.bytes_per_key:.2f} bytes/id on disk (baseline {baseline.bytes_per_key:.2f}); "
            f"reopen to first lookup {ours.reopen_s:.2f} s; inserts {ours.inserts_per_s:,.0f}/s "
            f"({ours.inserts_per_s / baseline.inserts_per_s:.2f}x); expiring the oldest 1/8 "
            f"{ours.expire_s:.3f} s (baseline {baseline.expire_s:.3f} s)",
            size_targets,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=10_000_000, help="ids to insert (default 10M)")
    parser.add_argument(
        "--huge", action="store_true", help="100M ids (needs ~10 GB of disk and time)"
    )
    parser.add_argument(
        "--lookup-batches", type=int, default=220, help="batches of 5,000 lookups (default 220)"
    )
    parser.add_argument(
        "--warmup", type=int, default=20, help="of those, untimed warm-up batches (default 20)"
    )
    parser.add_argument("--skip-baseline", action="store_true", help="only measure ours")
    parser.add_argument(
        "--dir", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )
    parser.add_argument("--generations", type=int, default=StoreConfig().generations)
    parser.add_argument(
        "--block-cache-mib",
        type=int,
        default=StoreConfig().block_cache_bytes // MiB,
        help="block cache of ours (default: StoreConfig's)",
    )
    parser.add_argument(
        "--lookup-threads",
        type=int,
        default=StoreConfig().lookup_threads,
        help="threads sharing each batched lookup of ours (default: StoreConfig's)",
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    keys = 100_000_000 if args.huge else args.keys
    if keys < BATCH or args.lookup_batches <= args.warmup:
        parser.error(f"need at least {BATCH} ids and more lookup batches than warm-up batches")
    command = "python bench/store.py " + " ".join(argv if argv is not None else sys.argv[1:])
    scratch = Path(tempfile.mkdtemp(prefix="dedup-store-bench-", dir=args.dir))
    load_start = os.getloadavg()[0]
    try:
        work = Workload(
            lookup_batches(keys, args.lookup_batches, seed=11, hit_share=0.5),
            lookup_batches(keys, args.lookup_batches, seed=13, hit_share=0.01),
            args.warmup,
        )
        config = StoreConfig(
            generations=args.generations,
            block_cache_bytes=args.block_cache_mib * MiB,
            lookup_threads=args.lookup_threads,
        )
        ours = bench_ours(scratch / "ours", keys, work, config)
        shutil.rmtree(scratch / "ours")
        baseline = None if args.skip_baseline else bench_baseline(scratch / "baseline", keys, work)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(report(keys, config, ours, baseline, command.strip(), (load_start, os.getloadavg()[0])))
    bench_results.record_figures(
        args, figures(keys, ours, baseline), bench_results.bench_command("store.py", argv)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
