"""`dedup-worker`: run one worker's exactly-once deduplication (docs/worker.md).

Every flag can also come from an environment variable (named in --help), which is how the
operator configures worker pods. Runs standalone against any Kafka: no Kubernetes needed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from confluent_kafka import KafkaException

from dedup_contract import logs
from dedup_contract.exit_codes import (
    EXIT_CONFIG,
    EXIT_FENCED,
    EXIT_KAFKA,
    EXIT_STOPPED_ON_INPUT,
    EXIT_STORE,
)
from dedup_contract.ids import IdSpec
from dedup_contract.kafka_settings import (
    KafkaSettingsError,
    format_kafka_settings,
    parse_kafka_settings,
)
from dedup_contract.lease_clock import LeaseTiming
from dedup_contract.names import default_consumer_group
from dedup_contract.store import MiB, StoreConfig, StoreError
from dedup_contract.window import WindowPolicy, format_duration_ms, parse_duration_ms
from dedup_worker.config import LeaseSettings, WorkerConfig
from dedup_worker.fencing import AlwaysHeld, Fenced, FencingToken, LeaseToken
from dedup_worker.lease import Claim
from dedup_worker.loop import DedupWorker, StoppedOnInput
from dedup_worker.metrics import Health, WorkerMetrics, serve

log = logging.getLogger("dedup_worker")

_ENV_PREFIX = "DEDUP_"


def _env(flag: str) -> str:
    return _ENV_PREFIX + flag.upper().replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dedup-worker",
        description=(
            "Deduplicate one worker's share of a Kafka topic exactly once. Under ownership "
            "(--owned-topic, --workers W) worker w (--partition) reads every input partition "
            "i with i % W == w and every partition q of the internal topic with q % W == w, "
            "forwards each record whose id another worker owns to that owner's internal "
            "partition, drops ids already published within the window (kept in a RocksDB "
            "store), and publishes the ids it owns to output partition w, in Kafka "
            "transactions. Without --owned-topic it reads input partition P and publishes to "
            "output partition P. Malformed records go to the dead-letter topic with a reason."
        ),
        epilog=(
            "Every option can be set by environment variable DEDUP_<OPTION> (upper case, "
            "dashes as underscores), e.g. DEDUP_BOOTSTRAP_SERVERS. Exit codes: 0 stopped "
            "cleanly, 2 bad configuration, 3 fenced (the partition's Lease names another "
            "holder or a newer epoch, its transactional id belongs to a newer worker, or the "
            "Lease could not be taken at start; a Lease that cannot be renewed, e.g. while "
            "the API server is down, pauses the worker until it is renewed again), 4 stopped "
            "on input it may not drop, 5 store refused, 6 Kafka unreachable or refusing "
            "(e.g. no broker at --bootstrap-servers, topic missing, not authorised)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    def opt(flag: str, help: str, **kw: object) -> None:
        env = _env(flag)
        default = os.environ.get(env, kw.pop("default", None))
        p.add_argument(f"--{flag}", default=default, help=f"{help} [env {env}]", **kw)  # type: ignore[arg-type]

    opt("bootstrap-servers", "Kafka bootstrap servers, host:port[,host:port]")
    opt("input-topic", "topic to deduplicate")
    opt("output-topic", "topic receiving each id once")
    opt("dead-letter-topic", "topic for records without a valid id (with reason headers)")
    opt(
        "partition",
        "this worker's number: without ownership the input partition it reads; with it, "
        "the share of ids it owns; its output partition either way",
    )
    opt(
        "owned-topic",
        "the pipeline's internal topic: turns ownership on (each id published once by its "
        "owner however producers partition; needs --workers)",
    )
    opt("workers", "how many workers the ids are divided among (spec.partitions)")
    opt(
        "ownership-switch",
        "true: a store written before ownership is switched to it (the ids this worker owns "
        "added from every other output partition over the window), not refused; only with "
        "every worker of the pipeline stopped first (dedupctl switch-ownership)",
        default="false",
        choices=["true", "false"],
    )
    opt(
        "finalized",
        "true: the pipeline's upgrade to this release is finalized (dedupctl "
        "finalize-upgrade): the store is written at the newest format, which earlier "
        "releases cannot open; false: at the format the previous release reads",
        default="false",
        choices=["true", "false"],
    )
    opt("pipeline", "pipeline name (store ownership, transactional id, consumer group)")
    opt("namespace", "namespace of the pipeline", default="default")
    opt(
        "consumer-group",
        "consumer group for the committed input offsets (default: dedup-<pipeline>)",
    )
    opt("store-path", "directory of the RocksDB window (its own persistent volume)")
    opt(
        "id-source",
        "where the message id is",
        default="jsonField",
        choices=["jsonField", "header", "key"],
    )
    opt("id-field", "JSON field path (a.b.c) or header name holding the id", default="messageId")
    opt("window-duration", "ids older than this expire, e.g. 672h, 7d", default=None)
    opt("window-max-keys", "at most this many ids, oldest expire first", default=None)
    opt("batch-size", "records per transaction at most", default="5000")
    opt("linger-ms", "wait at most this long to fill a batch", default="20")
    opt("block-cache-mb", "RocksDB block cache", default="64")
    opt(
        "lookup-threads",
        "threads sharing each batch's store lookups; match the CPUs the worker may use",
        default=str(StoreConfig().lookup_threads),
    )
    opt("metrics-port", "port for /metrics, /healthz, /readyz (0 = off)", default="9400")
    opt(
        "metrics-address",
        "address the metrics port listens on (in a pod: its IP)",
        default="0.0.0.0",
    )
    opt(
        "lease-name",
        "the partition's Lease (coordination.k8s.io) in --namespace that fences its "
        "workers; unset = standalone, Kafka's transactional fence only",
    )
    opt(
        "holder-identity",
        "this worker's name in the Lease, the pod name (default: <lease-name>-e<epoch>)",
    )
    opt("epoch", "the epoch this worker was started for (>= 1), kept in the Lease")
    opt("lease-duration", "how long the Lease holds unrenewed (renewed every third)", default="15s")
    opt(
        "lease-acquire-timeout",
        "how long to wait for an older epoch's Lease to expire (default: 2 x lease duration)",
    )
    opt("kubeconfig", "kubeconfig for the API server (default: in-cluster config)")
    opt(
        "kafka-config",
        "extra librdkafka settings, key=value[,key=value] (e.g. security)",
        default="",
    )
    opt("log-level", "DEBUG, INFO, WARNING", default="INFO")
    opt("log-format", "json or text", default="json", choices=["json", "text"])
    return p


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    missing = [
        flag
        for flag in (
            "bootstrap_servers",
            "input_topic",
            "output_topic",
            "partition",
            "pipeline",
            "store_path",
        )
        if getattr(args, flag) in (None, "")
    ]
    if missing:
        names = ", ".join(f"--{m.replace('_', '-')} ({_env(m)})" for m in missing)
        raise ValueError(f"missing required settings: {names}")
    if args.window_duration is None and args.window_max_keys is None:
        raise ValueError("set a window: --window-duration and/or --window-max-keys")
    window = WindowPolicy(
        duration_ms=parse_duration_ms(args.window_duration) if args.window_duration else None,
        max_keys=_int(args.window_max_keys, "window-max-keys") if args.window_max_keys else None,
    )
    try:
        kafka_settings = parse_kafka_settings(args.kafka_config)
    except KafkaSettingsError as exc:
        raise ValueError(f"--kafka-config: {exc}") from None
    metrics_port = _int(args.metrics_port, "metrics-port")
    lease = None
    if args.lease_name:
        if not args.epoch:
            raise ValueError("--lease-name needs --epoch (DEDUP_EPOCH)")
        epoch = _int(args.epoch, "epoch")
        lease = LeaseSettings(
            name=args.lease_name,
            holder_identity=args.holder_identity or f"{args.lease_name}-e{epoch}",
            epoch=epoch,
            duration_s=_seconds(args.lease_duration, "lease-duration"),
            acquire_timeout_s=(
                _seconds(args.lease_acquire_timeout, "lease-acquire-timeout")
                if args.lease_acquire_timeout
                else None
            ),
            kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        )
    return WorkerConfig(
        bootstrap_servers=args.bootstrap_servers,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        dead_letter_topic=args.dead_letter_topic or None,
        partition=_int(args.partition, "partition"),
        pipeline=args.pipeline,
        namespace=args.namespace,
        consumer_group=args.consumer_group or default_consumer_group(args.pipeline),
        store_path=Path(args.store_path),
        id_spec=_id_spec(args.id_source, args.id_field),
        window=window,
        batch_size=_int(args.batch_size, "batch-size"),
        linger_ms=_int(args.linger_ms, "linger-ms"),
        store=StoreConfig(
            block_cache_bytes=_int(args.block_cache_mb, "block-cache-mb") * MiB,
            lookup_threads=_int(args.lookup_threads, "lookup-threads"),
        ),
        kafka_settings=kafka_settings,
        metrics_port=metrics_port or None,
        metrics_address=args.metrics_address,
        owned_topic=args.owned_topic or None,
        workers=_int(args.workers, "workers") if args.workers else None,
        ownership_switch=args.ownership_switch == "true",
        finalized=args.finalized == "true",
        lease=lease,
    )


def _id_spec(source: str, field: str) -> IdSpec:
    """The id rules (the contract's), with an error in the flags' terms."""
    try:
        return IdSpec(source=source, field=field)  # type: ignore[arg-type]
    except ValueError as invalid:
        raise ValueError(f"--id-{invalid}") from None


def arguments(config: WorkerConfig) -> list[str]:
    """The `dedup-worker` flags that reproduce `config` (the inverse of
    `config_from_args`), for whatever starts workers: tests, the demo, pod specs."""
    argv = [
        "--bootstrap-servers", config.bootstrap_servers,
        "--input-topic", config.input_topic,
        "--output-topic", config.output_topic,
        "--partition", str(config.partition),
        "--pipeline", config.pipeline,
        "--namespace", config.namespace,
        "--consumer-group", config.group,
        "--store-path", str(config.store_path),
        "--id-source", config.id_spec.source,
        "--id-field", config.id_spec.field,
        "--batch-size", str(config.batch_size),
        "--linger-ms", str(config.linger_ms),
        "--block-cache-mb", str(config.store.block_cache_bytes // MiB),
        "--lookup-threads", str(config.store.lookup_threads),
        "--metrics-port", str(config.metrics_port or 0),
        "--metrics-address", config.metrics_address,
    ]  # fmt: skip
    if config.lease is not None:
        lease = config.lease
        argv += [
            "--lease-name", lease.name,
            "--holder-identity", lease.holder_identity,
            "--epoch", str(lease.epoch),
            "--lease-duration", f"{lease.duration_s}s",
        ]  # fmt: skip
        if lease.acquire_timeout_s is not None:
            argv += ["--lease-acquire-timeout", f"{lease.acquire_timeout_s}s"]
        if lease.kubeconfig is not None:
            argv += ["--kubeconfig", str(lease.kubeconfig)]
    if config.dead_letter_topic:
        argv += ["--dead-letter-topic", config.dead_letter_topic]
    if config.window.duration_ms is not None:
        argv += ["--window-duration", format_duration_ms(config.window.duration_ms)]
    if config.window.max_keys is not None:
        argv += ["--window-max-keys", str(config.window.max_keys)]
    if config.owned_topic is not None and config.workers is not None:
        argv += ["--owned-topic", config.owned_topic, "--workers", str(config.workers)]
        if config.ownership_switch:
            argv += ["--ownership-switch", "true"]
        if config.finalized:
            argv += ["--finalized", "true"]
    if config.kafka_settings:
        argv += ["--kafka-config", format_kafka_settings(config.kafka_settings.items())]
    return argv


def _seconds(text: str, flag: str) -> int:
    ms = parse_duration_ms(text)
    if ms % 1000:
        raise ValueError(f"--{flag} must be whole seconds, got {text!r}")
    return ms // 1000


def _int(text: str, flag: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"--{flag} must be a whole number, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"dedup-worker: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    metrics = WorkerMetrics(config.pipeline, config.partition)
    health = Health()
    stopping = threading.Event()
    worker: DedupWorker | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("stopping after the batch in hand", extra={"signal": signal.Signals(signum).name})
        stopping.set()
        if worker is not None:
            worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if config.metrics_port:
        try:
            serve(metrics, health, config.metrics_port, config.metrics_address)
        except OSError as exc:
            log.error(
                "cannot serve metrics on %s:%d: %s",
                config.metrics_address,
                config.metrics_port,
                exc,
            )
            return EXIT_CONFIG
    lease: LeaseToken | None = None
    try:
        fencing: FencingToken = AlwaysHeld()
        if config.lease is not None:
            try:
                lease = _lease_token(config)
            except ValueError as exc:
                log.error("%s", exc)
                return EXIT_CONFIG
            if not lease.acquire(config.lease.acquire_timeout, stopping):
                log.info("stopped before taking the Lease")
                return 0
            lease.start_renewing()
            fencing = lease
        worker = DedupWorker(config, fencing=fencing, metrics=metrics, health=health)
        if stopping.is_set():
            worker.stop()
        worker.run()
    except Fenced as exc:
        if worker is None:  # refused the Lease at start; the loop counts its own
            metrics.fencing_events.inc()
        last = worker.last_commit_at if worker is not None else None
        log.error("fenced: %s", exc, extra={"exit_code": EXIT_FENCED, "last_commit": last})
        if lease is not None:
            lease.stop_renewing()
        return EXIT_FENCED
    except StoppedOnInput as exc:
        log.error("%s", exc)
        return _released(lease, EXIT_STOPPED_ON_INPUT)
    except StoreError as exc:
        log.error("store refused: %s", exc)
        return _released(lease, EXIT_STORE)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        log.error(
            "kafka failed: %s (bootstrap servers %s)",
            getattr(error, "str", lambda: str(error))(),
            config.bootstrap_servers,
            extra={"exit_code": EXIT_KAFKA, "kafka_error": getattr(error, "name", lambda: "")()},
        )
        return _released(lease, EXIT_KAFKA)
    finally:
        if lease is not None:
            lease.stop_renewing()  # a no-op after release; else the Lease lapses by itself
    _released(lease, 0)
    log.info("stopped cleanly")
    return 0


def _lease_token(config: WorkerConfig) -> LeaseToken:
    """The Lease-backed token for `config.lease`; ValueError on unusable settings."""
    assert config.lease is not None
    settings = config.lease
    claim = Claim(settings.holder_identity, settings.epoch, settings.duration_s)
    timing = LeaseTiming.for_duration(settings.duration_s)
    return LeaseToken.connect(config.namespace, settings.name, claim, timing, settings.kubeconfig)


def _released(lease: LeaseToken | None, code: int) -> int:
    """Leave the Lease expired after a stop with everything closed (no transaction
    open): the operator may start the next epoch without waiting out the duration, and a
    restart of this pod's worker takes it back as its own."""
    if lease is not None:
        lease.release()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
