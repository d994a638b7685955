"""`free_port`: a port its caller can bind, outside the range the kernel hands to
outgoing connections (one of those took a worker's metrics port between check and bind)."""

from __future__ import annotations

import socket
from pathlib import Path

from dedup_local.paths import FREE_PORTS, free_port


def ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_free_ports_are_bindable_and_below_the_ephemeral_range() -> None:
    ephemeral = ephemeral_range()
    assert FREE_PORTS.stop <= ephemeral.start
    for _ in range(20):
        port = free_port()
        assert port in FREE_PORTS
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("0.0.0.0", port))  # its user can bind it, on every address


def test_a_port_in_use_is_not_handed_out() -> None:
    held = []
    try:
        for _ in range(30):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = free_port()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        ports = {s.getsockname()[1] for s in held}
        assert len(ports) == len(held)  # none handed out twice while held
    finally:
        for sock in held:
            sock.close()
