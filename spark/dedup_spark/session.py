"""The SparkSession of a job: `local[N]` for development, or Spark on Kubernetes.

On Kubernetes the job's pod is the driver in client mode (a CronJob's pod, or any pod
with the env below): it asks the API server for executor pods, which run the project's
image with `args: ["executor"]` (`dedup-entrypoint executor`, see entrypoint.py) and
connect back to the driver at its pod IP. The driver pod names itself
(`spark.kubernetes.driver.pod.name`), so Spark gives each executor pod an owner
reference to it and they go when it goes.

Environment of a driver pod (set by the operator's CronJob from the downward API):
`DEDUP_POD_IP` (status.podIP), `DEDUP_POD_NAME` (metadata.name), `DEDUP_NAMESPACE`
(metadata.namespace), and the API server as every pod gets it
(`KUBERNETES_SERVICE_HOST`/`_PORT`, service-account token and CA).

The Kafka connector jars go on `spark.jars` (the driver serves them to executors):
from the directory `DEDUP_SPARK_JARS` names (the image sets it; in a checkout the local
harness sets it to the cache that `make setup-spark` fills, `dedup_local.spark`).
`local[N]` sessions are built by `local_session`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dedup_contract.driver_pod import POD_FIELDS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JARS_ENV: Final = "DEDUP_SPARK_JARS"


class SessionError(Exception):
    """Spark cannot be started as configured (a message for a person)."""


@dataclass(frozen=True)
class SparkSettings:
    """Where and how big. `master`: `local[N]`, `k8s` (the cluster this pod runs in) or
    an explicit `k8s://https://host:port`."""

    master: str = "local[2]"
    image: str | None = None
    executors: int = 2
    executor_cores: int = 1
    executor_memory: str = "1g"
    # What each executor pod requests (Kubernetes quantities): small by default so a
    # development cluster can place them; size for production in the spec.
    executor_request_cores: str = "250m"
    driver_memory: str = "1g"
    conf: Mapping[str, str] = field(default_factory=dict)

    @property
    def on_kubernetes(self) -> bool:
        return self.master == "k8s" or self.master.startswith("k8s://")


def kubernetes_conf(settings: SparkSettings, env: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings of a client-mode driver in a pod (pure: from `env`)."""
    if settings.master != "k8s" and not settings.master.startswith("k8s://https://"):
        raise SessionError(
            f"--master {settings.master} is refused: the driver sends its service-account "
            "token to the master, so only k8s (the in-cluster API server) or "
            "k8s://https://HOST[:PORT] (verified with the cluster's CA) are allowed"
        )
    missing = [
        name
        for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", *POD_FIELDS)
        if not env.get(name) and (name.startswith("DEDUP") or settings.master == "k8s")
    ]
    if missing:
        raise SessionError(
            f"--master {settings.master} runs the driver in this pod, but {', '.join(missing)} "
            "is not set (a driver pod sets DEDUP_POD_IP/NAME/NAMESPACE from the downward API)"
        )
    if not settings.image:
        raise SessionError(f"--master {settings.master} needs --image for the executor pods")
    if settings.executors < 1:
        raise SessionError(f"--executors must be at least 1, not {settings.executors}")
    master = settings.master
    if master == "k8s":
        host = env["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        master = f"k8s://https://{host}:{env['KUBERNETES_SERVICE_PORT']}"
    conf = {
        "spark.master": master,
        # A driver that spark-submit started in cluster mode (`spark.kubernetes.submitInDriver`
        # in the properties file it was given) asks this address for executors, not
        # spark.master; Spark's default is https://kubernetes.default.svc, which needs the
        # cluster's DNS. The same API server either way.
        "spark.kubernetes.driver.master": master.removeprefix("k8s://"),
        "spark.submit.deployMode": "client",
        "spark.driver.host": env["DEDUP_POD_IP"],
        "spark.driver.bindAddress": env["DEDUP_POD_IP"],
        "spark.kubernetes.namespace": env["DEDUP_NAMESPACE"],
        "spark.kubernetes.driver.pod.name": env["DEDUP_POD_NAME"],
        "spark.kubernetes.container.image": settings.image,
        "spark.kubernetes.executor.podNamePrefix": _pod_prefix(env["DEDUP_POD_NAME"]),
        "spark.executor.instances": str(settings.executors),
        "spark.executor.cores": str(settings.executor_cores),
        "spark.executor.memory": settings.executor_memory,
        "spark.kubernetes.executor.request.cores": settings.executor_request_cores,
        # Tasks wait until every executor has registered (or 60 s), not just the first.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    }
    token = SERVICE_ACCOUNT_DIR / "token"
    ca = SERVICE_ACCOUNT_DIR / "ca.crt"
    if env.get("DEDUP_SERVICE_ACCOUNT_DIR"):  # tests and unusual mounts
        token = Path(env["DEDUP_SERVICE_ACCOUNT_DIR"]) / "token"
        ca = Path(env["DEDUP_SERVICE_ACCOUNT_DIR"]) / "ca.crt"
    # client mode's settings, and those of a cluster-mode driver (the mounted account's)
    for prefix in ("spark.kubernetes.authenticate", "spark.kubernetes.authenticate.driver.mounted"):
        conf[f"{prefix}.oauthTokenFile"] = str(token)
        conf[f"{prefix}.caCertFile"] = str(ca)
    return conf


def _pod_prefix(driver_pod: str) -> str:
    """Executor pods are named `<prefix>-exec-<n>`; a name must stay within 63 characters."""
    return driver_pod[:47].rstrip("-.")


def kafka_jars(env: Mapping[str, str]) -> list[Path]:
    """The Kafka connector jars: the directory `DEDUP_SPARK_JARS` names (the image sets
    it; in a checkout, the local harness points it at the cache `make setup-spark`
    fills)."""
    directory = env.get(JARS_ENV)
    if not directory:
        raise SessionError(
            f"{JARS_ENV} is not set: name the directory of Spark's Kafka source jars (the "
            "image sets it; in a checkout the local harness sets it after make setup-spark)"
        )
    jars = sorted(Path(directory).glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka") for j in jars):
        raise SessionError(f"{JARS_ENV}={directory} holds no spark-sql-kafka jar")
    return jars


JVM_OPTIONS: Final = "-XX:+UseParallelGC"
V1_SOURCES_BUT_KAFKA: Final = "avro,csv,json,orc,parquet,text"
"""Spark's default `spark.sql.sources.useV1SourceList` without `kafka`."""

JOB_CONF: Final = {
    # Python workers started by `dedup_spark.worker_daemon` (its docstring says why).
    "spark.python.daemon.module": "dedup_spark.worker_daemon",
    # Batch reads through the Kafka source's DataSource V2 reader, which makes each
    # record an internal row once. Spark's default, the V1 relation, turns every record
    # into an external Row and back (~13% of a 1M record audit's time,
    # bench/HISTORY.md, "Reconciliation audit").
    # Same options, same offsets and the same rows.
    "spark.sql.sources.useV1SourceList": V1_SOURCES_BUT_KAFKA,
    # The throughput collector: a batch job wants the most work per CPU, not short
    # pauses (G1, Java's default, used ~7% more CPU in a 1M record audit on 2 cores).
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.executor.extraJavaOptions": JVM_OPTIONS,
}
"""Settings every job's session carries, local or on Kubernetes."""


def writable_cwd() -> None:
    """Spark 4 makes each session's `artifacts` directory in the current directory; under
    a read-only root filesystem (the image's home, /home/dedup) that fails. A process
    whose current directory is not writable moves to its scratch directory (TMPDIR, else
    /tmp: a volume in the pods)."""
    if not os.access(os.getcwd(), os.W_OK):
        os.chdir(os.environ.get("TMPDIR") or tempfile.gettempdir())


def spark_session(app_name: str, settings: SparkSettings) -> SparkSession:
    """Start (or join) this process's SparkSession as `settings` say."""
    writable_cwd()
    # PySpark takes its Python workers' interpreter from here (also on executors).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not settings.on_kubernetes:
        conf = {"spark.driver.memory": settings.driver_memory, **JOB_CONF, **settings.conf}
        jars = kafka_jars(os.environ)
        try:
            return local_session(app_name, settings.master, jars, conf=conf)
        except Exception as exc:  # the JVM refusing
            raise SessionError(str(exc)) from None

    from pyspark.sql import SparkSession

    conf = kubernetes_conf(settings, os.environ)
    jars = kafka_jars(os.environ)
    os.environ.setdefault("SPARK_LOCAL_IP", conf["spark.driver.host"])
    conf.update(
        {
            "spark.jars": ",".join(str(j) for j in jars),
            "spark.driver.memory": settings.driver_memory,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            **JOB_CONF,
        }
    )
    conf.update(settings.conf)
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def local_session(
    app_name: str,
    master: str,
    jars: Sequence[Path],
    *,
    conf: Mapping[str, str] | None = None,
    work_dir: Path | None = None,
) -> SparkSession:
    """A `local[N]` SparkSession that can read and write Kafka (`format("kafka")`).

    Small shuffle partitions, no UI, loopback only (sets SPARK_LOCAL_IP if unset), a
    temporary warehouse and scratch directory (removed at exit unless `work_dir` is
    given), and Python workers running this interpreter (so UDFs can import the project).
    `conf` adds or overrides settings (`spark.driver.extraJavaOptions` is added to the
    scratch directory's option). One JVM per process: a session already running must
    have the same jars.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        have = active.sparkContext.getConf().get("spark.jars", "") or ""
        if not all(str(j) in have for j in jars):
            raise RuntimeError(
                "a SparkSession without the Kafka source jars is already running in this "
                "process; stop it first"
            )
        return active

    if work_dir is None:
        work_dir = Path(tempfile.mkdtemp(prefix="dedup-spark-"))
        atexit.register(shutil.rmtree, work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    settings: dict[str, str] = {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # Scratch space (spark.local.dir defaults to java.io.tmpdir in local mode).
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={work_dir / 'tmp'}",
    }
    extra = dict(conf or {})
    java_options = extra.pop("spark.driver.extraJavaOptions", "")  # added to, not replacing
    settings["spark.driver.extraJavaOptions"] += f" {java_options}".rstrip()
    settings.update(extra)
    (work_dir / "tmp").mkdir(exist_ok=True)
    # Loopback only, and no "hostname resolves to a loopback address" warning.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # PySpark takes the Python of its UDF workers from this variable, not from
    # spark.pyspark.python: without it they run a bare python3 that lacks the project.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
