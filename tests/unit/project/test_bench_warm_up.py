"""The round-robin bench's warm-up rule (bench/worker_throughput.py): the broker is warm
when its CPU per record stops falling, judged on two runs, never on one."""

from __future__ import annotations

import sys

from dedup_local.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
from worker_throughput import broker_is_warm


def test_two_runs_are_never_enough() -> None:
    assert not broker_is_warm([])
    assert not broker_is_warm([5.0])
    assert not broker_is_warm([5.0, 5.0])


def test_a_broker_still_getting_cheaper_is_not_warm() -> None:
    assert not broker_is_warm([11.8, 9.0, 7.5])
    # one run without a new low is not a plateau: the invocation that went on to 5.7
    assert not broker_is_warm([11.8, 9.0, 9.1])
    assert not broker_is_warm([11.8, 9.0, 9.1, 7.0])


def test_two_runs_without_a_ten_percent_new_low_are_warm() -> None:
    assert broker_is_warm([11.8, 9.0, 9.1, 8.5])
    assert broker_is_warm([10.0, 5.0, 5.2, 4.8])
    # within the 10% either way: noise around a plateau
    assert broker_is_warm([6.0, 5.0, 4.7, 5.3])
