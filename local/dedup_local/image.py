"""The project's image, built from the repository's Dockerfile with podman, and the podman
set-up that the local cluster's container runtime shares.

Podman is configured through the environment only, never /etc: `CONTAINERS_CONF` and
`CONTAINERS_STORAGE_CONF` name files under `$DEDUP_CACHE/podman`, whose store holds the
bases, the image and the local cluster's containers. This machine needs `runc` (crun
refuses its hybrid cgroups), `default_ulimits = []` (the sandbox lacks CAP_SYS_RESOURCE),
the cgroupfs manager and a file events log (no systemd).

Bases. The Dockerfile's bases are build arguments defaulting to the official images,
which no registry here serves. `ensure_base` makes equivalents from Debian bookworm
packages with mmdebstrap (python3.11 for python:3.11-slim-bookworm, maven and JDK 17 for
maven:3.9.9-eclipse-temurin-17), with this machine's CA certificates (its egress
proxy's) installed first, and `podman import`s them; each is tagged by a hash of its
recipe and made again only when that changes.

Image. Tagged `localhost/dedup-operator:<hash>`, the hash of its inputs (the Dockerfile,
.dockerignore, every file the build context holds, the bases' image ids); built only when
no image has that tag, then also tagged `localhost/dedup-operator:dev` (what the tests'
pods name). Older builds are removed. The packages of each base and the reasons:
docs/development.md, "The image built here".

    python -m dedup_local.image build   # build if needed, print the reference
    python -m dedup_local.image ref     # the current reference (exit 1 if not built)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .paths import REPO_ROOT, MissingArtifact, cache_dir

REPOSITORY = "localhost/dedup-operator"
DEV_TAG = f"{REPOSITORY}:dev"
SUITE = "bookworm"
TOOLS = ("podman", "runc", "mmdebstrap")
CA_DIR = Path("/usr/local/share/ca-certificates")

CONTAINERS_CONF = """\
# Written by dedup_local.image: podman for this project, through CONTAINERS_CONF.
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


@dataclass(frozen=True)
class Base:
    name: str
    packages: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def recipe(self) -> str:
        certs = sorted(p.name + ":" + _digest(p.read_bytes()) for p in _ca_files())
        return json.dumps([SUITE, self.packages, self.env, certs, "v1"])

    @property
    def ref(self) -> str:
        return f"localhost/dedup-base-{self.name}:{_digest(self.recipe().encode())[:12]}"


# pip inside the build reads PIP_CERT (its own certifi bundle lacks the site's CA).
_CERT_ENV = (
    ("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"),
    ("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"),
)
BASES = {
    "python": Base(
        "python", ("python3.11", "python3-venv", "ca-certificates", "passwd"), _CERT_ENV
    ),
    "maven": Base("maven", ("maven", "openjdk-17-jdk-headless", "ca-certificates"), _CERT_ENV),
}
BUILD_ARGS = {"PYTHON_IMAGE": "python", "MAVEN_IMAGE": "maven"}
KEEP_BUILDS = 3  # the newest builds kept (each about 1.6 GB, mostly shared layers)


class ImageError(RuntimeError):
    """Building or running the image failed; the message says what and how to fix it."""


def log(message: str) -> None:
    print(f"[image {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ca_files() -> list[Path]:
    return sorted(CA_DIR.glob("*.crt")) if CA_DIR.is_dir() else []


# ---------------------------------------------------------------------- podman
def podman_dir() -> Path:
    return cache_dir() / "podman"


@cache
def podman_env() -> dict[str, str]:
    """The environment every podman call of the project runs with (files written once)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise MissingArtifact(
            f"{', '.join(missing)} not found: apt-get install podman runc mmdebstrap "
            "(or run make setup-image, which does)"
        )
    root = podman_dir()
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "containers.conf"
    storage = root / "storage.conf"
    wanted_storage = (
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{root / "storage"}"\n'
        f'runroot = "{root / "run"}"\n'
    )
    for path, text in ((conf, CONTAINERS_CONF), (storage, wanted_storage)):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(conf)
    env["CONTAINERS_STORAGE_CONF"] = str(storage)
    return env


def podman(
    *args: str, check: bool = True, capture: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        text=True,
        capture_output=capture,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-1:] if capture else []
        raise ImageError(f"podman {args[0]} failed ({result.returncode}): {' '.join(detail)}")
    return result


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def image_id(ref: str) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def image_size(ref: str) -> int:
    """Bytes, as `podman images` reports the image's size."""
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


# ---------------------------------------------------------------------- bases
def ensure_base(base: Base) -> str:
    """The base's reference, made with mmdebstrap + podman import if absent."""
    ref = base.ref
    if image_exists(ref):
        return ref
    log(f"making base {ref} from Debian {SUITE} packages ({', '.join(base.packages)})")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dedup-base-", dir=cache_dir()) as work:
        tar = Path(work) / "rootfs.tar"
        hooks: list[str] = []
        if _ca_files():
            hooks = [
                "--setup-hook",
                f'mkdir -p "$1{CA_DIR}" && cp {" ".join(str(p) for p in _ca_files())} '
                f'"$1{CA_DIR}/"',
            ]
        result = subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--quiet",
             f"--include={','.join(base.packages)}", *hooks, SUITE, str(tar)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise ImageError(f"mmdebstrap failed for base {base.name}:\n{tail}")
        changes = ["--change", 'CMD ["/bin/bash"]']
        for key, value in base.env:
            changes += ["--change", f"ENV {key}={value}"]
        podman("import", *changes, str(tar), ref)
    log(f"base {ref} made in {time.monotonic() - started:.0f}s")
    _remove_older(ref.rsplit(":", 1)[0], keep=ref)
    return ref


# ---------------------------------------------------------------------- image
def _ignored(rel: str, patterns: Sequence[str]) -> bool:
    """The subset of .dockerignore's rules the repository's file uses: `*` (everything),
    `!path/` re-includes, `**/name` and `**/*.ext` exclude anywhere."""
    included = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        if body == "*":
            hit = True
        elif body.startswith("**/"):
            name = body[3:]
            parts = rel.split("/")
            hit = any(p == name or (name.startswith("*") and p.endswith(name[1:])) for p in parts)
        else:
            body = body.rstrip("/")
            hit = rel == body or rel.startswith(body + "/")
        if hit:
            included = negate
    return not included


def context_files(root: Path = REPO_ROOT) -> Iterator[Path]:
    """The files of the build context, as .dockerignore leaves them."""
    patterns = [
        line.strip()
        for line in (root / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            rel = rel_dir + name
            if not _ignored(rel, patterns):
                yield root / rel


def inputs_digest(base_ids: Sequence[str], root: Path = REPO_ROOT) -> str:
    h = hashlib.sha256()
    for path in [root / ".dockerignore", *context_files(root)]:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(_digest(path.read_bytes()).encode())
    for image in base_ids:
        h.update(image.encode())
    return h.hexdigest()


def ensure_image() -> str:
    """Build the image from the Dockerfile unless one with the same inputs exists; returns
    its reference (also tagged `localhost/dedup-operator:dev`). One build at a time on the
    machine (a lock in the store's directory): a test process and `make setup-image`, or
    two checkouts, wait for each other, and whoever waited finds it built."""
    podman_env()
    with (podman_dir() / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_image()


def ensure_image_of(root: Path, repository: str) -> str:
    """The image of another source tree (a previous release's, `previous_release`), built
    as `ensure_image` builds this one: the same bases, lock and layer cache, tagged
    `<repository>:<digest of its inputs>`; `:dev` and `image-ref` are left alone."""
    podman_env()
    with (podman_dir() / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(root, repository)[0]


def _build(root: Path, repository: str) -> tuple[str, bool]:
    """The image of the tree at `root` (its reference), and whether it was built now."""
    bases = {arg: ensure_base(BASES[name]) for arg, name in BUILD_ARGS.items()}
    ref = f"{repository}:{inputs_digest([image_id(r) for r in bases.values()], root)[:16]}"
    if image_exists(ref):
        return ref, False
    log(f"building {ref} from {root}/Dockerfile (podman, runc)")
    started = time.monotonic()
    args = ["build", "--network", "host", "--layers", "--tag", ref, "--file",
            str(root / "Dockerfile")]  # fmt: skip
    for arg, base_ref in bases.items():
        args += ["--build-arg", f"{arg}={base_ref}"]
    with subprocess.Popen(
        ["podman", *args, str(root)],
        env=podman_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            tail = [*tail[-30:], line.rstrip()]
            if "STEP " in line[:16] or line.startswith(("COMMIT", "Successfully tagged")):
                log(line.rstrip())
    if proc.returncode != 0:
        raise ImageError("podman build failed:\n" + "\n".join(tail))
    log(f"built {ref} in {time.monotonic() - started:.0f}s")
    return ref, True


def _ensure_image() -> str:
    ref, built = _build(REPO_ROOT, REPOSITORY)
    if built:
        _remove_older(REPOSITORY, keep=ref, builds=KEEP_BUILDS)
    previous = image_id(DEV_TAG) if image_exists(DEV_TAG) else None
    podman("tag", ref, DEV_TAG)
    if previous is not None and previous != image_id(ref):
        podman("rmi", previous, check=False)  # the build the dev tag named before
    (podman_dir() / "image-ref").write_text(ref + "\n")
    return ref


def _remove_older(repository: str, keep: str, builds: int = 1) -> None:
    """Earlier builds of `repository` beyond the newest `builds` (`keep` and :dev always
    stay; another checkout on the machine may be using a recent one). Untagged layers
    stay: they are `podman build --layers`' cache (the dependencies' layer above all)."""
    listed = podman(
        "images", "--sort", "created", "--format", "{{.Repository}}:{{.Tag}}", repository,
        check=False,
    )  # fmt: skip
    refs = [
        ref
        for ref in listed.stdout.split()
        if ref not in (keep, DEV_TAG) and ref.startswith(repository + ":")
    ]
    for ref in refs[builds - 1 :]:  # newest first
        podman("rmi", ref, check=False)  # refused while a container uses it


def built_ref() -> str:
    """The reference of the last `ensure_image`, if that image is still in the store."""
    path = podman_dir() / "image-ref"
    ref = path.read_text().strip() if path.exists() else ""
    if not ref or not image_exists(ref):
        raise MissingArtifact("the project's image is not built; run: make setup-image")
    return ref


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "build"
    try:
        if command == "build":
            ref = ensure_image()
            log(f"{ref}: {image_size(ref) / 2**20:.0f} MiB")
            print(ref)
        elif command == "ref":
            print(built_ref())
        else:
            print("usage: python -m dedup_local.image [build|ref]", file=sys.stderr)
            return 2
    except (ImageError, MissingArtifact) as exc:
        log(f"ERROR: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
