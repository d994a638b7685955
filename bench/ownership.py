"""The owner of an id, hashed in C, against the pure-Python reference, in one invocation.

    python bench/ownership.py [--batches 200] [--batch 5000] [--repeats 5]

Both compute `toPositive(murmur2(id)) % workers` for batches of 5,000 ids (UTF-8 bytes,
uuid4 text as producers send, and random 1-64 byte ids): ours is
`dedup_contract.ownership.owners` (one C call per batch), the baseline a list
comprehension over `owner_reference` (the pure-Python murmur2 every part used before).
Each measure is the best of `--repeats` runs over `--batches` batches, on one core.
Target (issue 26): <= 0.3 us an id on 5,000-id batches. Every batch's answers are
compared between the two before anything is timed.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Callable, Sequence

import results as bench_results

from dedup_contract.ownership import owner_reference, owners

TARGET_US = 0.3
WORKERS = 16


def per_id_us(
    fn: Callable[[Sequence[bytes]], object], batches: list[list[bytes]], repeats: int
) -> float:
    best = float("inf")
    ids = sum(len(b) for b in batches)
    for _ in range(repeats):
        started = time.perf_counter()
        for batch in batches:
            fn(batch)
        best = min(best, time.perf_counter() - started)
    return best / ids * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    rng = random.Random(26)
    kinds = {
        "uuid4 text": [
            [
                str(uuid.UUID(int=rng.getrandbits(128), version=4)).encode()
                for _ in range(args.batch)
            ]
            for _ in range(args.batches)
        ],
        "random 1-64 bytes": [
            [rng.randbytes(rng.randint(1, 64)) for _ in range(args.batch)]
            for _ in range(args.batches)
        ],
    }

    def ours(batch: Sequence[bytes]) -> object:
        return owners(batch, WORKERS)

    def reference(batch: Sequence[bytes]) -> object:
        return [owner_reference(i, WORKERS) for i in batch]

    met = True
    parts: list[str] = []
    print(f"owner of an id, {args.batch:,}-id batches, {WORKERS} workers (best of {args.repeats})")
    print(f"{'ids':<20}{'ours (C) us/id':>16}{'Python us/id':>16}{'speed-up':>10}  target")
    for name, batches in kinds.items():
        for batch in batches:
            assert ours(batch) == reference(batch), name
        c = per_id_us(ours, batches, args.repeats)
        py = per_id_us(reference, batches[: max(1, len(batches) // 10)], 1)
        ok = c <= TARGET_US
        met = met and ok
        verdict = "met" if ok else "MISSED"
        print(f"{name:<20}{c:>16.3f}{py:>16.3f}{py / c:>9.1f}x  <= {TARGET_US} us: {verdict}")
        reference_rate = f"Python reference {py:.3f}: " if not parts else ""
        parts.append(f"{c:.3f} us/id for {name} ({reference_rate}{py / c:.1f}x)")
    figure = bench_results.Figure(
        "ownership",
        "owner of an id",
        ", ".join(parts),
        f"<= {TARGET_US} us: {bench_results.verdict(met)}",
    )
    bench_results.record_figures(args, [figure], bench_results.bench_command("ownership.py", argv))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
