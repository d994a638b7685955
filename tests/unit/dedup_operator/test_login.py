"""How the operator's kopf side logs in: as the operator's own client does (the pod's
service-account files at the address the kubelet gives), never the hard-coded
https://kubernetes.default.svc of kopf's login_with_service_account, which needs cluster
DNS (without it the operator exited after ~55 s, a crash loop).

The service-account files are written to a temporary directory and the client library's
two path constants pointed at them: a stand-in for the kubelet's projected volume only."""

from __future__ import annotations

from pathlib import Path

import kopf
import kubernetes.config.incluster_config as incluster
import pytest

from dedup_operator import handlers


@pytest.fixture
def pod_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("pod-token-1")
    ca.write_text("-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    return tmp_path


def test_in_a_pod_kopf_asks_the_service_address_with_the_pods_token(
    pod_service_account: Path,
) -> None:
    info = handlers.login(settings=kopf.OperatorSettings())
    assert info.server == "https://10.96.0.1:6443"
    assert (info.scheme or "").lower() == "bearer" and info.token == "pod-token-1"
    assert info.ca_path == str(pod_service_account / "ca.crt")
    assert not info.insecure


def test_a_rotated_token_is_read_again_on_the_next_login(pod_service_account: Path) -> None:
    """kopf logs in again on a 401: the projected token, rotated by the kubelet, is read
    anew."""
    handlers.login(settings=kopf.OperatorSettings())
    (pod_service_account / "token").write_text("pod-token-2")
    assert handlers.login(settings=kopf.OperatorSettings()).token == "pod-token-2"


def test_a_kubeconfig_wins_over_the_pod(
    pod_service_account: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:7443', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: from-kubeconfig}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    info = handlers.login(settings=kopf.OperatorSettings())
    assert info.server == "https://127.0.0.1:7443"
    assert info.token == "from-kubeconfig" and info.insecure
