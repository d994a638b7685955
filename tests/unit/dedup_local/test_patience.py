"""The harness's waiting rule (dedup_local.patience): deadlines stretched by the load,
the start retried once, one start at a time on the machine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dedup_local.paths import MissingArtifact
from dedup_local.patience import (
    MAX_STRETCH,
    Patience,
    StartFailed,
    start_lock,
    start_with_retry,
    stretch,
)


def test_an_idle_machine_waits_the_base_and_a_busy_one_longer_up_to_the_cap() -> None:
    assert stretch(0.0, 2) == 1.0
    assert stretch(1.9, 2) == 1.0
    assert stretch(6.0, 2) == 3.0
    assert stretch(25.0, 2) == MAX_STRETCH == 4.0
    with pytest.raises(ValueError, match="cores"):
        stretch(1.0, 0)


def test_a_broker_ready_after_150s_at_load_6_on_2_cores_is_waited_for() -> None:
    # the cold run's case: a 90 s start deadline, the load average at 6 on two cores
    wait = Patience(base_s=90, began=1000.0)
    assert not wait.expired(now=1150.0, load=6.0, cores=2)  # 90 x 3 = 270 s
    assert wait.expired(now=1271.0, load=6.0, cores=2)
    assert "270s (90s stretched x3.0" in wait.describe()


def test_the_same_start_on_an_idle_machine_fails_at_its_base() -> None:
    wait = Patience(base_s=90, began=0.0)
    assert not wait.expired(now=90.0, load=0.5, cores=2)
    assert wait.expired(now=91.0, load=0.5, cores=2)
    assert wait.describe() == "90s"


def test_a_load_that_falls_back_does_not_shorten_the_wait() -> None:
    wait = Patience(base_s=10, began=0.0)
    assert not wait.expired(now=5.0, load=8.0, cores=2)  # 40 s from now on
    assert not wait.expired(now=35.0, load=0.0, cores=2)
    assert wait.expired(now=41.0, load=0.0, cores=2)


def test_a_start_that_fails_once_is_cleaned_up_and_tried_again() -> None:
    calls: list[str] = []

    def start() -> str:
        calls.append("start")
        if calls.count("start") == 1:
            raise RuntimeError("not ready (metadata) after 90s\nlog tail ...")
        return "up"

    said: list[str] = []
    result = start_with_retry("the broker", start, lambda: calls.append("clean"), say=said.append)
    assert result == "up"
    assert calls == ["start", "clean", "start"]
    assert said == [
        "the broker: start attempt 1 failed (RuntimeError: not ready (metadata) after 90s);"
        " trying again"
    ]


def test_a_start_that_fails_twice_names_both_causes_in_one_error() -> None:
    attempts = iter(["port in use", "not ready after 360s"])

    def start() -> None:
        raise RuntimeError(next(attempts))

    with pytest.raises(StartFailed) as failed:
        start_with_retry("the control plane", start, say=lambda _: None)
    assert str(failed.value) == (
        "the control plane did not start in 2 attempts:\n"
        "  attempt 1: RuntimeError: port in use\n"
        "  attempt 2: RuntimeError: not ready after 360s"
    )
    assert failed.value.detail().endswith("not ready after 360s")


def test_a_missing_binary_is_not_retried() -> None:
    calls = []

    def start() -> None:
        calls.append(1)
        raise MissingArtifact("run: make setup-kube")

    with pytest.raises(MissingArtifact):
        start_with_retry("x", start, never_retry=(MissingArtifact,), say=lambda _: None)
    assert calls == [1]


def test_the_start_lock_is_reentrant_in_a_process_and_queues_another(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    lock = tmp_path / "start.lock"
    monkeypatch.setenv("DEDUP_START_LOCK", str(lock))
    said: list[str] = []
    with start_lock("outer", say=said.append), start_lock("inner", say=said.append):
        pass  # the inner start (the local cluster's broker) does not wait for itself
    assert said == []

    # another process holds it for a second: this one says it waits, then gets it
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(Path(__file__).resolve().parents[3] / "local")!r})
            from dedup_local.patience import start_lock
            with start_lock("holder"):
                print("held", flush=True)
                time.sleep(1.0)
        """),
        ],
        stdout=subprocess.PIPE,
        env={"DEDUP_START_LOCK": str(lock), "PATH": "/usr/bin:/bin"},
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == b"held\n"
    t0 = time.monotonic()
    with start_lock("the broker", say=said.append):
        waited = time.monotonic() - t0
    assert holder.wait(10) == 0
    assert waited > 0.3
    assert said[0] == f"the broker: waiting for another start on this machine ({lock})"
    assert said[1].startswith("the broker: waited ")
