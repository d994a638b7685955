"""bench/README.md's results table is generated from bench/results.json, whose rows each
have a key, the command that produced them and the date; `record` replaces one row by key
(no bench runs here)."""

from __future__ import annotations

import datetime
import shutil
import sys
from pathlib import Path

import pytest

from dedup_local.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import results


def test_the_readme_table_is_rendered_from_results_json() -> None:
    table = results.table_in(results.README.read_text())
    assert table == results.render(results.load()), (
        "bench/README.md's results table is stale: run `python bench/results.py --write`"
    )
    assert results.main(["--check"]) == 0


def test_every_row_has_a_key_a_bench_command_and_an_iso_date() -> None:
    rows = results.load()
    keys = [row.key for row in rows]
    assert all(keys) and len(set(keys)) == len(keys), keys
    for row in rows:
        assert row.bench and row.figure and row.target, row.key
        assert row.command.startswith("python bench/"), row.key
        script = row.command.split()[1]
        assert (REPO_ROOT / script).is_file(), f"{row.key}: {script}"
        assert datetime.date.fromisoformat(row.date).isoformat() == row.date, row.key


def copy_of_the_results(tmp_path: Path) -> Path:
    path = tmp_path / "results.json"
    shutil.copy(results.RESULTS, path)
    shutil.copy(results.README, tmp_path / "README.md")
    return path


def test_record_replaces_a_row_by_key_and_keeps_the_others(tmp_path: Path) -> None:
    path = copy_of_the_results(tmp_path)
    before = results.load(path)
    key = before[1].key
    row = results.record(
        key,
        "a bench",
        "1 figure",
        ">= 1: met",
        path,
        command="python bench/store.py --keys 5000",
        today="2027-01-02",
    )
    after = results.load(path)
    assert (
        after[1]
        == row
        == results.Row(
            key,
            "a bench",
            "1 figure",
            ">= 1: met",
            "python bench/store.py --keys 5000",
            "2027-01-02",
        )
    )
    assert after[:1] + after[2:] == before[:1] + before[2:]
    readme = (tmp_path / "README.md").read_text()
    assert results.table_in(readme) == results.render(after)
    assert "| a bench | 1 figure | >= 1: met | `python bench/store.py --keys 5000` |" in readme


def test_record_adds_a_new_key_after_its_bench_file_with_the_command_and_today(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = copy_of_the_results(tmp_path)
    before = results.load(path)
    argv = ["/somewhere/bench/restart.py", "--keys", "1000000", "--record", "--results", str(path)]
    monkeypatch.setattr(sys, "argv", argv)
    results.record("restart.1M", "restart, 1M ids", "1 s", "< 5 s: met", path)
    after = results.load(path)
    assert len(after) == len(before) + 1
    at = [row.key for row in after].index("restart.1M")
    assert after[at - 1].key.startswith("restart.")
    assert after[at].command == "python bench/restart.py --keys 1000000"
    assert after[at].date == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert [row for row in after if row.key != "restart.1M"] == before


def test_render_writes_the_same_for_a_command_repeated_from_the_row_above() -> None:
    rows = [
        results.Row("a.1", "a", "1", "none", "python bench/a.py", "2027-01-01"),
        results.Row("a.2", "a", "2", "none", "python bench/a.py", "2027-01-01"),
        results.Row("b", "b", "3", "none", "python bench/b.py --x 'y[2]'", "2027-01-01"),
    ]
    assert results.render(rows).splitlines()[2:] == [
        "| a | 1 | none | `python bench/a.py` | 2027-01-01 |",
        "| a | 2 | none | the same | 2027-01-01 |",
        "| b | 3 | none | `python bench/b.py --x 'y[2]'` | 2027-01-01 |",
    ]


def test_the_recorded_command_leaves_out_the_recording_options() -> None:
    argv = ["--records", "2000000", "--record", "--results", "/tmp/r.json", "--masters", "local[2]"]
    assert (
        results.bench_command("audit.py", argv)
        == "python bench/audit.py --records 2000000 --masters 'local[2]'"
    )
    assert results.bench_command("store.py", ["--results=/tmp/r.json"]) == "python bench/store.py"


def test_count_labels() -> None:
    counts = (10_000_000, 100_000_000, 500_000, 2_500_000, 1_250_000_000, 1_234)
    labels = ["10M", "100M", "500k", "2.5M", "1,250M", "1,234"]
    assert [results.count_label(n) for n in counts] == labels
