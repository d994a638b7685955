"""Where the cached real parts live, and which versions are pinned (`versions.env`)."""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Root of everything fetched or built; outside the repository."""
    return Path(os.environ.get("DEDUP_CACHE", Path.home() / ".cache" / "dedup-operator"))


@cache
def versions() -> dict[str, str]:
    """The pins from `versions.env` (KEY=VALUE lines; `#` starts a comment)."""
    pins: dict[str, str] = {}
    for line in (REPO_ROOT / "versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MissingArtifact(RuntimeError):
    """A cached part is absent: the message names the setup command that provides it."""
