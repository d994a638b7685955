"""The benches' latest figures: results.json, and README.md's table generated from it.

    python bench/results.py --write    # re-render README.md's table from results.json
    python bench/results.py --check    # exit 1 if README.md's table is stale

results.json holds one row per figure (key, bench, figure, target, command, date). A
bench run with `--record` replaces the rows it produced, by key, with today's date (UTC)
and the command that ran, then re-renders the table between README.md's
`<!-- results:begin -->` and `<!-- results:end -->` markers, so that the table is never
written by hand. `--results PATH` records into another results file (and the README.md
beside it, if there is one): for trying the recording path without touching these.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
README = HERE / "README.md"
BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
GENERATED = "<!-- generated from results.json (bench/results.py); do not edit by hand -->"
HEADER = ("| bench | figure | target | command | date |", "|---|---|---|---|---|")
SAME_COMMAND = "the same"
"""What the command column shows when a row's command is the row above's."""


@dataclass(frozen=True)
class Row:
    """One figure of the table, as results.json holds it."""

    key: str
    bench: str
    figure: str
    target: str
    command: str
    date: str


class Figure(NamedTuple):
    """What a bench measured for one row; `record` adds the command and the date."""

    key: str
    bench: str
    figure: str
    target: str


def load(path: Path = RESULTS) -> list[Row]:
    return [Row(**entry) for entry in json.loads(path.read_text())]


def save(rows: Sequence[Row], path: Path = RESULTS) -> None:
    text = json.dumps([asdict(row) for row in rows], indent=2, ensure_ascii=False)
    path.write_text(text + "\n")


def render(rows: Sequence[Row]) -> str:
    """The markdown table of ``rows``; a command equal to the row above's reads "the same"."""
    lines = list(HEADER)
    previous = None
    for row in rows:
        command = SAME_COMMAND if row.command == previous else f"`{row.command}`"
        previous = row.command
        lines.append(f"| {row.bench} | {row.figure} | {row.target} | {command} | {row.date} |")
    return "\n".join(lines)


def _block(text: str) -> tuple[int, int]:
    """Where the generated block's inside starts and ends in a README's ``text``."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return begin + len(BEGIN), end


def table_in(text: str) -> str:
    """The table a README's ``text`` holds between the markers (without the comment)."""
    start, end = _block(text)
    inside = text[start:end].strip("\n")
    return inside.removeprefix(GENERATED).strip("\n")


def with_table(text: str, rows: Sequence[Row]) -> str:
    """A README's ``text`` with the generated block holding ``render(rows)``."""
    start, end = _block(text)
    return f"{text[:start]}\n{GENERATED}\n{render(rows)}\n{text[end:]}"


def write_readme(rows: Sequence[Row], readme: Path = README) -> None:
    readme.write_text(with_table(readme.read_text(), rows))


def bench_command(script: str, argv: Sequence[str] | None = None) -> str:
    """``python bench/<script> <args>`` as run (``argv``: default sys.argv[1:]), without
    the recording options, which change where figures go and not what is measured."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--record" or arg.startswith("--results="):
            continue
        elif arg == "--results":
            skip = True
        else:
            kept.append(arg)
    return " ".join([f"python bench/{script}", *(shlex.quote(arg) for arg in kept)])


def record(
    key: str,
    bench: str,
    figure: str,
    target: str,
    results_path: Path = RESULTS,
    *,
    command: str | None = None,
    today: str | None = None,
) -> Row:
    """Replace the row ``key`` in ``results_path`` (or add it after the last row of the
    same bench file) with today's date (UTC) and ``command`` (default: this process's,
    from sys.argv), then re-render the README.md beside ``results_path``, if any."""
    row = Row(
        key,
        bench,
        figure,
        target,
        command or bench_command(Path(sys.argv[0]).name),
        today or datetime.now(UTC).date().isoformat(),
    )
    rows = load(results_path)
    keys = [r.key for r in rows]
    if key in keys:
        rows[keys.index(key)] = row
    else:
        family = key.split(".")[0]
        same = [i for i, k in enumerate(keys) if k.split(".")[0] == family]
        rows.insert(same[-1] + 1 if same else len(rows), row)
    save(rows, results_path)
    readme = results_path.with_name(README.name)
    if readme.exists():
        write_readme(rows, readme)
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A bench's `--record` and `--results` options."""
    parser.add_argument(
        "--record",
        action="store_true",
        help="write this run's figures into bench/results.json and README.md's table",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="with --record: the results file (default bench/results.json; the README.md "
        "beside it, if any, is re-rendered)",
    )


def record_figures(
    args: argparse.Namespace, figures: Sequence[Figure], command: str | None = None
) -> None:
    """`record` each of ``figures`` if the bench was run with `--record`."""
    if not args.record:
        return
    for figure in figures:
        row = record(*figure, results_path=args.results, command=command)
        print(f"[bench] recorded {row.key} in {args.results}: {row.figure}", flush=True)


def verdict(met: bool) -> str:
    """A target's verdict as the table writes it."""
    return "met" if met else "**missed**"


def count_label(count: int) -> str:
    """10000000 -> "10M", 2500000 -> "2.5M", 500000 -> "500k", 1234 -> "1,234"."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if count >= size and count % (size // 10) == 0:
            return f"{count / size:,g}{suffix}"
    return f"{count:,}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="re-render README.md's table")
    action.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    rows = load()
    if args.write:
        write_readme(rows)
        return 0
    if README.read_text() != with_table(README.read_text(), rows):
        print(
            f"{README} is stale against {RESULTS}: run `python bench/results.py --write`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
