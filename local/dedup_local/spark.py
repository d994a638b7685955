"""A real local SparkSession with Spark's Kafka source on the classpath.

The Kafka source jars come from `scripts/setup-spark.sh` (cached under
`$DEDUP_CACHE/spark-kafka-$SPARK_VERSION/jars`) and go on `spark.jars`, so nothing is
downloaded when a session starts. One JVM per Python process: the first session's static
settings (jars, driver memory) stay for the life of the process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from dedup_local.paths import MissingArtifact, cache_dir, versions
from dedup_spark.session import local_session


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
    """A local SparkSession that can read and write Kafka, with the cached jars
    (`dedup_spark.session.local_session` says what it sets)."""
    return local_session(app_name, master, spark_kafka_jars(), conf=conf, work_dir=work_dir)
