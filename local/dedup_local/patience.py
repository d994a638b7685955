"""How long the harness waits for a real part on a busy machine, and how the test groups'
session parts start: the one rule every start and wait of the harness shares.

On a fresh two-core machine the four test groups started their brokers, control planes,
kubelets and JVMs in the same minute; the load average stayed at 14-25, and a broker
not ready after a fixed 90 s failed a whole group (issue 46). Three parts answer that:

- **A deadline stretched by the measured load** (`Patience`): a wait's base deadline is
  multiplied by the machine's 1-minute load average per core, the highest seen since the
  wait began, between 1 (an idle machine waits the base) and `MAX_STRETCH` (a wait on a
  part that is broken still ends). Pure: the caller passes `now` and the load.
- **One start at a time on the machine** (`start_lock`): a session part takes a
  machine-wide lock while it starts, so that the groups' starts queue instead of
  thrashing. The lock is per process re-entrant (a part started inside another's start,
  as the local cluster's broker is, does not wait for itself).
- **A start retried once** (`start_with_retry`): a start that fails is cleaned up and
  tried again once; the second failure is raised with both causes, as one error.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

MAX_STRETCH = 4.0
"""The most a deadline is stretched: at a load of four times the cores or more, a wait of
90 s lasts 360 s, and no longer."""

START_ATTEMPTS = 2
"""A session part's start is tried twice before its group fails."""


def stretch(load: float, cores: int) -> float:
    """The factor a deadline is multiplied by at this 1-minute load average on `cores`
    cores: the load per core, at least 1 and at most `MAX_STRETCH`."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    return min(MAX_STRETCH, max(1.0, load / cores))


@dataclass
class Patience:
    """A wait that began at `began` (monotonic seconds) with a base deadline of `base_s`.

    `expired(now, load, cores)` is true once `now - began` passes the base stretched by
    the highest load seen so far in the wait: a load that rises while the part starts
    extends the wait, one that falls back does not shorten it."""

    base_s: float
    began: float
    highest_stretch: float = field(default=1.0)

    def budget_s(self, load: float, cores: int) -> float:
        """The wait's length at this load: the base times the highest stretch seen."""
        self.highest_stretch = max(self.highest_stretch, stretch(load, cores))
        return self.base_s * self.highest_stretch

    def expired(self, now: float, load: float, cores: int) -> bool:
        return now - self.began > self.budget_s(load, cores)

    def describe(self) -> str:
        """How long the wait was allowed, for an error message."""
        if self.highest_stretch == 1.0:
            return f"{self.base_s:.0f}s"
        return (
            f"{self.base_s * self.highest_stretch:.0f}s ({self.base_s:.0f}s stretched "
            f"x{self.highest_stretch:.1f} by the machine's load)"
        )


# ------------------------------------------------------------------------- the shell


def machine_load() -> tuple[float, int]:
    """(the 1-minute load average, the cores) of this machine."""
    return os.getloadavg()[0], os.cpu_count() or 1


class PatientDeadline:
    """`Patience` on the real clock and the machine's load: `expired()` and `left_s()`.

    `load` replaces `machine_load` (a test's simulated load: named as such)."""

    def __init__(self, base_s: float, load: Callable[[], tuple[float, int]] = machine_load) -> None:
        self._load = load
        self.patience = Patience(base_s=base_s, began=time.monotonic())

    def expired(self) -> bool:
        return self.patience.expired(time.monotonic(), *self._load())

    def left_s(self) -> float:
        budget = self.patience.budget_s(*self._load())
        return budget - (time.monotonic() - self.patience.began)

    def describe(self) -> str:
        return self.patience.describe()


def patient_timeout(base_s: float) -> float:
    """`base_s` stretched by the machine's load right now: for a timeout handed to a call
    that takes a number of seconds (a subprocess, a client call)."""
    return base_s * stretch(*machine_load())


def start_lock_path() -> Path:
    """The machine-wide start lock: in /tmp, so that every checkout and cache on the
    machine (a cold run's too) shares it; DEDUP_START_LOCK names another file."""
    return Path(os.environ.get("DEDUP_START_LOCK", "/tmp/dedup-operator-start.lock"))


_held = threading.local()


@contextlib.contextmanager
def start_lock(what: str, say: Callable[[str], object] | None = None) -> Iterator[None]:
    """Hold the machine-wide start lock while `what` starts (re-entrant in one thread).

    `say` reports a wait for another process's start (default: stderr)."""
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    report = say or (lambda line: print(line, file=sys.stderr, flush=True))
    path = start_lock_path()
    lock: IO[str] = path.open("a")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            report(f"{what}: waiting for another start on this machine ({path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
            report(f"{what}: waited {time.monotonic() - t0:.0f}s for the start lock")
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
    finally:
        lock.close()  # closing the file releases the lock


class StartFailed(RuntimeError):
    """A part did not start in `START_ATTEMPTS` attempts; the message names each cause."""

    def __init__(self, what: str, causes: list[BaseException]) -> None:
        self.what = what
        self.causes = causes
        lines = [f"{what} did not start in {len(causes)} attempts:"]
        for n, cause in enumerate(causes, 1):
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            lines.append(f"  attempt {n}: {type(cause).__name__}: {first}")
        super().__init__("\n".join(lines))

    def detail(self) -> str:
        """The last cause in full (a log tail, for instance), after the summary."""
        return f"{self}\nthe last attempt's error in full:\n{self.causes[-1]}"


def start_with_retry(
    what: str,
    start: Callable[[], T],
    clean_up: Callable[[], object] = lambda: None,
    *,
    attempts: int = START_ATTEMPTS,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    never_retry: tuple[type[BaseException], ...] = (),
    say: Callable[[str], object] | None = None,
) -> T:
    """`start()`, and once more after `clean_up()` if it raised one of `retry_on`; a
    part that fails every attempt raises `StartFailed` naming each cause. One of
    `never_retry` (a missing binary: trying again cannot help) is raised at once."""
    report = say or (lambda line: print(line, file=sys.stderr, flush=True))
    causes: list[BaseException] = []
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except never_retry:
            with contextlib.suppress(Exception):
                clean_up()
            raise
        except retry_on as exc:
            causes.append(exc)
            with contextlib.suppress(Exception):
                clean_up()
            if attempt < attempts:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                report(f"{what}: start attempt {attempt} failed ({type(exc).__name__}: "
                       f"{first}); trying again")  # fmt: skip
    raise StartFailed(what, causes)
