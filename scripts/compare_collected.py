"""Did a move of test files lose a test? Compares two `pytest --collect-only -q` listings
through a rename map (tab-separated old and new path per line, `#` comments).

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


def renames(table: Path) -> dict[str, str]:
    pairs = (line.split("\t") for line in table.read_text().splitlines() if line and line[0] != "#")
    return {old: new for old, new in pairs}


def renamed(test_id: str, moves: dict[str, str]) -> str:
    path, sep, rest = test_id.partition("::")
    return moves.get(path, path) + sep + rest


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    before, after, table = (Path(a) for a in argv)
    moves = renames(table)
    old, new = test_ids(before), test_ids(after)
    lost = sorted(t for t in old if renamed(t, moves) not in new)
    for test_id in lost:
        print(f"lost: {test_id}")
    added = len(new - {renamed(t, moves) for t in old})
    print(f"{len(old)} tests before, {len(new)} after ({added} new), {len(lost)} lost")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
