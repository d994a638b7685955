"""A real single-node Apache Kafka broker (KRaft: broker and controller in one JVM).

Runs the jars that `scripts/setup-kafka.sh` caches under
`$DEDUP_CACHE/kafka-$KAFKA_VERSION/libs` on free loopback ports, in a data directory of
its own, with transactions usable on one broker. Tests use it through the session
fixture in `tests/support/kafka_fixtures.py`; chaos tests `kill()` and `restart()` it
(same data directory, same ports).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from dedup_local.paths import MissingArtifact, cache_dir, free_port, versions
from dedup_local.patience import PatientDeadline, machine_load

Key = bytes | str | None
Value = bytes | str | None
Headers = Sequence[tuple[str, bytes | str | None]] | None
Record = tuple[Key, Value, Headers]

_BROKER_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"

# Broker settings for tests on one node. Anything here can be overridden per broker.
_DEFAULTS: dict[str, str] = {
    # One replica of everything, including the internal topics transactions rely on.
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "8",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    # Let tests use short consumer session timeouts (the default floor is 6 s).
    "group.min.session.timeout.ms": "1000",
    # Transactions left open by a killed producer are aborted after the producer's
    # transaction.timeout.ms; check for them every second instead of every 10 s.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    # Small files and buffers: tests write little, and the heap is 1 GiB.
    "log.segment.bytes": str(16 * 1024 * 1024),
    "offsets.topic.segment.bytes": str(16 * 1024 * 1024),
    "transaction.state.log.segment.bytes": str(16 * 1024 * 1024),
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "log.retention.check.interval.ms": "60000",
    # Register with the controller (same JVM) and get unfenced quickly.
    "broker.heartbeat.interval.ms": "500",
    # After a kill, a restarted broker cannot register until the controller expires the
    # old registration's session: keep that wait short.
    "broker.session.timeout.ms": "3000",
    "controller.quorum.election.timeout.ms": "1000",
    "num.io.threads": "4",
    "num.network.threads": "2",
}

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def kafka_home() -> Path:
    """Where `scripts/setup-kafka.sh` put the broker jars (`libs/`)."""
    return cache_dir() / f"kafka-{versions()['KAFKA_VERSION']}"


def _libs() -> Path:
    libs = kafka_home() / "libs"
    broker_jar = f"kafka_{versions()['KAFKA_SCALA_VERSION']}-{versions()['KAFKA_VERSION']}.jar"
    if not (libs / broker_jar).is_file():
        raise MissingArtifact(f"Kafka broker jars not found in {libs}; run: make setup-kafka")
    return libs


def java_path(needed_by: str = "Kafka") -> str:
    """The java to run: $JAVA_HOME's, else the one on PATH (MissingArtifact if none)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise MissingArtifact(f"java not found on PATH ({needed_by} needs Java 17+)")
    return java


def _cds_archive(java: str, libs: Path) -> Path:
    """Where the broker's class-data-sharing archive lives for this JVM and jar set.

    The first broker that stops cleanly writes it (-XX:ArchiveClassesAtExit); later JVMs
    map it (-XX:SharedArchiveFile) and start with about 2 s less CPU. A stale or foreign
    archive is ignored by the JVM, so the key only has to change when either side does.
    """
    java_bin = Path(java).resolve()
    jars = sorted((p.name, p.stat().st_size) for p in libs.glob("*.jar"))
    key = f"{java_bin}:{java_bin.stat().st_mtime_ns}:{jars}"
    return kafka_home() / "cds" / f"broker-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path.name})"
    return "\n".join(text[-lines:])


class KafkaBrokerError(RuntimeError):
    """The broker did not start, or a request to it failed."""


class _PortInUse(KafkaBrokerError):
    """The JVM exited because its listener port was taken."""


class KafkaBroker:
    """One Kafka broker+controller JVM on loopback, for tests.

    `stop()`, `kill()` and `restart()` keep the data directory and the ports, so data
    written before survives and clients keep their bootstrap address. The context
    manager stops the broker and removes a data directory it created itself.

    `host` is the address its client listener binds and advertises: 127.0.0.1 by
    default; a `ControlPlane(kubelets=True)`'s `host` makes it reachable from pods on
    real nodes too (docs/development.md, "Real nodes"). Its controller stays on loopback.

    `start_timeout_s` is the start's wait on an idle machine; on a busy one it is
    stretched by the load per core, up to 4x (dedup_local.patience).
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        config: Mapping[str, str | int] | None = None,
        heap: str = "1g",
        jvm_options: Sequence[str] = (),
        start_timeout_s: float = 90.0,
        host: str = "127.0.0.1",
        load: Callable[[], tuple[float, int]] = machine_load,
    ) -> None:
        self.host = host
        self._load = load
        """The machine's (load, cores) that stretches start_timeout_s (a test's simulated
        load replaces it)."""
        self._owns_dir = data_dir is None
        self._may_move_ports = port is None and controller_port is None
        self._log_offset = 0
        self.data_dir = (
            Path(data_dir)
            if data_dir is not None
            else Path(tempfile.mkdtemp(prefix="dedup-kafka-"))
        )
        self.port = port if port is not None else free_port()
        self.controller_port = controller_port if controller_port is not None else free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.heap = heap
        self.jvm_options = list(jvm_options)
        self.start_timeout_s = start_timeout_s
        self._config = {k: str(v) for k, v in (config or {}).items()}
        self._proc: subprocess.Popen[bytes] | None = None
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None
        self._cds_dump: Path | None = None
        self._cds_target: Path | None = None
        self.start_seconds: float | None = None
        """How long the last start() took (formatting included), for reporting."""
        atexit.register(self._atexit)

    # ----------------------------------------------------------------------- paths

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        """The broker's log (Log4j) and the JVM's stdout/stderr, appended across restarts."""
        return self.data_dir / "broker.log"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "data"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Start the JVM (formatting the storage on first start) and wait until ready."""
        if self.is_running():
            return self
        t0 = time.monotonic()
        # Another process may take a port free_port() picked before the JVM binds it. On
        # the very first start, with ports of our choosing, pick again; once clients know
        # the address, a restart must keep it (and fails if it cannot).
        attempts = 3 if self._may_move_ports else 1
        # start_timeout_s is the wait on an idle machine; a busy one waits longer
        # (dedup_local.patience: stretched by the load per core, at most 4x).
        patience = PatientDeadline(self.start_timeout_s, self._load)
        for attempt in range(1, attempts + 1):
            try:
                self._launch(patience)
                break
            except _PortInUse:
                if attempt == attempts:
                    raise
                self.port, self.controller_port = free_port(), free_port()
                while self.controller_port == self.port:
                    self.controller_port = free_port()
        self._may_move_ports = False
        self.start_seconds = time.monotonic() - t0
        return self

    def _launch(self, patience: PatientDeadline) -> None:
        libs = _libs()
        java = java_path()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        classpath = f"{libs}/*"
        archive = _cds_archive(java, libs)
        cds: list[str] = []
        if archive.is_file():
            cds = [f"-XX:SharedArchiveFile={archive}"]
        if not (self.log_dir / "meta.properties").is_file():
            self._format(java, classpath, cds)
        if not cds:
            self._cds_dump = self.data_dir / f"cds-{uuid.uuid4().hex}.jsa"
            self._cds_target = archive
            cds = [f"-XX:ArchiveClassesAtExit={self._cds_dump}"]
        cmd = [
            java,
            f"-Xms{_min_heap(self.heap)}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            *cds,
            *self.jvm_options,
            "-cp",
            classpath,
            _BROKER_MAIN,
            str(self.properties_file),
        ]
        with self.log_file.open("ab") as out:
            self._log_offset = out.tell()
            out.write(f"\n==== start {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
            out.flush()
            # Own process group, so stop()/kill() reach the JVM and anything it starts.
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        try:
            self._wait_ready(patience)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut the broker down cleanly (SIGTERM), or SIGKILL it after `timeout_s`."""
        self._close_clients()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
        # Anything left in the group (the JVM starts nothing, but be sure).
        self._signal_group(proc, signal.SIGKILL)
        self._proc = None
        # A JVM that exited by itself wrote its class archive completely; a killed one not.
        self._keep_cds_archive(complete=proc.returncode != -signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the broker's process group at once (a crash: no clean shutdown)."""
        self._close_clients()
        proc = self._proc
        if proc is None:
            return
        self._signal_group(proc, signal.SIGKILL)
        proc.wait()
        self._proc = None
        self._keep_cds_archive(complete=False)

    def restart(self, *, hard: bool = False) -> Self:
        """Stop (or with `hard`, kill) and start again on the same data dir and ports."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the broker and remove the data directory if this object created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --------------------------------------------------------------------- clients

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings to reach this broker, plus `extra`
        (e.g. `broker.client_config(**{"transactional.id": "t1"})`)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        conf.update(extra)
        return conf

    def admin(self) -> AdminClient:
        """A shared AdminClient (recreated after a restart)."""
        if self._admin is None:
            self._admin = AdminClient(self.client_config(**{"socket.timeout.ms": 10000}))
        return self._admin

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str | int] | None = None,
        *,
        timeout_s: float = 30.0,
    ) -> None:
        """Create a topic (replication factor 1) and wait until every partition has a leader."""
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=1,
            config={k: str(v) for k, v in (config or {}).items()},
        )
        patience = PatientDeadline(timeout_s)  # a busy machine waits longer
        futures = self.admin().create_topics([topic], operation_timeout=patience.left_s())
        try:
            futures[name].result(timeout=patience.left_s())
        except KafkaException as exc:
            raise KafkaBrokerError(f"create topic {name!r}: {exc}") from exc
        self._wait_partitions(name, partitions, patience)

    def grow_topic(self, name: str, partitions: int, *, timeout_s: float = 30.0) -> None:
        """Grow a topic to `partitions` and wait until the broker serves them all with a
        leader: CreatePartitions returns once the controller has committed it, and a broker
        applies the new metadata a little later (longer on a busy machine)."""
        patience = PatientDeadline(timeout_s)  # a busy machine waits longer
        futures = self.admin().create_partitions(
            [NewPartitions(name, partitions)], operation_timeout=patience.left_s()
        )
        try:
            futures[name].result(timeout=patience.left_s())
        except KafkaException as exc:
            raise KafkaBrokerError(f"grow topic {name!r} to {partitions}: {exc}") from exc
        self._wait_partitions(name, partitions, patience)

    def _wait_partitions(self, name: str, partitions: int, patience: PatientDeadline) -> None:
        while True:
            md = self.admin().list_topics(topic=name, timeout=5)
            tmd = md.topics.get(name)
            if (
                tmd is not None
                and tmd.error is None
                and len(tmd.partitions) == partitions
                and all(p.leader >= 0 and p.error is None for p in tmd.partitions.values())
            ):
                return
            if patience.expired():
                raise KafkaBrokerError(
                    f"topic {name!r} has no leader for every partition after {patience.describe()}"
                )
            time.sleep(0.05)

    def partitions(self, topic: str, timeout_s: float = 10.0) -> list[int]:
        """The partition ids of an existing topic."""
        md = self.admin().list_topics(topic=topic, timeout=timeout_s)
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None:
            raise KafkaBrokerError(f"topic {topic!r}: {tmd.error if tmd else 'not found'}")
        return sorted(tmd.partitions)

    def produce(
        self,
        topic: str,
        records: Iterable[Record],
        partition: int | None = None,
        *,
        timeout_s: float = 30.0,
    ) -> None:
        """Produce (key, value, headers) records (idempotent, acks=all) and flush."""
        if self._producer is None:
            self._producer = Producer(
                self.client_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 5})
            )
        records_kwargs = (
            {"key": key, "value": value, "headers": list(headers) if headers else None}
            | ({} if partition is None else {"partition": partition})
            for key, value, headers in records
        )
        produce_all(self._producer, topic, records_kwargs, timeout_s=timeout_s)

    def read_committed(
        self,
        topic: str,
        partition: int | None = None,
        *,
        timeout_s: float = 30.0,
        settle_s: float = 10.0,
    ) -> list[Message]:
        """`read_committed` (the module function) on this broker."""
        parts = [partition] if partition is not None else self.partitions(topic)
        return read_committed(
            self.bootstrap,
            topic,
            parts,
            timeout_s=timeout_s,
            settle_s=settle_s,
            client=self.client_config(),
        )

    # --------------------------------------------------------------------- internal

    def _write_config(self) -> None:
        settings = dict(_DEFAULTS)
        settings.update(
            {
                "process.roles": "broker,controller",
                "node.id": "1",
                "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
                "listeners": (
                    f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
                ),
                "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": str(self.log_dir),
            }
        )
        settings.update(self._config)
        self.properties_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log=self.log_file))

    def _format(self, java: str, classpath: str, cds: Sequence[str]) -> None:
        cmd = [
            java,
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            *cds,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
            _STORAGE_TOOL,
            "format",
            # One argument: an id may start with "-", which argparse would take for a flag.
            f"--cluster-id={_cluster_id()}",
            "--config",
            str(self.properties_file),
            "--ignore-formatted",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if res.returncode != 0:
            raise KafkaBrokerError(
                f"formatting {self.log_dir} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
            )

    def _wait_ready(self, patience: PatientDeadline) -> None:
        """Metadata answers with this broker, and a transactional producer can initialise
        (so the transaction coordinator and its log are up)."""
        # Probes: connection errors are expected until the broker listens; keep them quiet.
        quiet = {"log_level": 0}
        admin = AdminClient(self.client_config(**quiet, **{"socket.timeout.ms": 5000}))
        while True:
            self._check_alive()
            try:
                md = admin.list_topics(timeout=1)
                if md.brokers:
                    break
            except KafkaException:
                pass
            self._check_deadline(patience, "metadata")
            time.sleep(0.1)
        last: Exception | None = None
        while True:
            self._check_alive()
            producer = Producer(
                self.client_config(
                    **quiet, **{"transactional.id": f"dedup-local-ready-{uuid.uuid4().hex}"}
                )
            )
            try:
                producer.init_transactions(5)
                return
            except KafkaException as exc:
                last = exc
            finally:
                del producer
            self._check_deadline(patience, f"transaction coordinator: {last}")
            time.sleep(0.2)

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            self._proc = None
            with self.log_file.open("rb") as f:
                f.seek(self._log_offset)
                this_start = f.read().decode(errors="replace")
            error = _PortInUse if "Address already in use" in this_start else KafkaBrokerError
            raise error(
                f"Kafka broker exited with {code} during start; tail of {self.log_file}:\n"
                f"{_tail(self.log_file)}"
            )

    def _check_deadline(self, patience: PatientDeadline, what: str) -> None:
        if patience.expired():
            raise KafkaBrokerError(
                f"Kafka broker not ready ({what}) after {patience.describe()}; "
                f"tail of {self.log_file}:\n{_tail(self.log_file)}"
            )

    def _keep_cds_archive(self, complete: bool) -> None:
        """Publish the class archive a clean exit dumped; drop anything else."""
        dump, target = self._cds_dump, self._cds_target
        self._cds_dump = self._cds_target = None
        if dump is None or target is None:
            return
        if complete and dump.is_file() and dump.stat().st_size > 0 and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(dump, target)
            for stale in target.parent.glob("broker-*.jsa"):  # other JVMs or jar sets
                if stale != target:
                    stale.unlink(missing_ok=True)
        dump.unlink(missing_ok=True)

    def _close_clients(self) -> None:
        if self._producer is not None:
            self._producer.flush(1)
            self._producer = None
        self._admin = None

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def _atexit(self) -> None:
        """The interpreter is exiting without close(): leave no JVM or temp dir behind."""
        if self._proc is not None:
            self.kill()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _min_heap(heap: str) -> str:
    """Initial heap: a quarter of the maximum, at least 128m (e.g. "1g" -> "256m")."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024}
    suffix = heap[-1].lower()
    mib = float(heap[:-1]) * units[suffix] if suffix in units else float(heap) / 2**20
    return f"{max(128, int(mib // 4))}m"


def _watermark_consumer(settings: Mapping[str, Any], isolation: str) -> Consumer:
    return Consumer(
        {
            **settings,
            "group.id": f"dedup-local-reader-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )


def read_committed(
    bootstrap: str,
    topic: str,
    partitions: Sequence[int],
    *,
    timeout_s: float = 30.0,
    settle_s: float = 10.0,
    client: Mapping[str, Any] | None = None,
) -> list[Message]:
    """Every committed record of the partitions, from the beginning to the current end
    (the last stable offset), in partition then offset order. An independent reader:
    assign() with isolation.level=read_committed, no group, nothing committed.

    `commit_transaction()` returns before the broker has written the commit markers into
    the data partitions, and until then the records are past the last stable offset. So
    first wait up to `settle_s` for the last stable offset to reach the high watermark
    (every transaction complete); what is still open after that is not returned.
    """
    settings = {"bootstrap.servers": bootstrap, **(client or {})}
    committed = _watermark_consumer(settings, "read_committed")
    try:
        ends = _settled_ends(settings, committed, topic, partitions, timeout_s, settle_s)
        if not ends:
            return []
        committed.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        out: dict[int, list[Message]] = {p: [] for p in ends}
        pending = set(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise KafkaBrokerError(
                    f"read_committed({topic!r}): partitions {sorted(pending)} did not reach "
                    f"their end {ends} within {timeout_s}s"
                )
            msg = committed.poll(0.2)
            if msg is not None:
                err = msg.error()
                p = msg.partition()
                if err is None:
                    if p in pending and msg.offset() < ends[p]:
                        out[p].append(msg)
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaBrokerError(f"read_committed({topic!r}) [{p}]: {err}")
            for tp in committed.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= 0 and tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return [m for p in sorted(out) for m in out[p]]
    finally:
        committed.close()


def _settled_ends(
    settings: Mapping[str, Any],
    committed: Consumer,
    topic: str,
    partitions: Sequence[int],
    timeout_s: float,
    settle_s: float,
) -> dict[int, int]:
    """Per non-empty partition, its last stable offset once it equals the high
    watermark (or when `settle_s` has passed)."""
    uncommitted = _watermark_consumer(settings, "read_uncommitted")
    try:
        deadline = time.monotonic() + settle_s
        while True:
            ends: dict[int, int] = {}
            settled = True
            for p in partitions:
                tp = TopicPartition(topic, p)
                # With read_committed the high mark reported is the last stable offset.
                low, stable = committed.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
                _, high = uncommitted.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
                settled = settled and stable >= high
                if stable > low:
                    ends[p] = stable
            if settled or time.monotonic() > deadline:
                return ends
            time.sleep(0.05)
    finally:
        uncommitted.close()


def produce_all(
    producer: Producer,
    topic: str,
    records: Iterable[Mapping[str, Any]],
    *,
    timeout_s: float = 30.0,
) -> int:
    """Produce each record (keyword arguments of `Producer.produce`), waiting for room
    when the local queue is full, then flush; raises if any record was not delivered."""
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    count = 0
    for record in records:
        while True:
            try:
                producer.produce(topic, on_delivery=on_delivery, **record)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining:
        raise KafkaBrokerError(f"{remaining} records to {topic!r} not delivered in {timeout_s}s")
    if errors:
        raise KafkaBrokerError(f"produce to {topic!r} failed: {errors[0]}")
    return count


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: Sequence[int]
) -> list[int]:
    """The offsets `group` has committed for the partitions (-1001 where none), read
    without joining the group. Not waiting for stable offsets: with read_committed (the
    client's default) the broker holds the answer while a transaction has offsets pending
    (KIP-447), e.g. one left open by a killed worker until its successor fences it or it
    times out; the offsets committed so far are what is asked for."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    deadline = time.monotonic() + 60
    try:
        while True:  # a busy broker (the suite's groups side by side) may answer late
            try:
                found = consumer.committed(
                    [TopicPartition(topic, p) for p in partitions], timeout=10
                )
                return [int(tp.offset) for tp in found]
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retriable = isinstance(err, KafkaError) and (
                    err.retriable() or err.code() == KafkaError._TIMED_OUT
                )
                if not retriable or time.monotonic() > deadline:
                    raise
    finally:
        consumer.close()
