"""The fencing token a worker must hold to commit.

In Kubernetes the partition's Lease provides it (the operator issue plugs a lease-backed
token in); standalone, the token is always held and Kafka's transactional fencing
(`init_transactions` bumping the producer epoch) is the only fence.
"""

from __future__ import annotations

from typing import Protocol


class Fenced(RuntimeError):
    """This worker no longer owns its partition; it must stop without committing."""


class FencingToken(Protocol):
    def held(self) -> bool:
        """True while this worker can prove it still owns the partition."""
        ...


class AlwaysHeld:
    """Standalone mode: no lease; Kafka's transactional fencing alone guards the output."""

    def held(self) -> bool:
        return True
