"""The watch's own reader (dedup_operator.watch_stream): the chunked decoder against
bodies encoded here chunk by chunk and fed cut at random places, its refusals, and the
reader over real urllib3 responses from a local HTTP server (real sockets: whether the
fast path is taken, gathering, a connection cut before the last chunk). The real API
server's watch through it: tests/integration/test_operator_watch_stream.py."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import urllib3

from dedup_operator.watch_stream import (
    ChunkedLines,
    MalformedChunk,
    _body_reader,
    _socket_of,
    _waiting,
    lines,
)


def encode(events: list[bytes], rng: random.Random) -> bytes:
    """Each event as the API server writes it (one chunk), with now and then an event
    split over two chunks, a chunk extension, upper-case hex or an empty line, then the
    last chunk and a trailer."""
    out = []
    for event in events:
        pieces = [event + b"\n"]
        if rng.random() < 0.2 and len(event) > 2:
            cut = rng.randrange(1, len(event))
            pieces = [event[:cut], event[cut:] + b"\n"]
        if rng.random() < 0.1:
            pieces.append(b"\n")
        for piece in pieces:
            size = format(len(piece), "X" if rng.random() < 0.5 else "x").encode()
            extension = b";name=value" if rng.random() < 0.1 else b""
            out.append(size + extension + b"\r\n" + piece + b"\r\n")
    out.append(b"0\r\nX-Trailer: 1\r\n\r\n")
    return b"".join(out)


def cut(body: bytes, rng: random.Random) -> Iterator[bytes]:
    at = 0
    while at < len(body):
        step = rng.choice((1, 2, 3, 7, 64, 500, 5000))
        yield body[at : at + step]
        at += step


def test_lines_come_out_whole_however_the_body_is_cut() -> None:
    rng = random.Random(26)
    for _ in range(300):
        events = [
            b'{"type":"MODIFIED","n":%d,"pad":"%s"}' % (i, b"x" * rng.randrange(0, 300))
            for i in range(rng.randrange(0, 12))
        ]
        body = encode(events, rng)
        decoder, got = ChunkedLines(), []
        for piece in cut(body + b"after the end", rng):
            got.extend(decoder.feed(piece))
        assert got == events
        assert decoder.done


def test_the_body_is_not_done_before_its_last_chunk_and_trailer() -> None:
    decoder = ChunkedLines()
    assert decoder.feed(b"3\r\nab\n\r\n") == [b"ab"]
    assert decoder.feed(b"0\r\n") == []
    assert not decoder.done
    decoder.feed(b"\r\n")
    assert decoder.done


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nab\r\n",  # not hexadecimal
        b"-1\r\nab\r\n",
        b"0x2\r\nab\r\n",
        b"\r\n",  # no size at all
        b"2\r\nabXY",  # the data not followed by CRLF
        b"1" * 5000,  # no size line within bounds
    ],
)
def test_what_is_not_chunked_encoding_is_refused(body: bytes) -> None:
    with pytest.raises(MalformedChunk):
        ChunkedLines().feed(body)


class ChunkedServer:
    """A local HTTP/1.1 server answering every request with one chunked body, sent as
    scripted: (delay, bytes) steps on the raw socket, then the connection is closed."""

    def __init__(self, steps: list[tuple[float, bytes]], header: bytes = b"") -> None:
        self._steps, self._header = steps, header
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + self._header
                + b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for delay, data in self._steps:
                time.sleep(delay)
                conn.sendall(data)

    def response(self) -> urllib3.BaseHTTPResponse:
        pool = urllib3.HTTPConnectionPool("127.0.0.1", self.port, retries=False)
        return pool.request("GET", "/watch", preload_content=False, timeout=5)


def chunk(line: bytes) -> bytes:
    return b"%x\r\n%s\n\r\n" % (len(line) + 1, line)


def test_a_real_urllib3_response_is_read_by_this_module_with_events_gathered() -> None:
    events = [b'{"n":%d}' % i for i in range(20)]
    steps = [(0.002, chunk(event)) for event in events] + [(0.0, b"0\r\n\r\n")]
    response = ChunkedServer(steps).response()
    assert _body_reader(response) is not None, "the fast path is taken"
    reads = 0
    original = _body_reader(response).read1

    def counted(size: int) -> bytes:
        nonlocal reads
        reads += 1
        return original(size)  # type: ignore[no-any-return]

    _body_reader(response).read1 = counted
    assert list(lines(response, threading.Event(), gather_s=0.02)) == events
    assert reads < len(events), f"events gathered: {reads} reads for {len(events)} events"


def test_a_connection_cut_before_the_last_chunk_is_an_error_not_an_end() -> None:
    response = ChunkedServer([(0.0, chunk(b'{"n":1}'))]).response()
    got = []
    with pytest.raises(ConnectionError):
        for line in lines(response, threading.Event(), gather_s=0.0):
            got.append(line)
    assert got == [b'{"n":1}']


def test_a_content_encoding_is_left_to_the_clients_own_reader() -> None:
    response = ChunkedServer(
        [(0.0, chunk(b'{"n":1}') + b"0\r\n\r\n")], header=b"Content-Encoding: identity\r\n"
    ).response()
    assert _body_reader(response) is not None  # identity is no encoding
    gzipped = ChunkedServer([(0.0, b"0\r\n\r\n")], header=b"Content-Encoding: gzip\r\n").response()
    assert _body_reader(gzipped) is None


def test_stop_ends_the_reading_while_it_gathers() -> None:
    response = ChunkedServer([(0.0, chunk(b'{"n":1}')), (5.0, b"0\r\n\r\n")]).response()
    stop = threading.Event()
    stream = lines(response, stop, gather_s=0.05)
    assert next(stream) == b'{"n":1}'
    stop.set()
    t0 = time.monotonic()
    assert list(stream) == []
    assert time.monotonic() - t0 < 1.0


def test_a_watch_tells_whether_its_connection_has_data_waiting() -> None:
    """`_waiting`: what decides whether a watch sleeps to let events gather (a local
    socket pair)."""
    ours, theirs = socket.socketpair()
    try:
        assert not _waiting(ours)
        theirs.sendall(b'{"type": "MODIFIED"}\n')
        assert _waiting(ours)
        ours.recv(100)
        assert not _waiting(ours)
    finally:
        ours.close()
        theirs.close()
    assert _waiting(ours), "closed: cannot be told, read at once"
    assert _socket_of(object()) is None  # a scripted response: no gathering
