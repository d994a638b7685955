"""A TCP proxy a test can cut: stands between a worker and the API server, so that the
worker loses the API server (connections dropped, port closed) while the test keeps it."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        """Drop every connection and stop listening: new connections are refused."""
        with self._lock:
            self._cut = True
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._cut:
                    client.close()
                    upstream.close()
                    return
                self._sockets |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
