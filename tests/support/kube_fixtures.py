"""pytest fixtures for the real kube part (see local/dedup_local/control_plane.py).

`kube`: one real control plane per test session (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler), started on first use.
`kube_namespace`: a fresh namespace per test, deleted afterwards.

Both hand out typed handles with `.api_client` (kubernetes.client.ApiClient, admin) and
`.kubeconfig_path`. When the binaries are missing the fixtures fail with the setup
command to run (`make setup-kube`); they never skip silently.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_local.control_plane import ControlPlane
from dedup_local.paths import REPO_ROOT
from support.session_parts import start_session_part

CRD_FILES = sorted((REPO_ROOT / "crds").glob("*.yaml"))


@dataclass(frozen=True)
class KubeCluster:
    """The session's control plane."""

    control_plane: ControlPlane
    api_client: ApiClient

    @property
    def kubeconfig_path(self) -> Path:
        return self.control_plane.kubeconfig_path

    @property
    def server(self) -> str:
        return self.control_plane.server


@dataclass(frozen=True)
class KubeNamespace:
    """A namespace that exists for the duration of one test."""

    name: str
    cluster: KubeCluster

    @property
    def api_client(self) -> ApiClient:
        return self.cluster.api_client

    @property
    def kubeconfig_path(self) -> Path:
        return self.cluster.kubeconfig_path


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    # The project's CRDs go in before the controllers start, so the garbage collector
    # watches DedupPipelines from the beginning (it rediscovers kinds only every 30s).
    made: list[ControlPlane] = []

    def start() -> ControlPlane:
        made.append(ControlPlane(with_controllers=True, crds=CRD_FILES))
        return made[-1].start()

    control_plane = start_session_part(
        request, "the session's control plane", start, lambda: made.pop().stop()
    )
    api_client = control_plane.api_client()
    try:
        yield KubeCluster(control_plane=control_plane, api_client=api_client)
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
        control_plane.stop()


def _wait_for_default_service_account(
    core: client.CoreV1Api, namespace: str, timeout: float = 30.0
) -> None:
    """Pods are only admitted once the service-account controller made `default`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


@pytest.fixture
def kube_namespace(kube: KubeCluster, request: pytest.FixtureRequest) -> Iterator[KubeNamespace]:
    core = client.CoreV1Api(kube.api_client)
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{base or 'test'}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        _wait_for_default_service_account(core, name)
        yield KubeNamespace(name=name, cluster=kube)
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def install_dedup_crd(cluster: KubeCluster) -> None:
    """Apply crds/*.yaml (server-side, idempotent) and wait until they are served."""
    cluster.control_plane.install_crds(CRD_FILES)


@pytest.fixture(scope="session")
def dedup_crd(kube: KubeCluster) -> KubeCluster:
    """The session's control plane with the DedupPipeline CRD installed."""
    install_dedup_crd(kube)
    return kube
