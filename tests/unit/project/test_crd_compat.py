"""The CRD only grows compatibly (scripts/crd_compat.py): crds/ against every released
CRD in crds/released/, and the checker failing, with the change named, on each kind of
planted incompatible change."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import crd_compat

CRD_FILE = crd_compat.CRDS / "dedup.io_dedupPipelines.yaml"


def test_the_crd_only_grew_compatibly_since_each_release() -> None:
    assert crd_compat.releases(), "no released CRD in crds/released/"
    assert crd_compat.check_against_releases() == []


@pytest.fixture
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return crd_compat.incompatible(old, new)


def at_both(change: str) -> list[str]:
    """A change of the one schema both served versions share (a YAML anchor in crds/, one
    object here): named for each."""
    return [f"DedupPipeline {version}: {change}" for version in ("v1beta1", "v1alpha1")]


def test_the_same_crd_has_no_change(crd: dict[str, Any]) -> None:
    assert changes(crd, copy.deepcopy(crd)) == []


def test_a_removed_field_is_named(crd: dict[str, Any]) -> None:
    new = copy.deepcopy(crd)
    del spec_schema(new)["properties"]["window"]["properties"]["duration"]
    assert changes(crd, new) == at_both("spec.window.duration: removed")


def test_a_renamed_field_is_a_removal(crd: dict[str, Any]) -> None:
    new = copy.deepcopy(crd)
    kafka = spec_schema(new)["properties"]["kafka"]["properties"]
    kafka["deadLetters"] = kafka.pop("deadLetterTopic")
    assert changes(crd, new) == at_both("spec.kafka.deadLetterTopic: removed")


def test_a_version_no_longer_served(crd: dict[str, Any]) -> None:
    new = copy.deepcopy(crd)
    new["spec"]["versions"][1]["served"] = False
    assert changes(crd, new) == ["DedupPipeline v1alpha1: no longer served"]
    del new["spec"]["versions"][1]
    assert changes(crd, new) != [], "a version dropped is a version no longer served"


def test_a_narrowed_type_enum_or_bound(crd: dict[str, Any]) -> None:
    new = copy.deepcopy(crd)
    spec = spec_schema(new)["properties"]
    spec["partitions"]["type"] = "string"
    source = spec["messageId"]["properties"]["source"]
    source["enum"] = source["enum"][:-1]
    spec["partitions"].pop("minimum", None)
    spec["partitions"]["maximum"] = 2
    found = changes(crd, new)
    assert any("spec.partitions: type integer became string" in c for c in found), found
    assert any("spec.messageId.source: enum values removed" in c for c in found), found
    assert any(
        "spec.partitions: maximum" in c and ("added" in c or "became 2" in c) for c in found
    ), found
    looser = copy.deepcopy(crd)
    spec_schema(looser)["properties"]["partitions"].pop("maximum", None)
    assert changes(crd, looser) == []  # a bound dropped loosens


def test_a_new_required_field(crd: dict[str, Any]) -> None:
    new = copy.deepcopy(crd)
    spec_schema(new)["properties"]["team"] = {"type": "string"}
    optional = copy.deepcopy(new)
    assert changes(crd, optional) == []  # a new optional field is free
    spec_schema(new)["required"].append("team")
    assert changes(crd, new) == at_both("spec.team: now required (a new field)")


def test_a_new_rule_on_an_existing_field_needs_a_ratchet(crd: dict[str, Any]) -> None:
    def with_rule(rule: dict[str, Any]) -> dict[str, Any]:
        new = copy.deepcopy(crd)
        spec_schema(new)["properties"]["window"].setdefault("x-kubernetes-validations", [])
        spec_schema(new)["properties"]["window"]["x-kubernetes-validations"].append(rule)
        return new

    tight = with_rule({"rule": "self.duration.endsWith('h')"})
    assert changes(crd, tight) == at_both(
        "spec.window: a new rule without a ratchet: \"self.duration.endsWith('h')\""
    )
    ratcheted = with_rule({"rule": "self == oldSelf || self.duration.endsWith('h')"})
    assert changes(crd, ratcheted) == []
    optional = {"rule": "!oldSelf.hasValue() || self.duration.endsWith('h')"}
    assert changes(crd, with_rule(optional)) != []  # oldSelf optional only when asked
    assert changes(crd, with_rule({**optional, "optionalOldSelf": True})) == []
    new_field = with_rule({"rule": "!has(self.unit) || self.unit == 'h'"})
    assert changes(crd, new_field) == []  # guards a field no stored object has


def test_the_command_names_each_change_and_exits_1(
    crd: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = copy.deepcopy(crd)
    del spec_schema(new)["properties"]["window"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(crd))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new))
    assert crd_compat.main([str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml")]) == 1
    out = capsys.readouterr().out
    assert "incompatible: DedupPipeline v1alpha1: spec.window: removed" in out
    assert crd_compat.main([str(CRD_FILE), str(CRD_FILE)]) == 0
