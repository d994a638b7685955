"""The one way our processes build a Kubernetes API client, and its request rate.

Where the credentials come from: a kubeconfig file if one is named (its context, or the
file's current one); else the pod's service account (in-cluster: KUBERNETES_SERVICE_HOST
and the mounted token and CA); else, where the caller allows it, the default kubeconfig
(KUBECONFIG, else ~/.kube/config). The client library re-reads a projected service
account token, and refreshes a kubeconfig's expiring credentials, through the hook the
loaders set on the client's configuration: each client gets its own configuration (the
library's process-wide default is never set), so two clients never share one (but a
`sibling`, the same credentials behind another bucket, shares its parent's).

**Request rate.** The Python client has no limiter of its own; client-go's clients
have one (a token bucket per client; controller-runtime's default 20 requests/s, bursts
of 30; client-go's bare rest.Config default is 5 and 10). Each client built here takes
a token from its own bucket (`RequestRate`, QPS 20, burst 30 unless the caller says
otherwise) before every request it sends, watches' included (a watch costs one token
when it starts). A request that finds the bucket empty waits for its token, which is
the point: a pass that would send a burst of hundreds of requests is spread out instead
of landing on the API server at once. A request the API server refuses with 429 (API
Priority and Fairness) is sent again after its Retry-After. `qps=0` builds a client
without the bucket that still resends a 429 (the operator's `--api-qps 0`: the server's
API Priority and Fairness alone, as controller-runtime since v0.21); `qps=None` one
without either (the local harness's administrator, whose tests set up clusters as fast
as they can).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import urllib3
from kubernetes import client, config

DEFAULT_QPS: Final = 20.0
DEFAULT_BURST: Final = 30
POOL_SIZE: Final = 32


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


MAX_THROTTLED_RETRIES: Final = 10  # client-go's default for a 429 with Retry-After
THROTTLED_WAIT_S: Final = (0.5, 1.0, 2.0, 4.0, 8.0)  # without Retry-After, then capped
MAX_RETRY_AFTER_S: Final = 30.0


def throttled_wait(attempt: int, retry_after: str | None) -> float:
    """Seconds to wait before resending a request refused with 429 (the API server's
    priority and fairness: the request was not processed, so any verb may be resent):
    the server's Retry-After when it gives one (capped), else a doubling backoff."""
    try:
        asked = float(retry_after) if retry_after is not None else None
    except ValueError:  # an HTTP date, which the API server does not send
        asked = None
    if asked is not None and asked >= 0:
        return min(asked, MAX_RETRY_AFTER_S)
    return THROTTLED_WAIT_S[min(attempt, len(THROTTLED_WAIT_S) - 1)]


class RateLimitedApiClient(client.ApiClient):
    """An ApiClient whose every request (`call_api`, through which the typed APIs, the
    dynamic client and watches all send theirs) first takes a token from `rate`, and is
    sent again after a 429 (up to MAX_THROTTLED_RETRIES times, waiting `throttled_wait`;
    as client-go does); `throttled` counts the 429s it met."""

    def __init__(
        self,
        configuration: client.Configuration,
        rate: RequestRate | None,  # None: no client-side limit (429s still resent)
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(configuration)
        self.rate = rate
        self.throttled = 0
        self._sleep = sleep

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        # The generated client raises ApiException after this returns (when it reads
        # the response), so a refusal is seen here by its status.
        for attempt in range(MAX_THROTTLED_RETRIES + 1):
            if self.rate is not None:
                self.rate.take()
            response = super().call_api(*args, **kwargs)
            if getattr(response, "status", None) != 429 or attempt == MAX_THROTTLED_RETRIES:
                return response
            self.throttled += 1
            response.read()  # type: ignore[no-untyped-call]  # its connection back to the pool
            self._sleep(throttled_wait(attempt, response.headers.get("Retry-After")))
        raise AssertionError("unreachable: the last attempt returns or raises")


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
    # kept connections per client: the operator holds one per watch (up to ten) and one
    # per pass thread at once; urllib3's default of 10 discards (and warns) beyond that
    configuration.connection_pool_maxsize = POOL_SIZE
    if qps is None:
        return client.ApiClient(configuration)
    if retries is None:
        # urllib3's default retries, except a 429's Retry-After: that is resent here
        # (counted, up to MAX_THROTTLED_RETRIES), not inside urllib3 as well
        configuration.retries = urllib3.Retry(3, respect_retry_after_header=False)
    return RateLimitedApiClient(configuration, RequestRate(qps, burst) if qps else None)


def sibling(api: client.ApiClient, qps: float, burst: int) -> client.ApiClient:
    """Another client on `api`'s configuration (the same credentials, refreshed alike)
    with its own bucket, for requests that must not wait behind `api`'s (the leader
    Lease's renewals) or should not hold them up (Events)."""
    return RateLimitedApiClient(api.configuration, RequestRate(qps, burst))
