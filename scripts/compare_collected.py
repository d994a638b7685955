"""Did a move of test files lose a test? Compares two `pytest --collect-only -q` listings
through a rename map (tab-separated, `#` comments). A row maps an old file path to its
new one, or an old test id (`path::name[params]`) to the one or more ids (further tab-separated
columns) that now test what it tested: a renamed or re-parametrized test.

    pytest --collect-only -q tests > before.txt   # at the commit before the move
    pytest --collect-only -q tests > after.txt    # after it
    python scripts/compare_collected.py before.txt after.txt tests/unit/RENAMES.tsv

Prints every test of `before` that is not in `after` once renamed, and exits 1 if any;
tests only in `after` (new ones) are counted, not an error."""

from __future__ import annotations

import sys
from pathlib import Path


def test_ids(listing: Path) -> set[str]:
    return {line.strip() for line in listing.read_text().splitlines() if "::" in line}


def rows(table: Path) -> list[list[str]]:
    return [line.split("\t") for line in table.read_text().splitlines() if line and line[0] != "#"]


def file_moves(table: Path) -> dict[str, str]:
    return {row[0]: row[1] for row in rows(table) if "::" not in row[0]}


def test_renames(table: Path) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in rows(table) if "::" in row[0]}


def renamed(test_id: str, moves: dict[str, str]) -> str:
    path, sep, rest = test_id.partition("::")
    return moves.get(path, path) + sep + rest


def successors(test_id: str, moves: dict[str, str], tests: dict[str, list[str]]) -> list[str]:
    """The ids in `after` that carry `test_id` on: through a test rename, else a file move."""
    return tests.get(test_id) or [renamed(test_id, moves)]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    before, after, table = (Path(a) for a in argv)
    moves, tests = file_moves(table), test_renames(table)
    old, new = test_ids(before), test_ids(after)
    lost = sorted(t for t in old if not all(s in new for s in successors(t, moves, tests)))
    for test_id in lost:
        print(f"lost: {test_id}")
    added = len(new - {s for t in old for s in successors(t, moves, tests)})
    print(f"{len(old)} tests before, {len(new)} after ({added} new), {len(lost)} lost")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
