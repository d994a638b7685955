"""How a test group's session parts start (the broker, the control plane, the local
clusters, the SparkSession): one at a time on the machine, retried once, and, when a
part does not start, the group ends with one line naming the cause.

The rule itself (the machine-wide start lock, the retry, the deadlines stretched by the
load) is `dedup_local.patience`'s. What this adds is pytest's side: a session fixture
that raised would be re-raised to every test that uses it (47 errors that looked like 47
defects, issue 46). Instead the group stops (`pytest.exit`) with the cause once, and its
exit code is `SESSION_PART_FAILED`; the tests already run keep their results.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import TypeVar

import pytest

from dedup_local.paths import MissingArtifact
from dedup_local.patience import StartFailed, start_lock, start_with_retry

T = TypeVar("T")

SESSION_PART_FAILED = 3
"""The exit code of a group whose session part did not start (scripts/test.sh names it)."""


def start_session_part(
    request: pytest.FixtureRequest,
    what: str,
    start: Callable[[], T],
    clean_up: Callable[[], object] = lambda: None,
) -> T:
    """`start()` under the machine-wide start lock, once more after `clean_up()` if it
    fails; a part that does not start ends the group's session here. A missing cached
    part (`MissingArtifact`: its message names the set-up command) is not retried."""

    def say(line: str) -> None:
        # past pytest's capture: a start that waits or fails is what a CI page must show
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n[session] {line}", file=sys.stderr, flush=True)

    try:
        with start_lock(what, say=say):
            return start_with_retry(what, start, clean_up, never_retry=(MissingArtifact,), say=say)
    except MissingArtifact as exc:
        pytest.exit(f"{what}: {exc}", returncode=SESSION_PART_FAILED)
    except StartFailed as exc:
        say(exc.detail())
        pytest.exit(
            f"{exc} -- the group stops here: every test after this one needs it",
            returncode=SESSION_PART_FAILED,
        )
