"""Every leaf field of the DedupPipeline CRD's spec has a test of its effect, named in
tests/support/crd_field_effects.py, and every test named there exists."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.crd_field_effects import FIELD_EFFECTS

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "dedup.io_dedupPipelines.yaml").read_text())


def leaf_fields(schema: dict[str, Any], path: str) -> Iterator[str]:
    """Dotted paths of the schema's leaves: nodes without `properties` (scalars, maps,
    lists, passed-through objects). An object with `properties` is walked, never a leaf."""
    props = schema.get("properties")
    if not props:
        yield path
        return
    for key, sub in props.items():
        yield from leaf_fields(sub, f"{path}.{key}")


def spec_leaves() -> list[str]:
    """(Every served version has the same schema: tests/unit/project/test_crd_versions.py.)"""
    version = CRD["spec"]["versions"][0]
    return list(leaf_fields(version["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec"))


@cache
def defined_tests(file: str) -> frozenset[str]:
    """The test functions a file defines (module level or in a class), by parsing it."""
    tree = ast.parse((ROOT / file).read_text(), filename=file)
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    )


def test_the_walk_finds_the_leaves_of_every_part_of_the_spec() -> None:
    leaves = spec_leaves()
    assert len(leaves) == len(set(leaves)) >= 30
    for kind in ("spec.kafka.config", "spec.worker.tolerations", "spec.worker.affinity"):
        assert kind in leaves  # a map, a list, a passed-through object
    assert "spec.kafka.securityRef.secretName" in leaves
    assert "spec.kafka.securityRef" not in leaves  # an object with properties is walked
    assert not [f for f in leaves if "snapshots" in f]  # removed: it did nothing


def test_every_crd_field_has_a_test_of_its_effect() -> None:
    missing = [f for f in spec_leaves() if f not in FIELD_EFFECTS]
    assert missing == [], (
        f"CRD fields without a test of their effect: {missing}; write one (what the field "
        "changes in the rendered objects, the worker's arguments, the status or an API "
        "action) and name it in tests/support/crd_field_effects.py"
    )


def test_the_table_names_only_fields_of_the_crd() -> None:
    stale = sorted(set(FIELD_EFFECTS) - set(spec_leaves()))
    assert stale == [], f"tests/support/crd_field_effects.py names no CRD fields: {stale}"


@pytest.mark.parametrize("field", sorted(FIELD_EFFECTS))
def test_the_named_test_exists(field: str) -> None:
    effect = FIELD_EFFECTS[field]
    file, sep, function = effect.test.partition("::")
    assert sep and function and "::" not in function, f"{field}: {effect.test!r}"
    assert file.startswith("tests/") and file.endswith(".py"), f"{field}: {file}"
    assert (ROOT / file).is_file(), f"{field}: no file {file}"
    assert function in defined_tests(file), f"{field}: {file} defines no {function}"
    assert effect.shows.strip(), f"{field}: say what effect the test asserts"
