"""A node's TCP proxy to the apiserver: its pods get it as KUBERNETES_SERVICE_HOST/PORT,
so `partition()` cuts exactly that node's pods off the API (open connections closed,
new ones refused) while everything else on loopback (Kafka) stays reachable."""

from __future__ import annotations

import contextlib
import socket
import threading

from ..paths import free_port


class ApiProxy:
    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.host = host
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._closed = False

    @property
    def partitioned(self) -> bool:
        return self._listener is None

    def start(self) -> ApiProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def partition(self) -> None:
        """Close the listener and every open connection."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        for sock in [*([listener] if listener else []), *conns]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def heal(self) -> None:
        if self._listener is None and not self._closed:
            self.start()

    def close(self) -> None:
        self._closed = True
        self.partition()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
