"""The lost-test check that guards every test move and rename: a test id counts as kept when
every id the rename map names for it is collected after the change."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))

import compare_collected


def listing(tmp_path: Path, name: str, ids: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(ids) + f"\n\n{len(ids)} tests collected in 0.1s\n")
    return path


def run(tmp_path: Path, before: list[str], after: list[str], table: str) -> int:
    (tmp_path / "map.tsv").write_text(table)
    paths = [listing(tmp_path, "b.txt", before), listing(tmp_path, "a.txt", after)]
    return compare_collected.main([str(p) for p in paths] + [str(tmp_path / "map.tsv")])


def test_a_moved_file_keeps_its_tests(tmp_path: Path) -> None:
    table = "# moves\ntests/old.py\ttests/new/old.py\n"
    assert run(tmp_path, ["tests/old.py::test_a"], ["tests/new/old.py::test_a"], table) == 0


def test_a_test_missing_after_is_lost(tmp_path: Path) -> None:
    assert (
        run(tmp_path, ["tests/x.py::test_a", "tests/x.py::test_b"], ["tests/x.py::test_a"], "") == 1
    )


def test_a_renamed_test_is_kept_only_if_every_successor_is_collected(tmp_path: Path) -> None:
    table = "tests/x.py::test_a[e0]\ttests/x.py::test_a[e0-one]\ttests/x.py::test_a[e0-two]\n"
    before = ["tests/x.py::test_a[e0]"]
    assert (
        run(tmp_path, before, ["tests/x.py::test_a[e0-one]", "tests/x.py::test_a[e0-two]"], table)
        == 0
    )
    assert run(tmp_path, before, ["tests/x.py::test_a[e0-one]"], table) == 1
