"""The pipelines' Events, posted from one thread, in order, off the passes' path.

A pass that tells what it did must not wait for its Events to be written: during a
crowded node's failover a dozen pipelines each post several per pass, and through the
passes' own request bucket they would hold up the writes that move the handovers on
(client-go's event recorder posts asynchronously too). The pass puts the Event in a
bounded queue (`submit`); one thread posts them in the order given through a client of
its own bucket. A full queue drops the Event with a warning, counted (`dropped`): an
Event is worth a log line, never a blocked pass. `stop` posts what is queued, for up to
`flush_s`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dedup_operator.events")

CAPACITY = 1000
_STOP = object()


class EventPoster:
    """`post(namespace, body)` sends one Event (may raise: logged, not retried)."""

    def __init__(
        self, post: Callable[[str, dict[str, Any]], None], capacity: int = CAPACITY
    ) -> None:
        self._post = post
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="event-poster", daemon=True)
        self.dropped = 0
        self.posted = 0

    def start(self) -> EventPoster:
        self._thread.start()
        return self

    def submit(self, namespace: str, body: dict[str, Any]) -> bool:
        """Queue one Event; False (and a warning) when the queue is full."""
        try:
            self._queue.put_nowait((namespace, body))
        except queue.Full:
            self.dropped += 1
            log.warning(
                "dropped Event %s: %d Events are waiting to be posted",
                body.get("reason"),
                self._queue.qsize(),
            )
            return False
        return True

    def stop(self, flush_s: float = 5.0) -> None:
        """Post what is queued (for up to `flush_s`), then end the thread."""
        deadline = time.monotonic() + flush_s
        while time.monotonic() < deadline:
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            namespace, body = item
            try:
                self._post(namespace, body)
                self.posted += 1
            except Exception as exc:  # an Event is worth a log line, not a failed pass
                why = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
                log.warning("could not post Event %s: %s", body.get("reason"), why)
