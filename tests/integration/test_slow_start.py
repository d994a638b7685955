"""The waiting rule on a deliberately slow start of a real broker (dedup_local.patience).

The broker's JVM is frozen (SIGSTOP) for longer than its base start deadline right after
it is launched, so its start is slower than that deadline, as the cold run's session
broker was (not ready after a fixed 90 s at a load average of 14-25 on two cores).
- On a busy machine the deadline is stretched, and the start is waited for.
- On an idle machine the same start fails at its base deadline, with one clear error;
  the session parts' retry (`start_with_retry`) then starts a broker that is not frozen.

The load is simulated where a test needs one (`busy`, `idle`: stand-ins for the machine's
1-minute load average, named as such); the broker, its JVM and the clock are real.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from dedup_local.kafka import KafkaBroker, KafkaBrokerError
from dedup_local.patience import MAX_STRETCH, machine_load, start_with_retry

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


def busy() -> tuple[float, int]:
    """A simulated busy machine: at least MAX_STRETCH times the cores in load."""
    load, cores = machine_load()
    return max(load, MAX_STRETCH * cores), cores


def idle() -> tuple[float, int]:
    """A simulated idle machine."""
    return 0.0, os.cpu_count() or 1


def freeze_on_launch(broker: KafkaBroker, seconds: float) -> threading.Thread:
    """Stops the broker's JVM as soon as it is launched, and lets it go `seconds` later."""

    def run() -> None:
        while broker.pid is None:
            time.sleep(0.01)
        pid = broker.pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        with contextlib.suppress(ProcessLookupError):  # killed by its failed start
            os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_start_slower_than_its_deadline_is_waited_for_on_a_busy_machine() -> None:
    broker = KafkaBroker(start_timeout_s=60, load=busy)
    try:
        freezer = freeze_on_launch(broker, seconds=70)
        broker.start()  # 60 s stretched x4: 240 s
        freezer.join()
        assert broker.start_seconds is not None and broker.start_seconds > 70
        name = "slow-start-check"
        broker.create_topic(name)
        broker.produce(name, [(b"k", b"x", None)])
        assert [m.value() for m in broker.read_committed(name)] == [b"x"]
    finally:
        broker.close()


def test_on_an_idle_machine_it_fails_at_its_deadline_and_the_retry_starts_a_broker() -> None:
    made: list[KafkaBroker] = []
    said: list[str] = []

    def start() -> KafkaBroker:
        if not made:  # the first attempt: frozen for longer than its idle deadline
            made.append(KafkaBroker(start_timeout_s=20, load=idle))
            freeze_on_launch(made[-1], seconds=40)
        else:  # the retry: the machine's own load, the default deadline
            made.append(KafkaBroker())
        return made[-1].start()

    t0 = time.monotonic()
    try:
        broker = start_with_retry("a broker", start, lambda: made[-1].close(), say=said.append)
        assert broker is made[1] and broker.is_running()
    finally:
        for each in made:
            each.close()
    assert len(said) == 1, said
    assert said[0].startswith(
        "a broker: start attempt 1 failed (KafkaBrokerError: Kafka broker not ready "
        "(metadata) after 20s; tail of "
    ), said
    assert time.monotonic() - t0 > 20


def test_a_start_that_never_comes_names_its_deadline_and_the_load() -> None:
    broker = KafkaBroker(start_timeout_s=5, load=busy)
    try:
        freeze_on_launch(broker, seconds=30)
        with pytest.raises(KafkaBrokerError, match=r"not ready \(metadata\) after 20s \(5s stretched x4\.0 by the machine's load\)"):  # fmt: skip
            broker.start()
    finally:
        broker.close()
