"""docs/crd.md is the page scripts/crd_reference.py renders from crds/*.yaml: regenerated in
memory and compared, so a CRD change without a refreshed page fails here."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import crd_reference

ROOT = crd_reference.REPO_ROOT


def test_the_page_is_the_one_the_crd_renders() -> None:
    page = ROOT / "docs" / "crd.md"
    assert page.is_file(), f"docs/crd.md is missing; run {crd_reference.REFRESH}"
    expected = crd_reference.render(crd_reference.load_crds())
    assert page.read_text() == expected, (
        f"docs/crd.md is stale (the CRD changed); run {crd_reference.REFRESH}"
    )


def property_paths(schema: Mapping[str, Any], path: str) -> Iterator[str]:
    """Every named property below `path`, found by a plain walk of the schema."""
    for name, child in (schema.get("properties") or {}).items():
        yield f"{path}.{name}"
        yield from property_paths(child, f"{path}.{name}")
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from property_paths(items, f"{path}[]")


def test_every_field_of_the_schema_has_a_row() -> None:
    page = crd_reference.render(crd_reference.load_crds())
    (crd,) = crd_reference.load_crds()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = [
        p for part in ("spec", "status") for p in property_paths(root["properties"][part], part)
    ]
    assert len(paths) > 60
    missing = [p for p in paths if f"| `{p}` |" not in page]
    assert missing == []


def test_a_row_carries_type_default_validation_and_description() -> None:
    page = crd_reference.render(crd_reference.load_crds())
    row = next(line for line in page.splitlines() if line.startswith("| `spec.worker.batchSize` |"))
    assert row == (
        "| `spec.worker.batchSize` | integer (int32) | `5000` | minimum 1; maximum 1000000 "
        "| Records per transaction at most. |"
    )
    rule = next(line for line in page.splitlines() if line.startswith("| `spec.partitions` |"))
    assert "required" in rule and "CEL: partitions cannot be decreased: `self >= oldSelf`" in rule


def test_the_printer_columns_are_listed_in_order() -> None:
    page = crd_reference.render(crd_reference.load_crds())
    columns = [line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| ")]
    start = columns.index("column") + 1
    assert columns[start : start + 7] == [
        "PHASE",
        "READY",
        "PARTITIONS",
        "DUPLICATES",
        "LAG",
        "FAILOVERS",
        "AGE",
    ]


def test_cells_keep_pipes_inside_one_cell() -> None:
    assert crd_reference.cell("a | b") == "a \\| b"
    assert crd_reference.cell("dedup-<name>, `<kept>`") == "dedup-&lt;name&gt;, `<kept>`"
    assert crd_reference.code("a`b") == "``a`b``"


def test_check_names_the_command_that_refreshes_a_stale_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "crd.md"
    stale.write_text("# DedupPipeline reference\n")
    assert crd_reference.main(["--check", str(stale)]) == 1
    assert crd_reference.REFRESH in capsys.readouterr().out
    crd_reference.main(["--write", str(stale)])
    assert crd_reference.main(["--check", str(stale)]) == 0
