"""The shape every local part shares: `start()` (returns the part, started) and `stop()`,
and `with Part(...) as part:` for both (the control plane, real nodes, the host's
kube-proxy, the CSI controller, the clusters)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Started(ABC):
    """A part that is started and stopped; `with` does both."""

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
