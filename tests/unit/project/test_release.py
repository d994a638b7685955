"""One version for the release (dedup_contract.release): pyproject.toml's, which the
chart's `version` and `appVersion`, the operator's default image, the CRD's default image
and CHANGELOG.md's newest entry repeat; every release CHANGELOG.md names has its CRD kept
in crds/released/ (which scripts/crd_compat.py checks against), and the newest kept
release is the entry before the current one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from dedup_local.paths import versions
from dedup_operator.spec import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SEMVER = re.compile(r"^\d+\.\d+\.\d+$")


def changelog_releases() -> list[str]:
    return re.findall(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)


def test_the_version_is_a_plain_release_number() -> None:
    assert SEMVER.match(VERSION), f"pyproject.toml's version {VERSION!r} is not X.Y.Z"


def test_the_chart_the_image_and_the_crd_name_the_same_release() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "dedup-operator" / "Chart.yaml").read_text())
    assert (chart["version"], str(chart["appVersion"])) == (VERSION, VERSION)
    assert f"dedup-operator:{VERSION}" == DEFAULT_IMAGE
    crd_text = (ROOT / "crds" / "dedup.io_dedupPipelines.yaml").read_text()
    assert f"default: dedup-operator:{VERSION}" in crd_text


def test_the_changelog_leads_with_this_release_and_keeps_each_released_crd() -> None:
    releases = changelog_releases()
    assert releases and releases[0] == VERSION, (
        f"CHANGELOG.md's newest entry is {releases[:1]}, the version {VERSION}"
    )
    kept = sorted(p.name for p in (ROOT / "crds" / "released").iterdir() if p.is_dir())
    assert set(kept) <= set(releases), f"crds/released/ holds releases CHANGELOG.md lacks: {kept}"
    assert VERSION not in kept or len(releases) == 1, "this release is not released yet"
    assert releases[1:2] == [max(kept, key=lambda v: tuple(map(int, v.split("."))))], (
        "the release before this one has its CRD in crds/released/"
    )


def test_the_images_the_docs_and_examples_name_are_this_releases() -> None:
    """A pipeline copied from the README or an example runs this release's worker."""
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").iterdir()]
    stale = [
        f"{page.relative_to(ROOT)}: dedup-operator:{found}"
        for page in pages
        for found in re.findall(r"dedup-operator:(\d+\.\d+\.\d+)", page.read_text())
        if found != VERSION
    ]
    assert stale == [], f"images of another release than {VERSION}: {stale}"


def test_the_previous_release_is_pinned_to_a_commit() -> None:
    """versions.env names the release before this one and its commit (what an upgrade
    test installs first); CHANGELOG.md's second entry and crds/released/ agree."""
    pins = versions()
    assert pins["PREVIOUS_RELEASE"] == changelog_releases()[1]
    assert (ROOT / "crds" / "released" / pins["PREVIOUS_RELEASE"]).is_dir()
    assert re.fullmatch(r"[0-9a-f]{40}", pins["PREVIOUS_RELEASE_COMMIT"])
