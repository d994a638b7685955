"""pytest fixtures for the local cluster (local/dedup_local/cluster/).

`local_cluster`: one LocalCluster per session (3 nodes in 3 zones, fast control-plane
timings, the repo's CRDs), started on first use.
`cluster_namespace`: a fresh namespace per test (its default ServiceAccount exists),
deleted afterwards.
`container_cluster` / `container_namespace`: the same on a second cluster whose nodes run
the project's image in real containers (podman, runc: what users run), built from the
Dockerfile first if the checkout changed since the last build. Tests that break a node restore it themselves (in a finally).

The session `kube` fixture keeps its own control plane: its tests play kubelets on fake
nodes, which real node agents would disturb.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_local.cluster import ClusterTimings, LocalCluster
from dedup_local.image import ensure_image
from support.kube_fixtures import CRD_FILES, _wait_for_default_service_account


@dataclass(frozen=True)
class ClusterNamespace:
    """A namespace on the local cluster that exists for one test."""

    name: str
    cluster: LocalCluster
    api_client: ApiClient

    @property
    def kubeconfig_path(self) -> Path:
        return self.cluster.kubeconfig_path


def running_cluster(containers: bool = False) -> Iterator[LocalCluster]:
    """A started local cluster as the tests use it (3 nodes in 3 zones, fast timings, the
    repo's CRDs), stopped afterwards: the body of every cluster fixture."""
    if containers:
        ensure_image()
    cluster = LocalCluster(
        nodes=3, timings=ClusterTimings.fast(), crds=CRD_FILES, containers=containers
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    yield from running_cluster()


@pytest.fixture(scope="session")
def container_cluster() -> Iterator[LocalCluster]:
    yield from running_cluster(containers=True)


@pytest.fixture
def local_crds(local_cluster: LocalCluster) -> None:
    """The repo's CRDs on the local cluster as this checkout has them (server-side
    apply: idempotent): modules whose tests need them name it in `usefixtures`."""
    assert local_cluster.control_plane is not None
    local_cluster.control_plane.install_crds(CRD_FILES)


@pytest.fixture
def cluster_namespace(
    local_cluster: LocalCluster, request: pytest.FixtureRequest
) -> Iterator[ClusterNamespace]:
    yield from _namespace(local_cluster, request)


@pytest.fixture
def container_namespace(
    container_cluster: LocalCluster, request: pytest.FixtureRequest
) -> Iterator[ClusterNamespace]:
    yield from _namespace(container_cluster, request)


def _namespace(
    local_cluster: LocalCluster, request: pytest.FixtureRequest
) -> Iterator[ClusterNamespace]:
    api = local_cluster.api_client()
    core = client.CoreV1Api(api)
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{base or 'test'}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        _wait_for_default_service_account(core, name)
        yield ClusterNamespace(name=name, cluster=local_cluster, api_client=api)
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        api.close()  # type: ignore[no-untyped-call]
