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
  `nodes/release-images/` (`real_node.image_archive`, as this commit's image is under
  `nodes/images/`), and the names the nodes give it: `localhost/dedup-operator:<version>`
  (what the test's chart values and pipeline name), never `:dev`.

    python -m dedup_local.previous_release build   # extract, build and save if needed
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .host import nodes_dir
from .image import ImageError, ensure_image_of, log, podman
from .paths import REPO_ROOT, MissingArtifact, cache_dir, versions
from .real_node import image_archive

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
        log(f"extracting {commit[:12]} (git archive) into {into}")
        partial = Path(tempfile.mkdtemp(prefix=".src-", dir=into.parent))
        try:
            partial.chmod(0o755)  # mkdtemp's 0700, as a checkout's top directory is not
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


def ensure_previous_release() -> PreviousRelease:
    """The previous release's tree, image and node archive, each made only if absent (a
    second call takes a second or less). Raises PreviousReleaseError (commit not in the
    clone), image.ImageError (the build failed) or MissingArtifact (podman missing)."""
    pinned = versions()
    version, commit = pinned["PREVIOUS_RELEASE"], pinned["PREVIOUS_RELEASE_COMMIT"]
    started = time.monotonic()
    source = extract(commit, release_dir(version, commit) / "src")
    log(f"previous release {version} ({commit[:12]}): tree {source}")
    ref = ensure_image_of(source, REPOSITORY)
    podman("tag", ref, f"{REPOSITORY}:{version}")
    log(f"previous release {version}: image {ref} (also {REPOSITORY}:{version})")
    archive = image_archive(ref, nodes_dir() / "release-images")
    log(f"previous release {version}: archive {archive}, "
        f"{time.monotonic() - started:.1f}s in all")  # fmt: skip
    return PreviousRelease(version, commit, source, ref, archive)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["build"]):
        print("usage: python -m dedup_local.previous_release [build]", file=sys.stderr)
        return 2
    try:
        release = ensure_previous_release()
    except (PreviousReleaseError, ImageError, MissingArtifact) as exc:
        log(f"ERROR: previous release: {exc}")
        return 1
    print(release.image_ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
