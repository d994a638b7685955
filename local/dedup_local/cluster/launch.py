"""Runs one container: `unshare --mount --propagation private python -m
dedup_local.cluster.launch <plan.json>`. Inside the pod's private mount namespace it
bind-mounts each volume at its mountPath, then execs the container's command.

A mountPath whose directory does not exist on the host is made without touching the
host: the nearest existing ancestor is covered by a tmpfs on which every original entry
is bind-mounted back, and the missing directories are created in that tmpfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _shadow(ancestor: Path, stage: Path) -> None:
    """Cover `ancestor` with a tmpfs that shows the same entries (bind-mounted back)."""
    stage.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(ancestor), str(stage))
    _mount("-t", "tmpfs", "tmpfs", str(ancestor))
    for entry in stage.iterdir():
        target = ancestor / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
            continue
        if entry.is_dir():
            target.mkdir()
        else:
            target.touch()
        _mount("--bind", str(entry), str(target))


def make_mount_point(
    target: Path, source_is_dir: bool, stage_root: Path, counter: list[int]
) -> None:
    target_parent = target if source_is_dir else target.parent
    if not target_parent.exists():
        ancestor = target_parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        ancestor = ancestor.resolve()
        counter[0] += 1
        _shadow(ancestor, stage_root / str(counter[0]))
        Path(os.path.realpath(target_parent)).mkdir(parents=True, exist_ok=True)
    if not source_is_dir and not target.exists():
        target.touch()


def main(plan_path: str) -> None:
    plan: dict[str, Any] = json.loads(Path(plan_path).read_text())
    stage_root = Path(plan["stage"])
    counter = [0]
    for m in sorted(plan["mounts"], key=lambda m: len(m["target"])):
        source, target = Path(m["source"]), Path(m["target"])
        make_mount_point(target, source.is_dir(), stage_root, counter)
        _mount("--bind", str(source), str(target))
        if m.get("readOnly"):
            _mount("-o", "remount,bind,ro", str(target))
    os.chdir(plan["cwd"])
    argv: list[str] = plan["argv"]
    try:
        os.execve(argv[0], argv, plan["env"])
    except OSError as exc:
        print(f"cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
