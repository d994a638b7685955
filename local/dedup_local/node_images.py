"""The images a real node's containerd starts with: imported once, then hard-linked.

A real cluster's nodes each pull what they run, or boot from a disk image with it
pre-pulled. Here, `ctr images import` of the project's image (about 1.6 GB: its blobs
written and hashed, then unpacked into overlayfs snapshots) into every node's containerd
cost about 30 CPU-seconds a node, eleven nodes a run of the suite (the demo's three,
the local cluster's four, the bare real nodes' four), most of it while other groups
started (issue 46). So a node's containerd starts from a *seed*:

- **The seed** is a containerd root (content store, metadata database, overlayfs
  snapshots) into which a throwaway containerd, the same binary with the CRI plugin off,
  imported the pause image and the images the node asks for, and tagged them. It is
  made once per set of images (their archives are named by their content), under a
  machine-wide lock, and kept under `nodes_dir()/seeds/` until an archive it was made
  from is gone. It starts from the largest seed made whose images it holds too
  (`base_seed`), so only the images that one lacks are imported.
- **Planting** copies it into a node's containerd root before that containerd starts:
  the content blobs and the unpacked layers as hard links (both immutable: a blob is
  named by its digest, and overlayfs only reads its lower directories, a container's
  writes go to its own upper directory), the two bolt databases (containerd's
  metadata, the snapshotter's) as copies of their own. Each node's containerd then owns
  its state as on a node whose disk came with the images.

What differs from a node that pulled: the layers are not unpacked by that node's
containerd, and the nodes share inodes of read-only files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .host import (
    RealNodeError,
    log_tail,
    may_die_with_parent,
    nodes_dir,
    run_command,
    spawn_logged,
)

SEED_FORMAT = "2"
"""Changes when what a seed holds or how it is made changes: older seeds are not used."""

SEED_RECORD = "archives.json"
"""In a seed: what it was made from, `seed_record`'s document."""

NAMESPACE = "k8s.io"
"""containerd's namespace for the CRI plugin's images."""

SHARED = ("io.containerd.content.v1.content", "io.containerd.snapshotter.v1.overlayfs")
"""The seed's parts that nodes share as hard links (their files never change)."""
DATABASES = (
    "io.containerd.metadata.v1.bolt/meta.db",
    "io.containerd.snapshotter.v1.overlayfs/metadata.db",
)
"""The seed's files a node copies, since its containerd writes them."""


@dataclass(frozen=True)
class NodeImage:
    """An image archive (docker-archive or OCI tarball, named by its content) and the
    extra names the node's containerd gives it."""

    archive: Path
    tags: tuple[str, ...] = ()


def seed_key(images: Sequence[NodeImage], containerd: Mapping[str, str]) -> str:
    """The seed's name: its format, the containerd that makes it, and each image (the
    archive's name, which carries its content hash, its size and its tags)."""
    described = [
        [image.archive.name, image.archive.stat().st_size, list(image.tags)] for image in images
    ]
    doc = json.dumps([SEED_FORMAT, dict(containerd), described], sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def seeds_dir() -> Path:
    return nodes_dir() / "seeds"


@contextlib.contextmanager
def _seeds_lock(exclusive: bool) -> Iterator[None]:
    """Shared while a node copies a seed, exclusive while one is made or removed."""
    path = seeds_dir() / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def _containerd_identity(containerd: Path) -> dict[str, str]:
    st = containerd.stat()
    return {"path": str(containerd), "size": str(st.st_size), "mtime": str(int(st.st_mtime))}


def seed_record(images: Sequence[NodeImage], containerd: Mapping[str, str]) -> dict[str, Any]:
    """What a seed records of its making: the containerd that made it and each image (its
    archive's path, size and tags)."""
    return {
        "format": SEED_FORMAT,
        "containerd": dict(containerd),
        "images": [_described(image) for image in images],
    }


def _described(image: NodeImage) -> list[Any]:
    return [str(image.archive), image.archive.stat().st_size, list(image.tags)]


def _read_record(seed_root: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((seed_root / SEED_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != SEED_FORMAT:
        return None
    return record


def base_seed(
    images: Sequence[NodeImage], containerd: Mapping[str, str], made: Sequence[Path]
) -> tuple[Path | None, list[NodeImage]]:
    """Of the seeds `made`, the one to start a seed of `images` from: made by the same
    containerd, holding only images of `images` (the same archive, size and tags), and
    the most of them; and the images left to import into it. (None, all) if none fits.
    So the local cluster's seed (the project's image and the previous release's) starts
    from the demo's (the project's only): a changed project image costs one import, not
    one per image (each about 35-75 s on two cores)."""
    wanted = {json.dumps(_described(image)): image for image in images}
    best: tuple[Path | None, set[str]] = (None, set())
    for root in made:
        record = _read_record(root)
        if record is None or record["containerd"] != dict(containerd):
            continue
        held = {json.dumps(described) for described in record["images"]}
        if held <= wanted.keys() and len(held) > len(best[1]) and _archives_present(record):
            best = (root, held)
    return best[0], [image for key, image in wanted.items() if key not in best[1]]


def seed(images: Sequence[NodeImage], tools: Mapping[str, Path]) -> Path:
    """The seed holding `images` (made now if missing, from the best `base_seed`); `tools`
    names containerd and ctr. Returns the seed's containerd root."""
    containerd = _containerd_identity(tools["containerd"])
    key = seed_key(images, containerd)
    root = seeds_dir() / key
    if root.is_dir():
        return root
    with _seeds_lock(exclusive=True):
        if root.is_dir():  # made by another process while this one waited
            return root
        for cut_short in seeds_dir().glob(".making-*"):  # a making killed midway
            shutil.rmtree(cut_short, ignore_errors=True)  # (none runs: the lock is ours)
        made = [d for d in seeds_dir().iterdir() if d.is_dir() and not d.name.startswith(".")]
        base, missing = base_seed(images, containerd, made)
        work = seeds_dir() / f".making-{key}-{os.getpid()}"
        work.mkdir(parents=True)
        try:
            if base is not None:
                print(
                    f"node images: seed {key} from seed {base.name}, importing "
                    f"{', '.join(i.archive.name for i in missing) or 'nothing'}",
                    flush=True,
                )
                _copy_seed(base, work / "root")
            _import_into(work, missing, tools)
            record = seed_record(images, containerd)
            (work / "root" / SEED_RECORD).write_text(json.dumps(record) + "\n")
            (work / "root").rename(root)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for old in made:
            if _outdated(old):
                shutil.rmtree(old, ignore_errors=True)
    return root


def _outdated(seed_root: Path) -> bool:
    """A seed goes once an archive it was made from is gone (a newer image replaced it:
    `real_node.project_image_archive` keeps the newest only), or it is of another format."""
    record = _read_record(seed_root)
    return record is None or not _archives_present(record)


def _archives_present(record: Mapping[str, Any]) -> bool:
    """Every archive a seed's record names is still there."""
    return all(Path(described[0]).is_file() for described in record["images"])


def containerd_config(comment: str, *, root: Path, state: Path, socket: Path, cri: bool) -> str:
    """What a node's containerd and the seed's share of their configuration (the seed's
    without the CRI plugin, so that both unpack into the same snapshotter the same way): its
    own root, state and socket, no other endpoint, the plugins this host cannot use off."""
    disabled = [
        *(() if cri else ("io.containerd.grpc.v1.cri",)),
        "io.containerd.snapshotter.v1.aufs",
        "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.zfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.tracing.processor.v1.otlp",
        "io.containerd.internal.v1.tracing",
    ]
    return f"""\
# {comment}
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = {json.dumps(disabled)}
[grpc]
  address = "{socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
"""


def _import_into(work: Path, images: Sequence[NodeImage], tools: Mapping[str, Path]) -> None:
    """A throwaway containerd with its root at `work/root` imports and tags `images`,
    then stops (its databases closed)."""
    socket = work / "c.sock"
    config = work / "containerd.toml"
    config.write_text(
        containerd_config(
            "the seed's containerd (dedup_local.node_images): imports, then stops",
            root=work / "root",
            state=work / "state",
            socket=socket,
            cri=False,
        )
    )
    log_path = work / "containerd.log"
    # its own process group, killed with this process (host.spawn_logged)
    proc = spawn_logged(
        "seed containerd",
        [str(tools["containerd"]), f"--config={config}", "--log-level=warn"],
        log_path,
        work,
        may_die_with_parent(),
    )
    ctr = [str(tools["ctr"]), f"--address={socket}", "-n", NAMESPACE]
    try:
        deadline = time.monotonic() + 120
        while not _serving(ctr):
            if not proc.alive() or time.monotonic() > deadline:
                raise RealNodeError(
                    f"the node images' containerd did not serve {socket}; "
                    f"last lines of {log_path}:\n{log_tail(log_path)}"
                )
            time.sleep(0.2)
        for image in images:
            out = run_command([*ctr, "images", "import", str(image.archive)], timeout=1800)
            names = [line.split()[1] for line in out.splitlines() if line.startswith("unpacking ")]
            if image.tags and not names:
                raise RealNodeError(f"ctr import {image.archive} named no image: {out!r}")
            for tag in image.tags:
                run_command([*ctr, "images", "tag", "--force", names[0], tag])
    finally:
        proc.terminate(grace=30.0)  # SIGTERM: its databases closed before the copy


def _serving(ctr: list[str]) -> bool:
    result = subprocess.run(
        [*ctr, "version"], capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL
    )
    return result.returncode == 0


def plant(seed_root: Path, root: Path) -> None:
    """A node's containerd root (`root`, absent or empty) from a seed, before that
    containerd starts: the shared parts hard-linked, the databases copied."""
    with _seeds_lock(exclusive=False):
        if not seed_root.is_dir():
            raise RealNodeError(f"the node images' seed {seed_root} is gone")
        _copy_seed(seed_root, root)


def _copy_seed(seed_root: Path, root: Path) -> None:
    """`plant`'s copy, under a lock its caller holds."""
    root.mkdir(parents=True, exist_ok=True)
    for part in SHARED:
        # -a keeps modes, owners, times and the overlay xattrs (opaque directories);
        # -l makes every file a hard link
        run_command(["cp", "-a", "-l", str(seed_root / part), str(root / part)], timeout=600)
    for database in DATABASES:
        target = root / database
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)  # a hard link from the step above
        shutil.copy2(seed_root / database, target)
