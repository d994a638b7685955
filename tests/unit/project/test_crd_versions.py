"""The CRD's versions: v1beta1 stored, v1alpha1 served beside it with the very same schema,
columns and subresources (no conversion webhook: strategy None), the operator talking
v1alpha1 and the storage migration moving objects to v1beta1 (names)."""

from __future__ import annotations

from pathlib import Path

import yaml

from dedup_contract import names

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "dedup.io_dedupPipelines.yaml").read_text())


def test_v1beta1_is_stored_and_v1alpha1_served_beside_it() -> None:
    versions = {v["name"]: v for v in CRD["spec"]["versions"]}
    assert list(versions) == ["v1beta1", "v1alpha1"]
    assert [v["name"] for v in versions.values() if v["storage"]] == [names.STORAGE_VERSION]
    assert all(v["served"] for v in versions.values())
    assert names.VERSION in versions, "the version the operator talks is served"
    assert f"{names.PLURAL}.{names.GROUP}" == names.CRD_NAME == CRD["metadata"]["name"]


def test_every_version_has_the_same_schema_so_no_conversion_is_needed() -> None:
    first, *others = CRD["spec"]["versions"]
    for version in others:
        for part in ("schema", "subresources", "additionalPrinterColumns"):
            assert version[part] == first[part], f"{version['name']}: {part} differs"
    assert CRD["spec"].get("conversion", {"strategy": "None"}) == {"strategy": "None"}


def test_the_crd_is_kept_by_helm() -> None:
    """The chart renders it from templates/ (upgraded with the release) and must never
    delete it: a deleted CRD deletes every pipeline."""
    assert CRD["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
