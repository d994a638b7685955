"""Lease fencing of real worker processes against the real kube-apiserver and Kafka: the
worker takes its partition's Lease before it starts, renews it, refuses a Lease of a newer
epoch, stops when the Lease is taken over, pauses when it can no longer reach the API
server — before anyone else may take the Lease — and exits only once it finds the Lease
taken over; output stays exact across the handover.

The tests play the operator: they create the Lease, move it to the next epoch and start
the replacement worker with that epoch. Short leases (5 s) keep them quick."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_contract.exit_codes import EXIT_FENCED
from dedup_contract.lease_clock import LeaseTiming
from dedup_contract.timefmt import format_micro_time
from dedup_local.cluster.proxy import ApiProxy
from dedup_local.paths import free_port
from dedup_worker.cli import main
from dedup_worker.config import LeaseSettings, WorkerConfig
from dedup_worker.fencing import Fenced, LeaseToken
from dedup_worker.lease import Claim
from support.fencing_helpers import (
    Streams,
    fenced_lines,
    log_records,
    tail,
    wait_committed,
    wait_exit,
    wait_for_log,
)
from support.kube_fixtures import KubeNamespace
from support.worker_helpers import (
    event,
    output_ids,
    produce,
    start_worker,
    unique,
    worker_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]


@pytest.fixture
def streams() -> Iterator[Streams]:
    """Input streams started by the test, stopped at its end whatever happens."""
    with Streams() as started:
        yield started


LEASE_S = 5
TIMING = LeaseTiming.for_duration(LEASE_S)
PAUSED = "paused: the Lease hold lapsed; no consuming or committing until it is renewed"


@pytest.fixture
def leases(kube_namespace: KubeNamespace) -> Any:
    return client.CoordinationV1Api(kube_namespace.api_client)


def make_pipeline(kafka: Any, tmp_path: Path, ns: KubeNamespace, **overrides: Any) -> WorkerConfig:
    name = unique("lease")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    return replace(worker_config(kafka.bootstrap, tmp_path, name, **overrides), namespace=ns.name)


def with_lease(
    cfg: WorkerConfig, epoch: int, kubeconfig: Path, store: Path | None = None
) -> WorkerConfig:
    name = f"{cfg.pipeline}-p{cfg.partition}"
    lease = LeaseSettings(name, f"{name}-e{epoch}", epoch, LEASE_S, kubeconfig=kubeconfig)
    return replace(cfg, lease=lease, store_path=store or cfg.store_path)


def create_lease(
    leases: Any,
    ns: str,
    name: str,
    *,
    holder: str | None = None,
    transitions: int = 0,
    renewed: datetime | None = None,
) -> Any:
    spec: dict[str, Any] = {"leaseTransitions": transitions, "leaseDurationSeconds": LEASE_S}
    if holder:
        spec["holderIdentity"] = holder
    if renewed:
        spec["renewTime"] = spec["acquireTime"] = format_micro_time(renewed)
    body = {"metadata": {"name": name, "labels": {"app": "dedup-test"}}, "spec": spec}
    return leases.create_namespaced_lease(ns, body)


def expiry(lease: Any) -> datetime:
    return lease.spec.renew_time + timedelta(seconds=lease.spec.lease_duration_seconds)


def ts(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")


def test_worker_takes_a_free_lease_renews_it_and_releases_it_on_stop(
    kafka: Any, tmp_path: Path, kube_namespace: KubeNamespace, leases: Any
) -> None:
    ns = kube_namespace.name
    cfg = with_lease(
        make_pipeline(kafka, tmp_path, kube_namespace), 1, kube_namespace.kubeconfig_path
    )
    assert cfg.lease is not None
    create_lease(leases, ns, cfg.lease.name)  # as the operator does: free, epoch 0
    produce(kafka.bootstrap, cfg.input_topic, [event("a"), event("b"), event("a")])
    log = tmp_path / "worker.log"
    proc = start_worker(cfg, log)
    try:
        wait_for_log(log, "worker ready")
        taken = leases.read_namespaced_lease(cfg.lease.name, ns)
        assert taken.spec.holder_identity == cfg.lease.holder_identity
        assert taken.spec.lease_transitions == 1  # the epoch
        assert taken.spec.lease_duration_seconds == LEASE_S
        assert taken.metadata.labels == {"app": "dedup-test"}, "the operator's labels stay"
        time.sleep(TIMING.renew_every_s * 2)
        later = leases.read_namespaced_lease(cfg.lease.name, ns)
        assert later.spec.renew_time > taken.spec.renew_time, "renewed in the background"
        assert later.spec.acquire_time == taken.spec.acquire_time
        wait_committed(kafka.bootstrap, cfg.group, cfg.input_topic, 3, log)
    finally:
        proc.terminate()
    assert wait_exit(proc, log, 30) == 0, tail(log)
    released = leases.read_namespaced_lease(cfg.lease.name, ns)
    assert released.spec.holder_identity == cfg.lease.holder_identity
    assert released.spec.lease_transitions == 1
    assert expiry(released) <= datetime.now(UTC), "a clean stop leaves the Lease expired"
    assert [r["message"] for r in log_records(log)][-2:] == [
        "released the Lease",
        "stopped cleanly",
    ]
    assert output_ids(kafka.bootstrap, cfg.output_topic) == ["a", "b"]


def test_worker_of_an_old_epoch_exits_fenced_without_touching_kafka(
    kafka: Any, tmp_path: Path, kube_namespace: KubeNamespace, leases: Any
) -> None:
    ns = kube_namespace.name
    cfg = with_lease(
        make_pipeline(kafka, tmp_path, kube_namespace), 1, kube_namespace.kubeconfig_path
    )
    assert cfg.lease is not None
    # epoch 2 had it and is gone (expired long ago): epoch 1 must still not take it
    before = create_lease(
        leases,
        ns,
        cfg.lease.name,
        holder=f"{cfg.lease.name}-e2",
        transitions=2,
        renewed=datetime.now(UTC) - timedelta(hours=1),
    )
    log = tmp_path / "worker.log"
    code = wait_exit(start_worker(cfg, log), log, 60)
    text = log.read_text()
    assert code == EXIT_FENCED, text
    (line,) = fenced_lines(log)
    assert "is not ours to take: its epoch is 2" in line["message"], text
    assert "Traceback" not in text
    assert "initialising transactions" not in text, "no producer was created"
    assert not cfg.store_path.exists(), "no store was opened"
    after = leases.read_namespaced_lease(cfg.lease.name, ns)
    assert after.metadata.resource_version == before.metadata.resource_version


def test_worker_whose_lease_is_taken_over_stops_and_the_next_epoch_finishes_exactly(
    kafka: Any, tmp_path: Path, kube_namespace: KubeNamespace, leases: Any, streams: Streams
) -> None:
    ns, kubeconfig = kube_namespace.name, kube_namespace.kubeconfig_path
    base = make_pipeline(kafka, tmp_path, kube_namespace, batch_size=1000)
    old_cfg = with_lease(base, 1, kubeconfig)
    assert old_cfg.lease is not None
    create_lease(leases, ns, old_cfg.lease.name)
    stream = streams.start(kafka.bootstrap, base.input_topic)
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    old = start_worker(old_cfg, old_log)
    try:
        wait_for_log(old_log, "first transaction committed")
        # The "operator" moves the Lease to epoch 2 without waiting (a write conflict for
        # the old worker's next renew).
        lease = leases.read_namespaced_lease(old_cfg.lease.name, ns)
        lease.spec.holder_identity = f"{old_cfg.lease.name}-e2"
        lease.spec.lease_transitions = 2
        lease.spec.renew_time = datetime.now(UTC)
        leases.replace_namespaced_lease(old_cfg.lease.name, ns, lease)
        taken_over = time.time()
        code = wait_exit(old, old_log, 30)
    finally:
        if old.poll() is None:
            old.kill()
    exited = time.time()
    assert code == EXIT_FENCED, tail(old_log)
    (line,) = fenced_lines(old_log)
    assert "was taken over by" in line["message"] and "epoch 2" in line["message"]
    assert "Traceback" not in old_log.read_text()
    # Its last commit was sent while its last renew (before the takeover) still held, and
    # returned at most one commit's latency later.
    assert line["last_commit"] < taken_over + TIMING.renew_deadline_s + 1.0, line
    print(
        f"takeover {ts(taken_over)}, old's last commit {ts(line['last_commit'])}, "
        f"old exited {ts(exited)} ({exited - taken_over:.2f}s after the takeover)"
    )

    new_cfg = with_lease(base, 2, kubeconfig, store=tmp_path / "new-volume")
    new = start_worker(new_cfg, new_log)
    try:
        first = wait_for_log(new_log, "first transaction committed")
        assert first["commit_sent"] > line["last_commit"]
        stream.stop()
        wait_committed(kafka.bootstrap, base.group, base.input_topic, len(stream.ids), new_log)
    finally:
        new.terminate()
    assert wait_exit(new, new_log, 30) == 0, tail(new_log)
    assert output_ids(kafka.bootstrap, base.output_topic) == stream.expected
    final = leases.read_namespaced_lease(old_cfg.lease.name, ns)
    assert final.spec.holder_identity == f"{old_cfg.lease.name}-e2"
    assert final.spec.lease_transitions == 2


def test_worker_cut_off_from_the_api_server_pauses_and_exits_only_once_taken_over(
    kafka: Any, tmp_path: Path, kube_namespace: KubeNamespace, leases: Any, streams: Streams
) -> None:
    ns = kube_namespace.name
    server = kube_namespace.cluster.server  # https://127.0.0.1:<port>
    host, port = server.removeprefix("https://").rsplit(":", 1)
    proxy = ApiProxy((host, int(port))).start()  # the local cluster's cuttable proxy
    kubeconfig = yaml.safe_load(kube_namespace.kubeconfig_path.read_text())
    for entry in kubeconfig["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    cut_config = tmp_path / "through-proxy.kubeconfig"
    cut_config.write_text(yaml.safe_dump(kubeconfig))

    base = make_pipeline(kafka, tmp_path, kube_namespace, batch_size=1000)
    old_cfg = with_lease(base, 1, cut_config)
    assert old_cfg.lease is not None
    create_lease(leases, ns, old_cfg.lease.name)
    stream = streams.start(kafka.bootstrap, base.input_topic)
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    old = start_worker(old_cfg, old_log)
    new = None
    try:
        wait_for_log(old_log, "first transaction committed")
        time.sleep(TIMING.renew_every_s)  # a renew or two through the proxy
        proxy.partition()
        cut = time.time()
        wait_for_log(old_log, PAUSED, timeout_s=LEASE_S)
        paused_seen = time.time()

        # The "operator": wait until the Lease expired by its own renewTime + duration,
        # then start the next epoch, which takes it.
        lease = leases.read_namespaced_lease(old_cfg.lease.name, ns)
        assert lease.spec.holder_identity == old_cfg.lease.holder_identity
        expires = expiry(lease).timestamp()
        while time.time() < expires:
            time.sleep(0.05)
        assert old.poll() is None, "paused, not exited:\n" + tail(old_log)
        new_cfg = with_lease(
            base,
            lease.spec.lease_transitions + 1,
            kube_namespace.kubeconfig_path,
            store=tmp_path / "new-volume",
        )
        new = start_worker(new_cfg, new_log)
        first = wait_for_log(new_log, "first transaction committed")
        # The old worker reaches the API server again: its renew finds the next epoch's
        # hold (409, re-read) and only now does it exit, fenced, without committing.
        proxy.heal()
        healed = time.time()
        code = wait_exit(old, old_log, 30)
        exited = time.time()
        assert code == EXIT_FENCED, tail(old_log)
        stream.stop()
        wait_committed(kafka.bootstrap, base.group, base.input_topic, len(stream.ids), new_log)
    finally:
        if old.poll() is None:
            old.kill()
        if new is not None:
            new.terminate()
    assert new is not None and wait_exit(new, new_log, 30) == 0, tail(new_log)
    (line,) = fenced_lines(old_log)
    assert "was taken over by" in line["message"] and "epoch 2" in line["message"], line
    assert "Traceback" not in old_log.read_text()

    print(
        f"cut {ts(cut)}; old: paused by {ts(paused_seen)}, last commit {ts(line['last_commit'])}; "
        f"Lease expiry {ts(expires)}; new: first commit sent {ts(first['commit_sent'])}; "
        f"healed {ts(healed)}, old exited {ts(exited)}"
    )
    assert line["last_commit"] < expires <= first["commit_sent"]
    assert paused_seen < expires, "the old worker paused before the Lease expired for others"
    taken = leases.read_namespaced_lease(old_cfg.lease.name, ns)
    assert taken.spec.lease_transitions == 2
    assert output_ids(kafka.bootstrap, base.output_topic) == stream.expected


# -- the LeaseToken shell alone, in this process, on the real API server ------------------


def token(ns: KubeNamespace, name: str, epoch: int) -> LeaseToken:
    claim = Claim(f"{name}-e{epoch}", epoch, LEASE_S)
    return LeaseToken.connect(ns.name, name, claim, TIMING, ns.kubeconfig_path)


def test_token_keeps_its_hold_through_other_writers_harmless_changes(
    kube_namespace: KubeNamespace, leases: Any
) -> None:
    create_lease(leases, kube_namespace.name, "p0")
    mine = token(kube_namespace, "p0", 1)
    assert mine.acquire(timeout_s=10)
    mine.start_renewing()
    try:
        # the operator labels its Lease meanwhile: the next renew conflicts (409), re-reads,
        # finds itself still the holder at its epoch, and renews on top
        leases.patch_namespaced_lease(
            "p0", kube_namespace.name, {"metadata": {"labels": {"touched": "yes"}}}
        )
        before = leases.read_namespaced_lease("p0", kube_namespace.name).spec.renew_time
        time.sleep(TIMING.renew_deadline_s + TIMING.renew_every_s)
        assert mine.held(), mine.why_not_held()
        after = leases.read_namespaced_lease("p0", kube_namespace.name)
        assert after.spec.renew_time > before
        assert after.metadata.labels == {"app": "dedup-test", "touched": "yes"}
    finally:
        mine.release()
    assert not mine.held()


def test_token_waits_out_an_older_epochs_hold_and_is_refused_a_newer_one(
    kube_namespace: KubeNamespace, leases: Any
) -> None:
    renewed = datetime.now(UTC)
    create_lease(leases, kube_namespace.name, "p1", holder="p1-e1", transitions=1, renewed=renewed)
    # a hold of epoch 1 renewed just now: epoch 2 waits until renewTime + duration
    assert token(kube_namespace, "p1", 2).acquire(timeout_s=LEASE_S * 3)
    assert datetime.now(UTC) >= renewed + timedelta(seconds=LEASE_S)
    taken = leases.read_namespaced_lease("p1", kube_namespace.name)
    assert (taken.spec.holder_identity, taken.spec.lease_transitions) == ("p1-e2", 2)
    # ... whose live hold epoch 3 cannot wait out in 1 s, and epoch 1 may never take
    with pytest.raises(Fenced, match="not taken within 1s: held by p1-e2"):
        token(kube_namespace, "p1", 3).acquire(timeout_s=1)
    with pytest.raises(Fenced, match="not ours to take: its epoch is 2"):
        token(kube_namespace, "p1", 1).acquire(timeout_s=10)


@pytest.mark.cluster_group("kafka-spark")
def test_worker_that_cannot_reach_the_api_server_at_start_exits_fenced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "nowhere.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": f"https://127.0.0.1:{free_port()}",  # nobody listens
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    store = tmp_path / "store"
    argv = [
        "--bootstrap-servers", "127.0.0.1:1",
        "--input-topic", "in", "--output-topic", "out", "--partition", "0",
        "--pipeline", "p", "--store-path", str(store), "--window-duration", "1h",
        "--metrics-port", "0", "--log-format", "text",
        "--lease-name", "p-p0", "--epoch", "1", "--lease-duration", "3s",
        "--lease-acquire-timeout", "2s", "--kubeconfig", str(kubeconfig),
    ]  # fmt: skip
    assert main(argv) == EXIT_FENCED
    err = capsys.readouterr().err
    assert "fenced: Lease default/p-p0 not taken within 2s: API server: " in err, err
    assert "Traceback" not in err
    assert not store.exists()
