"""A real local SparkSession with Spark's Kafka source on the classpath.

The Kafka source jars come from `scripts/setup-spark.sh` (cached under
`$DEDUP_CACHE/spark-kafka-$SPARK_VERSION/jars`) and go on `spark.jars`, so nothing is
downloaded when a session starts. One JVM per Python process: the first session's static
settings (jars, driver memory) stay for the life of the process.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from dedup_local.paths import MissingArtifact, cache_dir, versions


def spark_kafka_jars() -> list[Path]:
    """The jars `scripts/setup-spark.sh` fetched (spark-sql-kafka and what pyspark lacks)."""
    spark_version = versions()["SPARK_VERSION"]
    home = cache_dir() / f"spark-kafka-{spark_version}"
    jars = sorted((home / "jars").glob("*.jar"))
    scala = versions()["SPARK_SCALA_VERSION"]
    wanted = f"spark-sql-kafka-0-10_{scala}-{spark_version}.jar"
    if not (home / ".stamp").is_file() or not any(j.name == wanted for j in jars):
        raise MissingArtifact(f"Spark Kafka source jars not found in {home}; run: make setup-spark")
    return jars


def local_spark_session(
    app_name: str = "dedup-local",
    master: str = "local[2]",
    *,
    conf: Mapping[str, str] | None = None,
    work_dir: Path | None = None,
) -> SparkSession:
    """A local SparkSession that can read and write Kafka (`format("kafka")`).

    Small shuffle partitions, no UI, loopback only (sets SPARK_LOCAL_IP if unset), a
    temporary warehouse and scratch directory (removed at exit unless `work_dir` is given), and Python workers running
    this interpreter (so UDFs can import the project). `conf` adds or overrides settings
    (`spark.driver.extraJavaOptions` is added to the scratch directory's option).
    """
    jars = spark_kafka_jars()
    active = SparkSession.getActiveSession()
    if active is not None:
        have = active.sparkContext.getConf().get("spark.jars", "") or ""
        if not all(str(j) in have for j in jars):
            raise RuntimeError(
                "a SparkSession without the Kafka source jars is already running in this "
                "process; stop it before calling local_spark_session()"
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
