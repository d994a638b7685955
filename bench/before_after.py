"""Our worker's throughput at an earlier revision and at this checkout, in alternating runs
on one broker: did a change cost speed?

    python bench/before_after.py --before REV [--mode keyed,round-robin] [--records 2000000]
                                 [--pairs 3] [--tolerance 0.03]

Each revision runs its own `bench/worker_throughput.py` (ours only, `--skip-peer`) against
its own packages, so that a refactor's bench helpers are measured with the code they were
written for. The earlier revision is checked out with `git worktree` into a temporary
directory (removed afterwards); the compiled id hash is copied from this checkout, which
is refused unless its C source is the same at both revisions.

Modes:

* `keyed`: one partition keyed by id, one worker (the bench's default mode), its
  records/s line "ours : batch ...".
* `round-robin`: record n on partition n % 4, 4 workers under ownership
  (`--round-robin --round-robin-runs 1`), its records/s line "ours : run 1: ...".

One broker (the bench's own settings) serves every run, started by this script. A run
of this checkout goes first, untimed, to warm it. Then for each mode `--pairs` pairs,
in the order before/after, after/before, ... so that a drift of the machine over the
invocation favours neither. Before each run every topic of the runs before is deleted,
gone from disk, and dirty pages are written back; the topics a run needs are created
for it. Prints each pair's after/before ratio and the median
per mode; exits 1 when a median is below 1 - `--tolerance`, 2 on a usage error, 3 when a
run fails (its output is shown).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from worker_throughput import BENCH_BROKER_CONFIG

from dedup_local.kafka import KafkaBroker

ROOT: Final = Path(__file__).resolve().parents[1]
PACKAGES: Final = ("contract", "operator", "worker", "spark", "ctl", "local")
HASH_SOURCE: Final = "contract/dedup_contract/_murmur2.c"
OURS_LINE: Final = {
    "keyed": re.compile(r"^ours : batch \d+:\s+([\d,]+) records/s"),
    "round-robin": re.compile(r"^ours : run 1:\s+([\d,]+) records/s"),
}
ROUND_ROBIN_PARTITIONS: Final = 4


class RunFailed(RuntimeError):
    """A bench run exited non-zero or printed no records/s line."""


@dataclass(frozen=True)
class Revision:
    """A tree holding the project at one revision, and what to call it."""

    label: str
    tree: Path


@contextmanager
def checked_out(rev: str) -> Iterator[Path]:
    """`rev` in a temporary git worktree, with this checkout's compiled id hash."""
    same = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", rev, "--", HASH_SOURCE], check=False
    )
    if same.returncode != 0:
        raise SystemExit(f"before_after: {HASH_SOURCE} differs at {rev}; build it there instead")
    parent = Path(tempfile.mkdtemp(prefix="bench-before-"))
    tree = parent / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--quiet", "--detach", str(tree), rev],
        check=True,
    )
    try:
        for built in (ROOT / "contract/dedup_contract").glob("_murmur2*.so"):
            shutil.copy2(built, tree / "contract/dedup_contract" / built.name)
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
        )
        shutil.rmtree(parent, ignore_errors=True)


def clear_topics(broker: KafkaBroker, timeout_s: float = 120.0) -> None:
    """Every topic of the runs before deleted and gone from disk; dirty pages written back."""
    admin = broker.admin()
    topics = [t for t in admin.list_topics(timeout=30).topics if not t.startswith("__")]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
    deadline = time.monotonic() + timeout_s
    while any(t in admin.list_topics(timeout=30).topics for t in topics) or any(
        p.name.endswith("-delete") for p in broker.log_dir.iterdir()
    ):
        if time.monotonic() > deadline:
            raise RunFailed(f"deleted topics still present after {timeout_s:.0f} s")
        time.sleep(0.2)
    os.sync()


def prepare_topics(broker: KafkaBroker, mode: str, records: int) -> None:
    """The topics a run needs (the broker creates none on its own; with `--bootstrap` the
    bench creates none either)."""
    if mode == "keyed":
        for suffix in ("in", "out", "dlq"):
            broker.create_topic(f"ours-{records}-{suffix}", 1)
    if mode == "round-robin":
        for topic in (f"rr-{records}-in", f"rr-{records}-ours1-out", f"rr-{records}-ours1-owned"):
            broker.create_topic(topic, ROUND_ROBIN_PARTITIONS)
        broker.create_topic(f"rr-{records}-ours1-dlq", 1)


def bench_command(tree: Path, bootstrap: str, mode: str, records: int) -> list[str]:
    command = [
        sys.executable,
        str(tree / "bench/worker_throughput.py"),
        "--bootstrap",
        bootstrap,
        "--skip-peer",
        "--no-warm-up",
        "--records",
        str(records),
    ]
    if mode == "round-robin":
        command += ["--round-robin", "--round-robin-runs", "1"]
    return command


def run_once(broker: KafkaBroker, revision: Revision, mode: str, records: int) -> float:
    """One run of `revision`'s bench; its records/s."""
    clear_topics(broker)
    prepare_topics(broker, mode, records)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(revision.tree / p) for p in PACKAGES)}
    done = subprocess.run(
        bench_command(revision.tree, broker.bootstrap, mode, records),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    rates = [m.group(1) for line in done.stdout.splitlines() if (m := OURS_LINE[mode].match(line))]
    if done.returncode != 0 or not rates:
        raise RunFailed(
            f"{revision.label} ({mode}) exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    rate = float(rates[0].replace(",", ""))
    print(f"  {mode:<11} {revision.label:<6} {rate:>10,.0f} records/s", flush=True)
    return rate


def compare(
    broker: KafkaBroker,
    before: Revision,
    after: Revision,
    modes: Sequence[str],
    records: int,
    pairs: int,
) -> dict[str, list[float]]:
    """Per mode, each pair's after/before ratio, the pair's order alternating."""
    print("[bench] warm-up run of this checkout, untimed", flush=True)
    run_once(broker, after, "keyed", min(records, 500_000))
    ratios: dict[str, list[float]] = {}
    for mode in modes:
        for pair in range(pairs):
            order = (before, after) if pair % 2 == 0 else (after, before)
            rates = {
                revision.label: run_once(broker, revision, mode, records) for revision in order
            }
            ratio = rates[after.label] / rates[before.label]
            print(f"  {mode:<11} pair {pair + 1}: after/before {ratio:.3f}", flush=True)
            ratios.setdefault(mode, []).append(ratio)
    return ratios


def mode_list(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    if unknown := [m for m in modes if m not in OURS_LINE]:
        raise argparse.ArgumentTypeError(f"unknown modes {unknown}; known: {', '.join(OURS_LINE)}")
    return modes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="the earlier git revision")
    parser.add_argument("--mode", type=mode_list, default=list(OURS_LINE), help="keyed,round-robin")
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs per mode")
    parser.add_argument("--tolerance", type=float, default=0.03, help="allowed slowdown")
    args = parser.parse_args(argv)
    print(
        f"[bench] before {args.before} vs this checkout: {', '.join(args.mode)}, "
        f"{args.records:,} records, {args.pairs} pairs each, {os.cpu_count()} CPUs",
        flush=True,
    )
    try:
        with checked_out(args.before) as tree, KafkaBroker(config=BENCH_BROKER_CONFIG) as broker:
            ratios = compare(
                broker,
                Revision("before", tree),
                Revision("after", ROOT),
                args.mode,
                args.records,
                args.pairs,
            )
    except RunFailed as failed:
        print(f"ERROR: {failed}", file=sys.stderr)
        return 3
    worst = 1.0
    for mode, values in ratios.items():
        median = statistics.median(values)
        worst = min(worst, median)
        print(
            f"{mode}: after/before median {median:.3f} over {len(values)} pairs "
            f"({', '.join(f'{v:.3f}' for v in values)})"
        )
    verdict = "within" if worst >= 1 - args.tolerance else "NOT within"
    print(f"verdict: {verdict} {args.tolerance:.0%} of {args.before}")
    return 0 if worst >= 1 - args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
