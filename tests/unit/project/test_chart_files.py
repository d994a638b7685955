"""What can be checked of the chart's files without helm (the rendered chart is checked
in tests/integration/test_chart.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from dedup_contract import names

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "dedup-operator"


def test_the_charts_crds_are_the_top_level_crds() -> None:
    """One source: the chart's files/ holds byte-equal copies of crds/ (copies, not
    symlinks: helm warns on every command about a symlink in a chart, and a packaged or
    GitOps-fetched chart must not depend on files outside it). templates/crds.yaml renders
    them, so that `helm upgrade` upgrades them; the chart has no crds/ directory (helm
    installs that once and never upgrades it)."""
    top = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    chart = sorted(p.name for p in (CHART / "files").glob("*.yaml"))
    assert chart == top, "the chart's files/ and crds/ hold different CRDs"
    assert not (CHART / "crds").exists(), "the chart renders its CRDs from templates/"
    for name in top:
        copy = CHART / "files" / name
        assert not copy.is_symlink()
        assert copy.read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"{copy.relative_to(ROOT)} differs from crds/{name}: "
            "cp crds/*.yaml charts/dedup-operator/files/"
        )


def test_the_chart_is_named_and_a_v2_chart() -> None:
    """(Its versions are the release's: tests/unit/project/test_release.py.)"""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "dedup-operator"


def _keys(node: Any, prefix: str = "", leaves_only: bool = False) -> list[str]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if not (leaves_only and isinstance(value, dict) and value):
                out.append(path)
            out += _keys(value, path, leaves_only)
    return out


def _documented_keys(text: str) -> set[str]:
    """Dotted paths of values.yaml whose line has a comment right above it."""
    found: set[str] = set()
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in text.splitlines():
        match = re.match(r"^( *)([A-Za-z][\w-]*):", line)
        if match:
            indent, key = len(match[1]), match[2]
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([*(k for _, k in stack), key])
            stack.append((indent, key))
            if previous.strip().startswith("#"):
                found.add(path)
        if line.strip():
            previous = line
    return found


def test_values_are_documented_line_by_line() -> None:
    """Every value has a comment above it, or sits in a block whose key has one
    (resources' requests, probe timings)."""
    text = (CHART / "values.yaml").read_text()
    documented = _documented_keys(text)
    undocumented = [
        key
        for key in _keys(yaml.safe_load(text), leaves_only=True)
        if not any(key == d or key.startswith(d + ".") for d in documented)
    ]
    assert undocumented == []


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        out.append(path)
        out += _schema_paths(sub, path)
    return out


def test_the_schema_closes_every_object_and_knows_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], where: str) -> None:
        if node.get("type") == "object":
            assert "additionalProperties" in node, f"{where}: additionalProperties not set"
            if "properties" in node:
                assert node["additionalProperties"] is False, where
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{where}.{key}")

    walk(schema, "values")
    # every default value has a schema entry (maps such as podLabels are open by design)
    open_maps = {"resources.requests", "resources.limits"}
    schema_paths = set(_schema_paths(schema))
    for key in _keys(values):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        assert key in schema_paths or parent in open_maps or parent.endswith("labels"), key


def test_the_operator_runs_as_the_images_user() -> None:
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert f"$uid := {names.RUN_AS_USER}" in deployment
