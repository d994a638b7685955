"""The previous release (versions.env: PREVIOUS_RELEASE at PREVIOUS_RELEASE_COMMIT), as an
upgrade test installs it first: its chart and its image, built from its own source tree.

- **The tree**: `git archive` of the commit from the repository these files are in,
  extracted once under `$DEDUP_CACHE/releases/<version>-<commit12>/src` (to a temporary
  directory, then renamed: a half-written tree is never used). A clone without the commit
  (a shallow one) stops with the fix named.
- **The image**: that tree's Dockerfile built by `image.ensure_image_of`, the same cached
  build as this commit's image (bases, lock and layer cache shared: only the project's
  own layers are new), tagged `localhost/dedup-operator-release:<digest>` (never pruned
  with this commit's builds) and `localhost/dedup-operator-release:<version>`.
- **The archive** real nodes import (`node_images.NodeImage`), saved once per image under
  `nodes/release-images/`, and the names the nodes give it:
  `localhost/dedup-operator:<version>` (what the test's chart values and pipeline name).

    python -m dedup_local.previous_release build   # extract, build and save if needed
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .host import nodes_dir
from .image import ensure_image_of, log, podman, podman_env
from .paths import REPO_ROOT, cache_dir, versions

REPOSITORY = "localhost/dedup-operator-release"


class PreviousReleaseError(Exception):
    """The previous release cannot be made (its commit is not in this clone)."""


@dataclass(frozen=True)
class PreviousRelease:
    version: str
    commit: str
    source: Path
    """Its source tree (extracted)."""
    image_ref: str
    """In the podman store."""
    archive: Path
    """docker-archive of the image, for real nodes."""

    @property
    def chart(self) -> Path:
        return self.source / "charts" / "dedup-operator"

    @property
    def node_tags(self) -> tuple[str, ...]:
        """The names a real node's containerd gives the image (the first: what to run)."""
        return (
            f"localhost/dedup-operator:{self.version}",
            f"docker.io/library/dedup-operator:{self.version}",
        )


def release_dir(version: str, commit: str) -> Path:
    return cache_dir() / "releases" / f"{version}-{commit[:12]}"


def extract(commit: str, into: Path, repo: Path = REPO_ROOT) -> Path:
    """The tree of `commit` at `into` (extracted once; `into` is returned)."""
    if into.is_dir():
        return into
    into.parent.mkdir(parents=True, exist_ok=True)
    with (into.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if into.is_dir():
            return into
        found = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            raise PreviousReleaseError(
                f"commit {commit} (the previous release, versions.env) is not in the clone "
                f"at {repo}; fetch its history: git fetch --unshallow"
            )
        partial = Path(tempfile.mkdtemp(prefix=".src-", dir=into.parent))
        try:
            archive = subprocess.run(
                ["git", "-C", str(repo), "archive", "--format=tar", commit],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
            partial.rename(into)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return into


def save_archive(ref: str, directory: Path) -> Path:
    """`ref` as a docker-archive in `directory`, named by its content-addressed tag (saved
    once; other archives there removed)."""
    directory = directory if directory.is_absolute() else nodes_dir() / directory
    directory.mkdir(parents=True, exist_ok=True)
    tarball = directory / (ref.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
    podman_env()
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            partial = tarball.with_suffix(".tmp")
            partial.unlink(missing_ok=True)
            podman("save", "--format", "docker-archive", "-o", str(partial), ref, timeout=600)
            partial.rename(tarball)
            for old in directory.glob("*.tar"):
                if old != tarball:
                    old.unlink(missing_ok=True)
    return tarball


def ensure_previous_release() -> PreviousRelease:
    pinned = versions()
    version, commit = pinned["PREVIOUS_RELEASE"], pinned["PREVIOUS_RELEASE_COMMIT"]
    source = extract(commit, release_dir(version, commit) / "src")
    ref = ensure_image_of(source, REPOSITORY)
    podman("tag", ref, f"{REPOSITORY}:{version}")
    archive = save_archive(ref, Path("release-images"))
    return PreviousRelease(version, commit, source, ref, archive)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["build"]):
        print("usage: python -m dedup_local.previous_release [build]", file=sys.stderr)
        return 2
    try:
        release = ensure_previous_release()
    except PreviousReleaseError as exc:
        print(f"previous release: {exc}", file=sys.stderr)
        return 1
    log(f"previous release {release.version}: {release.image_ref}, {release.archive}")
    print(release.image_ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
