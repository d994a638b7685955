"""The one way our processes build a Kubernetes API client, and its request rate.

Where the credentials come from: a kubeconfig file if one is named (its context, or the
file's current one); else the pod's service account (in-cluster: KUBERNETES_SERVICE_HOST
and the mounted token and CA); else, where the caller allows it, the default kubeconfig
(KUBECONFIG, else ~/.kube/config). The client library re-reads a projected service
account token, and refreshes a kubeconfig's expiring credentials, through the hook the
loaders set on the client's configuration: each client gets its own configuration (the
library's process-wide default is never set), so two clients never share one.

**Request rate.** The Python client has no limiter of its own; client-go's clients
have one (a token bucket per client; controller-runtime's default 20 requests/s, bursts
of 30; client-go's bare rest.Config default is 5 and 10). Each client built here takes
a token from its own bucket (`RequestRate`, QPS 20, burst 30 unless the caller says
otherwise) before every request it sends, watches' included (a watch costs one token
when it starts). A request that finds the bucket empty waits for its token, which is
the point: a pass that would send a burst of hundreds of requests is spread out instead
of landing on the API server at once. `qps=None` builds a client without a limit (the
local harness's administrator, whose tests set up clusters as fast as they can).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from kubernetes import client, config

DEFAULT_QPS: Final = 20.0
DEFAULT_BURST: Final = 30


class RequestRate:
    """A token bucket: `burst` tokens at most, refilled at `qps` a second; `take()`
    takes one, sleeping first until it is there. Thread-safe, and fair: each caller
    reserves the next token (the bucket may go below zero) before it sleeps, so callers
    get their turns in the order they asked."""

    def __init__(
        self,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"need qps > 0 and burst >= 1, got qps {qps}, burst {burst}")
        self.qps, self.burst = qps, burst
        self._monotonic, self._sleep = monotonic, sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._at = monotonic()

    def take(self) -> float:
        """Take a token; returns how long this call waited for it (seconds)."""
        with self._lock:
            now = self._monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class RateLimitedApiClient(client.ApiClient):
    """An ApiClient whose every request (`call_api`, through which the typed APIs, the
    dynamic client and watches all send theirs) first takes a token from `rate`."""

    def __init__(self, configuration: client.Configuration, rate: RequestRate) -> None:
        super().__init__(configuration)
        self.rate = rate

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        self.rate.take()
        return super().call_api(*args, **kwargs)


def api_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    default_kubeconfig: bool = True,
    retries: int | bool | None = None,
    qps: float | None = DEFAULT_QPS,
    burst: int = DEFAULT_BURST,
) -> client.ApiClient:
    """A client from `kubeconfig` (with `context`), else in-cluster, else (unless
    `default_kubeconfig` is false) the default kubeconfig. `retries`: urllib3's retries of
    a failed request (None: the library's default; False: none). Raises the library's
    ConfigException when no source is usable."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.fspath(kubeconfig),
            context=context,
            client_configuration=configuration,
        )
    else:
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except config.ConfigException:
            if not default_kubeconfig:
                raise
            config.load_kube_config(  # type: ignore[no-untyped-call]
                context=context, client_configuration=configuration
            )
    if retries is not None:
        configuration.retries = retries
    if qps is None:
        return client.ApiClient(configuration)
    return RateLimitedApiClient(configuration, RequestRate(qps, burst))
