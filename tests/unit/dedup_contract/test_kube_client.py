"""The one API-client builder (dedup_contract.kube_client): where the credentials come
from, and the request rate every client it builds keeps."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse
from kubernetes.config import ConfigException

from dedup_contract import kube_client
from dedup_contract.kube_client import RateLimitedApiClient, RequestRate, api_client


class Clock:
    """A monotonic clock that a sleep moves on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def kubeconfig(tmp_path: Path, server: str, token: str, name: str = "kubeconfig") -> Path:
    path = tmp_path / name
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_a_burst_passes_at_once_then_requests_wait_their_turn() -> None:
    clock = Clock()
    rate = RequestRate(qps=2, burst=3, monotonic=clock, sleep=clock.sleep)
    assert [rate.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take() == pytest.approx(0.5)  # one token a half second
    assert rate.take() == pytest.approx(0.5)
    clock.now += 10  # idle: the bucket refills up to the burst, no further
    assert [rate.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        RequestRate(qps=0)


def test_the_defaults_are_controller_runtimes() -> None:
    assert (kube_client.DEFAULT_QPS, kube_client.DEFAULT_BURST) == (20.0, 30)


def test_a_named_kubeconfig_builds_a_rate_limited_client(tmp_path: Path) -> None:
    api = api_client(kubeconfig(tmp_path, "https://10.0.0.1:6443", "secret"), retries=1)
    assert isinstance(api, RateLimitedApiClient) and api.rate is not None
    assert (api.rate.qps, api.rate.burst) == (20.0, 30)
    cfg = api.configuration
    assert cfg.host == "https://10.0.0.1:6443"
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer secret"
    assert cfg.retries == 1
    assert client.Configuration.get_default_copy().host != cfg.host  # not made the default


def test_without_a_limit_the_client_is_the_librarys_own(tmp_path: Path) -> None:
    api = api_client(kubeconfig(tmp_path, "https://10.0.0.1:6443", "t"), qps=None)
    assert type(api) is client.ApiClient


def test_qps_0_means_no_bucket_but_429s_still_resent(tmp_path: Path) -> None:
    """The operator's --api-qps 0: API Priority and Fairness alone."""
    api = api_client(kubeconfig(tmp_path, "https://10.0.0.1:6443", "t"), qps=0)
    assert isinstance(api, RateLimitedApiClient) and api.rate is None


def test_no_kubeconfig_named_and_no_pod_falls_back_to_the_default_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    default = kubeconfig(tmp_path, "https://default:6443", "t", "default-kubeconfig")
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(default))
    assert api_client().configuration.host == "https://default:6443"
    with pytest.raises(ConfigException, match="Service host/port is not set"):
        api_client(default_kubeconfig=False)  # in-cluster or nothing (the worker, dedupctl)


def test_every_request_takes_a_token_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = api_client(kubeconfig(tmp_path, "https://10.0.0.1:6443", "t"))
    assert isinstance(api, RateLimitedApiClient)
    clock = Clock()
    api.rate = RequestRate(qps=10, burst=2, monotonic=clock, sleep=clock.sleep)
    sent: list[str] = []

    def request(method: str, url: str, **_: Any) -> RESTResponse:
        sent.append(f"{method} {url}")
        body = b'{"kind": "NamespaceList", "apiVersion": "v1", "items": []}'
        headers = {"Content-Type": "application/json"}
        return RESTResponse(urllib3.HTTPResponse(body=body, status=200, headers=headers))

    monkeypatch.setattr(api.rest_client, "request", request)
    core = client.CoreV1Api(api)
    for _ in range(4):
        assert core.list_namespace().items == []
    assert sent == ["GET https://10.0.0.1:6443/api/v1/namespaces"] * 4
    assert clock.slept == pytest.approx([0.1, 0.1])  # the two past the burst waited


class Throttling(http.server.BaseHTTPRequestHandler):
    """A local HTTP server standing in for an API server under API Priority and
    Fairness (named as such): the first `refusals` requests get `status` (429) with the
    given Retry-After."""

    refusals = 0
    status = 429
    retry_after: str | None = "1"
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if type(self).refusals > 0:
            type(self).refusals -= 1
            body = (
                b'{"kind": "Status", "apiVersion": "v1", "code": 429, "reason": "TooManyRequests"}'
            )
            self.send_response(self.status)
            if self.retry_after is not None:
                self.send_header("Retry-After", self.retry_after)
        else:
            body = b'{"kind": "NamespaceList", "apiVersion": "v1", "items": []}'
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def throttling(tmp_path: Path) -> Iterator[tuple[RateLimitedApiClient, list[float]]]:
    Throttling.seen, Throttling.status = [], 429
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Throttling)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        api = api_client(kubeconfig(tmp_path, f"http://{host}:{port}", "t"))
        assert isinstance(api, RateLimitedApiClient)
        slept: list[float] = []
        api._sleep = slept.append
        yield api, slept
    finally:
        server.shutdown()


def test_a_429_is_sent_again_after_its_retry_after(
    throttling: tuple[RateLimitedApiClient, list[float]],
) -> None:
    api, slept = throttling
    Throttling.refusals, Throttling.retry_after = 2, "1"
    assert client.CoreV1Api(api).list_namespace().items == []
    assert Throttling.seen == ["/api/v1/namespaces"] * 3
    assert slept == [1.0, 1.0] and api.throttled == 2


def test_a_429_without_retry_after_backs_off_doubling(
    throttling: tuple[RateLimitedApiClient, list[float]],
) -> None:
    api, slept = throttling
    Throttling.refusals, Throttling.retry_after = 3, None
    assert client.CoreV1Api(api).list_namespace().items == []
    assert slept == [0.5, 1.0, 2.0]


def test_without_a_bucket_a_429_is_still_sent_again(
    throttling: tuple[RateLimitedApiClient, list[float]],
) -> None:
    api, slept = throttling
    api.rate = None
    Throttling.refusals, Throttling.retry_after = 1, "2"
    assert client.CoreV1Api(api).list_namespace().items == []
    assert slept == [2.0] and api.throttled == 1


def test_throttled_past_the_retries_the_429_is_raised(
    throttling: tuple[RateLimitedApiClient, list[float]],
) -> None:
    api, _ = throttling
    Throttling.refusals, Throttling.retry_after = 100, "0"
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).list_namespace()
    assert refused.value.status == 429
    assert len(Throttling.seen) == kube_client.MAX_THROTTLED_RETRIES + 1


def test_other_errors_are_not_retried(
    throttling: tuple[RateLimitedApiClient, list[float]],
) -> None:
    api, slept = throttling
    Throttling.refusals, Throttling.retry_after, Throttling.status = 5, "1", 503
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).list_namespace()
    assert refused.value.status == 503
    assert len(Throttling.seen) == 1 and slept == [] and api.throttled == 0


def test_the_throttled_wait_takes_retry_after_capped_else_doubles() -> None:
    wait = kube_client.throttled_wait
    assert wait(0, "3") == 3.0 and wait(5, "0") == 0.0
    assert wait(0, "3600") == kube_client.MAX_RETRY_AFTER_S
    assert [wait(n, None) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert wait(1, "Wed, 21 Oct 2015 07:28:00 GMT") == 1.0  # a date: the backoff
