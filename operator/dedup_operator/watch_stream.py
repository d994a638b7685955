"""Reading a watch's stream of events, cheaply enough for 200 Lease renewals a second.

A watch is one HTTP/1.1 response of chunked encoding, one JSON event per line (the API
server writes each event as one chunk). The Kubernetes client reads it through urllib3:
one chunk per read, several Python calls a chunk, and each read takes one TLS record,
so every event costs a wakeup of its own. At 1,000 partitions that wakeup was most of
the operator's CPU at rest (`bench/lease_watch.py`). Here instead:

- the body is read straight from the connection's buffered reader, whatever has arrived
  at once (`read1`), and its chunks are decoded by `ChunkedLines` (pure, below);
- when nothing more waits on the connection (neither decrypted by TLS nor in the
  kernel), the reader sleeps `gather_s` first, so that events gather and one wakeup
  takes several. Every event waits `gather_s` longer at most.

A response this reader cannot take apart safely (not chunked, a content encoding, or
not urllib3's: a scripted one in tests) is read through the client's own line reader.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

READ_SIZE = 65536
MAX_SIZE_LINE = 4096  # a chunk-size line longer than this is not HTTP
HEX_DIGITS = b"0123456789abcdefABCDEF"


class MalformedChunk(ValueError):
    """The body is not valid chunked encoding: the watch is abandoned (and listed again)."""


class ChunkedLines:
    """Decodes a chunked HTTP/1.1 body (RFC 9112 §7.1) fed in pieces cut anywhere, and
    returns the complete lines of its payload. `done` once the last chunk (size 0) and
    its trailer section are read; anything after it is ignored."""

    def __init__(self) -> None:
        self._raw = bytearray()  # received, not yet decoded
        self._payload = bytearray()  # decoded, not yet a complete line
        self._left = -1  # payload bytes left in the current chunk; -1: a size line is next
        self._crlf = False  # the current chunk's data is read; its CRLF is next
        self._trailer = False  # the last chunk is read; trailer lines until an empty one
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        raw = self._raw
        raw += data
        at = 0
        while not self.done:
            if self._crlf:
                if len(raw) - at < 2:
                    break
                if raw[at : at + 2] != b"\r\n":
                    raise MalformedChunk("a chunk's data is not followed by CRLF")
                at += 2
                self._crlf = False
            elif self._left > 0:
                take = min(self._left, len(raw) - at)
                if take == 0:
                    break
                self._payload += raw[at : at + take]
                at += take
                self._left -= take
                self._crlf = self._left == 0
            else:
                end = raw.find(b"\r\n", at)
                if end < 0:
                    if len(raw) - at > MAX_SIZE_LINE:
                        raise MalformedChunk("no chunk-size line within 4096 bytes")
                    break
                line = bytes(raw[at:end])
                at = end + 2
                if self._trailer:
                    self.done = line == b""
                    continue
                size = line.split(b";", 1)[0].strip(b" \t")
                if not size or size.strip(HEX_DIGITS):
                    raise MalformedChunk(f"chunk size {size[:20]!r} is not hexadecimal")
                self._left = int(size, 16)
                self._trailer = self._left == 0
        del raw[:at]
        return self._lines()

    def _lines(self) -> list[bytes]:
        payload = self._payload
        end = payload.rfind(b"\n")
        if end < 0:
            return []
        lines = [line for line in bytes(payload[:end]).split(b"\n") if line.strip()]
        del payload[: end + 1]
        return lines


def lines(response: Any, stop: threading.Event, gather_s: float) -> Iterator[bytes | str]:
    """The watch response's event lines (empty lines left out), until the server ends
    the body; returns early once `stop` is set while gathering. A connection that ends
    before the body does raises ConnectionError; a body that is not chunked encoding,
    MalformedChunk."""
    reader = _body_reader(response)
    if reader is None:
        yield from (line for line in iter_resp_lines(response) if line.strip())  # type: ignore[no-untyped-call]
        return
    sock = _socket_of(response)
    body = ChunkedLines()
    while not body.done:
        data = reader.read1(READ_SIZE)
        if not data:
            raise ConnectionError("the watch's connection ended before its last chunk")
        yield from body.feed(data)
        if body.done or len(data) == READ_SIZE or sock is None or _waiting(sock):
            continue
        if stop.wait(gather_s):
            return


def _body_reader(response: Any) -> Any:
    """The buffered reader under an urllib3 response whose body nothing has read yet
    and which this module can decode (chunked, no content encoding); None otherwise."""
    origin = getattr(response, "_fp", None)  # urllib3 2's http.client.HTTPResponse
    fp = getattr(origin, "fp", None)
    if fp is None or not hasattr(fp, "read1"):
        return None
    headers = getattr(response, "headers", {})
    if headers.get("content-encoding", "identity") not in ("", "identity"):
        return None
    if not getattr(origin, "chunked", False) or getattr(origin, "chunk_left", None) is not None:
        return None
    return fp


def _socket_of(response: Any) -> Any:
    """The watch response's connection socket (urllib3's `HTTPResponse.connection`);
    None when there is none to look at (a scripted response in tests)."""
    return getattr(getattr(response, "connection", None), "sock", None)


def _waiting(sock: Any) -> bool:
    """Whether the socket has data to read now: decrypted and held by TLS, or in the
    kernel's buffer. True when it cannot be told (a closed socket): read at once."""
    try:
        pending = getattr(sock, "pending", None)
        if pending is not None and pending() > 0:
            return True
        poller = select.poll()  # (select.select refuses descriptors above 1023)
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
