"""When each pipeline's next reconcile pass runs: a due time per pipeline, passes of
different pipelines at once on a bounded pool, never two at once of one pipeline.

As controller-runtime's workqueue (a key is processed by one worker at a time; added
again while processing, it is processed again after) and kopf's per-object handlers:

* `PassQueue` (pure, `now` passed in): each pipeline's due time; `take` hands out the
  pipeline due first among those not in a pass, `done` ends its pass and sets its next
  due time. A pass asked for while one runs (`want`: the pipeline listed again after
  it was forgotten) runs after it, at the earlier of the two times. A pipeline
  forgotten while in a pass is not scheduled again.
* `PassScheduler` (the shell): `threads` daemon threads take due pipelines and run a
  pass over each; the pass returns the seconds until its pipeline's next pass (None:
  no next pass). One pipeline's handover, passing every second, no longer makes the
  operator pass over every other pipeline every second, and a node lost with workers
  of many pipelines is handed over by several passes at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("dedup_operator.pass_queue")

Key = tuple[str, str]
"""A pipeline: (namespace, name)."""


@dataclass
class PassQueue:
    """Each pipeline's next pass time (monotonic seconds); at most one pass a pipeline."""

    _due: dict[Key, float] = field(default_factory=dict)  # waiting, by due time
    _heap: list[tuple[float, int, Key]] = field(default_factory=list)  # lazily pruned
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _running: set[Key] = field(default_factory=set)
    _again: dict[Key, float] = field(default_factory=dict)  # asked for during its pass
    _forgotten: set[Key] = field(default_factory=set)  # forgotten during its pass

    def want(self, key: Key, at: float) -> None:
        """A pass over `key` at `at` at the latest (an earlier one already due stays)."""
        self._forgotten.discard(key)
        if key in self._running:
            self._again[key] = min(at, self._again.get(key, at))
            return
        if at < self._due.get(key, float("inf")):
            self._due[key] = at
            heapq.heappush(self._heap, (at, next(self._order), key))

    def forget(self, key: Key) -> None:
        """No more passes over `key` (one running ends without a next)."""
        self._due.pop(key, None)
        self._again.pop(key, None)
        if key in self._running:
            self._forgotten.add(key)

    def take(self, now: float) -> Key | None:
        """The pipeline due first by `now` and not in a pass, now in its pass; None if
        none is due."""
        self._prune()
        if not self._heap or self._heap[0][0] > now:
            return None
        _, _, key = heapq.heappop(self._heap)
        del self._due[key]
        self._running.add(key)
        return key

    def done(self, key: Key, at: float | None) -> None:
        """`key`'s pass ended; its next pass at `at` (None: none), or earlier if one was
        asked for meanwhile."""
        self._running.discard(key)
        again = self._again.pop(key, None)
        if key in self._forgotten:
            self._forgotten.discard(key)
            return
        times = [t for t in (at, again) if t is not None]
        if times:
            self.want(key, min(times))

    def next_due(self) -> float | None:
        """The earliest due time of a pipeline not in a pass (None: none waits)."""
        self._prune()
        return self._heap[0][0] if self._heap else None

    def knows(self, key: Key) -> bool:
        """`key` is waiting or in a pass (and not forgotten)."""
        return key in self._due or (key in self._running and key not in self._forgotten)

    def known(self) -> set[Key]:
        """Every pipeline waiting or in a pass (forgotten ones excluded)."""
        return set(self._due) | (self._running - self._forgotten)

    def _prune(self) -> None:
        """Drop heap entries superseded by an earlier `want`, or forgotten."""
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)


PassRunner = Callable[[Key], float | None]
"""Runs one pass over a pipeline; returns the seconds until its next (None: none)."""


class PassScheduler:
    """`threads` threads running the passes a `PassQueue` hands out (see the module)."""

    def __init__(
        self,
        run_pass: PassRunner,
        threads: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if threads < 1:
            raise ValueError(f"a scheduler needs at least one thread, not {threads}")
        self._run_pass = run_pass
        self._threads = threads
        self._monotonic = monotonic
        self._queue = PassQueue()
        self._cond = threading.Condition()
        self._stop = False

    def keep_only(self, keys: Iterable[Key]) -> None:
        """The pipelines that exist: new ones get a pass at once, known ones keep their
        due times, and those gone are forgotten."""
        wanted = set(keys)
        with self._cond:
            known = self._queue.known()
            for key in known - wanted:
                self._queue.forget(key)
            now = self._monotonic()
            for key in wanted - known:
                self._queue.want(key, now)
            self._cond.notify_all()

    def wake(self, keys: Iterable[Key]) -> int:
        """A pass at once over each of `keys` the scheduler knows (something it reads
        changed: `dedup_operator.wakeups`); one in its pass runs again after it. Returns
        how many were known."""
        known = 0
        with self._cond:
            now = self._monotonic()
            for key in keys:
                if self._queue.knows(key):
                    self._queue.want(key, now)
                    known += 1
            if known:
                self._cond.notify_all()
        return known

    def start(self) -> None:
        with self._cond:
            self._stop = False
        for i in range(self._threads):
            threading.Thread(target=self._serve, name=f"pass-{i}", daemon=True).start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _serve(self) -> None:
        while True:
            key = self._next()
            if key is None:
                return
            after: float | None
            try:
                after = self._run_pass(key)
            except Exception:  # one bad pass must not stop the thread; the runner logs
                log.exception("pass over %s/%s failed", *key)  # its own, this is a backstop
                after = None  # scheduled again when the pipelines are next listed
            with self._cond:
                self._queue.done(key, None if after is None else self._monotonic() + after)
                self._cond.notify()

    def _next(self) -> Key | None:
        """Wait for a due pipeline (None: stopped)."""
        with self._cond:
            while not self._stop:
                now = self._monotonic()
                key = self._queue.take(now)
                if key is not None:
                    return key
                due = self._queue.next_due()
                self._cond.wait(None if due is None else max(0.0, due - now))
            return None
