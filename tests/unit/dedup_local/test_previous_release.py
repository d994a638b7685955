"""The previous release's tree and names (dedup_local.previous_release), without podman:
extracted from a commit of a git repository once, refused with the fix named when the
commit is not in the clone."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dedup_local import image, previous_release
from dedup_local.paths import versions
from dedup_local.previous_release import PreviousRelease, PreviousReleaseError, extract


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "Dockerfile").write_text("FROM scratch\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return repo


def test_the_tree_of_the_commit_is_extracted_once(repo: Path, tmp_path: Path) -> None:
    first = git(repo, "rev-parse", "HEAD")
    (repo / "Dockerfile").write_text("FROM changed\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    into = tmp_path / "cache" / "0.1.0" / "src"
    assert extract(first, into, repo) == into
    assert (into / "Dockerfile").read_text() == "FROM scratch\n", "the commit's, not HEAD's"
    (into / "marker").write_text("kept")
    extract(first, into, repo)
    assert (into / "marker").exists(), "extracted once"
    assert not list(into.parent.glob(".src-*")), "no partial tree left"


def test_a_commit_not_in_the_clone_names_the_fix(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(PreviousReleaseError, match="git fetch --unshallow"):
        extract("0" * 40, tmp_path / "src", repo)


def test_the_names_nodes_give_it_are_the_releases_not_dev() -> None:
    release = PreviousRelease("0.1.0", "3e81678", Path("/c/src"), "r:x", Path("/c/a.tar"))
    assert release.node_tags[0] == "localhost/dedup-operator:0.1.0"
    assert all(not tag.endswith(":dev") for tag in release.node_tags)
    assert release.chart == Path("/c/src/charts/dedup-operator")


def test_the_pinned_release_is_cached_by_version_and_commit() -> None:
    pinned = versions()
    where = previous_release.release_dir(
        pinned["PREVIOUS_RELEASE"], pinned["PREVIOUS_RELEASE_COMMIT"]
    )
    assert where.name == f"{pinned['PREVIOUS_RELEASE']}-{pinned['PREVIOUS_RELEASE_COMMIT'][:12]}"


def test_pruning_this_commits_builds_never_removes_the_releases_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`image._remove_older` runs after each new build of this commit's image: the
    release's tags (another repository) and `:dev` stay, whatever podman lists."""
    listed = [
        f"{previous_release.REPOSITORY}:c72cf1bee715a723",
        f"{previous_release.REPOSITORY}:0.1.0",
        f"{image.REPOSITORY}:new",
        image.DEV_TAG,
        f"{image.REPOSITORY}:older",
        f"{image.REPOSITORY}:oldest",
    ]
    removed: list[str] = []

    def podman(*args: str, **_: Any) -> subprocess.CompletedProcess[str]:
        if args[0] == "rmi":
            removed.append(args[1])
        return subprocess.CompletedProcess(args, 0, "\n".join(listed), "")

    monkeypatch.setattr(image, "podman", podman)
    image._remove_older(image.REPOSITORY, keep=f"{image.REPOSITORY}:new", builds=2)
    assert removed == [f"{image.REPOSITORY}:oldest"]
    assert not previous_release.REPOSITORY.startswith(image.REPOSITORY + ":")
