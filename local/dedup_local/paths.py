"""Where the cached real parts live, and which versions are pinned (`versions.env`)."""

from __future__ import annotations

import os
import random
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


# Below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default): the kernel
# never gives these ports to outgoing connections. A port from bind(0) is an ephemeral
# one, and a Kafka client's connection took one between the check and the worker's bind
# (the worker died on "Address already in use" while four test groups ran at once).
FREE_PORTS = range(20000, 32768)


def free_port() -> int:
    """A TCP port that is free right now on every address, chosen at random below the
    ephemeral range (so no outgoing connection takes it before its user binds it)."""
    for _ in range(500):
        port = random.randrange(FREE_PORTS.start, FREE_PORTS.stop)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # all taken: any port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MissingArtifact(RuntimeError):
    """A cached part is absent: the message names the setup command that provides it."""
