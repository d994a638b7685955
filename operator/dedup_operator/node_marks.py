"""Pipelines' marks on one node's out-of-service taint, written together.

A node lost with workers of 20 pipelines is marked by each of them (the taint stays
until the last one lifts its mark: `failover.join_out_of_service_taint`), each mark a
compare-and-set on the node's resourceVersion. Passes of different pipelines run at
once, so they collided: three times as many writes as marks at 16 pass threads, each
collision a read and a write again. Here a pass that finds a write to that node in
flight adds its mark to the next one, which carries every mark added meanwhile (group
commit, as a database's log writer does): one write per node at a time, none of ours
colliding with another of ours. A write that fails raises in every pass it carried.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


def taint_mark(namespace: str, name: str) -> str:
    """How a pipeline marks the out-of-service taints it relies on (node annotation)."""
    return f"{namespace}/{name}"


@dataclass
class _Batch:
    """The marks one write carries; its answer once written."""

    marks: set[str] = field(default_factory=set)
    done: threading.Event = field(default_factory=threading.Event)
    answer: bool = False
    error: BaseException | None = None


class NodeMarkBatches:
    """One write in flight per node; the marks asked meanwhile wait for the next."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, _Batch] = {}  # node -> the batch that takes marks now
        self._writing: dict[str, threading.Lock] = {}  # node -> held while writing

    def add(self, node: str, mark: str, write: Callable[[frozenset[str]], bool]) -> bool:
        """Add `mark` to `node` through `write(marks)` (which writes them all at once and
        says whether they are on the node), in a write of its own or one carrying the
        marks other passes asked for meanwhile; that write's answer."""
        with self._lock:
            batch = self._open.setdefault(node, _Batch())
            batch.marks.add(mark)
            writing = self._writing.setdefault(node, threading.Lock())
        with writing:
            if not batch.done.is_set():  # no one wrote it yet: this pass does
                with self._lock:
                    if self._open.get(node) is batch:
                        del self._open[node]  # closed: later marks wait for the next
                try:
                    batch.answer = write(frozenset(batch.marks))
                except BaseException as exc:  # every pass it carried sees the failure
                    batch.error = exc
                finally:
                    batch.done.set()
        if batch.error is not None:
            raise batch.error
        return batch.answer
