"""Runs one container: `unshare --mount --propagation private python -m
dedup_local.cluster.launch <plan.json>`. Inside the pod's private mount namespace it
bind-mounts each volume at its mountPath, then execs the container's command.

A mountPath whose directory does not exist on the host is made without touching the
host: the nearest existing ancestor is covered by a tmpfs on which every original entry
is bind-mounted back, and the missing directories are created in that tmpfs. For a
missing top-level directory (`/data`) that ancestor is `/`: the container then gets a
tmpfs root showing the host's top-level entries and is chrooted into it.

Sources are opened (O_PATH) before anything is mounted and bound from /proc/self/fd, so a
volume mounted over a directory never hides the source of a later one; the plan's `keep`
paths (the checkout and its venv: the "image") are bound back where a volume covers them.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384


def _mount(source: str, target: str, fstype: str | None = None, flags: int = 0) -> None:
    """mount(2) directly (the mount binary would write /run/mount on the way)."""
    if (
        _libc.mount(
            source.encode(), target.encode(), fstype.encode() if fstype else None, flags, None
        )
        != 0
    ):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _shadow(ancestor: Path, stage: Path) -> None:
    """Cover `ancestor` with a tmpfs that shows the same entries (bind-mounted back)."""
    stage.mkdir(parents=True, exist_ok=True)
    _mount(str(ancestor), str(stage), flags=MS_BIND | MS_REC)
    _mount("tmpfs", str(ancestor), "tmpfs")
    _populate(ancestor, stage)


def _populate(target: Path, original: Path) -> None:
    for entry in original.iterdir():
        where = target / entry.name
        if entry.is_symlink():
            where.symlink_to(os.readlink(entry))
            continue
        if entry.is_dir():
            where.mkdir()
        else:
            where.touch()
        _mount(str(entry), str(where), flags=MS_BIND | MS_REC)


def resolve_in(root: Path, path: str) -> Path:
    """`path` with symlinks followed as if `root` were `/` (missing components kept)."""
    parts = [p for p in path.split("/") if p]
    current, hops = root, 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / name
        if candidate.is_symlink() and hops < 40:
            hops += 1
            link = os.readlink(candidate)
            if link.startswith("/"):
                current = root
            parts = [p for p in link.split("/") if p] + parts
            continue
        current = candidate
    return current


def main(plan_path: str) -> None:
    plan: dict[str, Any] = json.loads(Path(plan_path).read_text())
    stage = Path(plan["stage"])
    mounts = sorted(plan["mounts"], key=lambda m: len(m["target"]))
    root = Path("/")
    writable: set[Path] = set()
    if any(
        not resolve_in(root, "/" + m["target"].strip("/").split("/")[0]).exists() for m in mounts
    ):
        # A missing top-level directory: the container gets its own root (a tmpfs showing
        # every top-level entry of the host's) and is chrooted into it.
        root = stage / "root"
        root.mkdir(parents=True, exist_ok=True)
        _mount("tmpfs", str(root), "tmpfs")
        _populate(root, Path("/"))
        writable.add(root)
    # Held open before anything is mounted: bound from /proc/self/fd whatever covers them.
    source_fds = [os.open(m["source"], os.O_PATH) for m in mounts]
    source_dirs = [Path(m["source"]).is_dir() for m in mounts]
    keep = [Path(k) for k in plan.get("keep", []) if Path(k).is_dir()]
    keep_fds = [os.open(k, os.O_PATH) for k in keep]
    for n, m in enumerate(mounts):
        target = resolve_in(root, m["target"])
        directory = target if source_dirs[n] else target.parent
        if not directory.exists():
            ancestor = directory
            while not ancestor.exists():
                ancestor = ancestor.parent
            if ancestor not in writable:
                _shadow(ancestor, stage / f"shadow-{n}")
                writable.add(ancestor)
            directory.mkdir(parents=True, exist_ok=True)
        if not source_dirs[n] and not target.exists():
            target.touch()
        _mount(f"/proc/self/fd/{source_fds[n]}", str(target), flags=MS_BIND)
        if m.get("readOnly"):
            _mount("none", str(target), flags=MS_REMOUNT | MS_BIND | MS_RDONLY)
    for path, fd in zip(keep, keep_fds, strict=True):
        covered = any(
            path != Path(m["target"]) and path.is_relative_to(m["target"]) for m in mounts
        )
        if covered:
            where = resolve_in(root, str(path))
            where.mkdir(parents=True, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", str(where), flags=MS_BIND | MS_REC)
    for fd in [*source_fds, *keep_fds]:
        os.close(fd)
    if root != Path("/"):
        os.chroot(root)
    os.chdir(plan["cwd"])
    argv: list[str] = plan["argv"]
    try:
        os.execve(argv[0], argv, plan["env"])
    except OSError as exc:
        print(f"cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
