"""A real local SparkSession with Spark's Kafka source on the classpath.

The Kafka source jars come from `scripts/setup-spark.sh` (cached under
`$DEDUP_CACHE/spark-kafka-$SPARK_VERSION/jars`) and go on `spark.jars`, so nothing is
downloaded when a session starts. The jobs (`dedup_spark.session`) know nothing of this
cache: they take the jars from the directory `DEDUP_SPARK_JARS` names, as in the image,
and the harness sets that variable (`use_cached_kafka_jars`; the test session, the
benches, and the pods the local cluster runs as processes). One JVM per Python process:
the first session's static settings (jars, driver memory) stay for the life of the
process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from dedup_local.paths import MissingArtifact, cache_dir, versions
from dedup_spark.session import JARS_ENV, local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def kafka_jars_dir() -> Path:
    """The directory of the jars `scripts/setup-spark.sh` fetched (spark-sql-kafka and
    what pyspark lacks); MissingArtifact, naming the setup command, until it ran."""
    spark_version = versions()["SPARK_VERSION"]
    home = cache_dir() / f"spark-kafka-{spark_version}"
    jars = (home / "jars").glob("*.jar")
    scala = versions()["SPARK_SCALA_VERSION"]
    wanted = f"spark-sql-kafka-0-10_{scala}-{spark_version}.jar"
    if not (home / ".stamp").is_file() or not any(j.name == wanted for j in jars):
        raise MissingArtifact(f"Spark Kafka source jars not found in {home}; run: make setup-spark")
    return home / "jars"


def spark_kafka_jars() -> list[Path]:
    """The cached jars (`kafka_jars_dir`)."""
    return sorted(kafka_jars_dir().glob("*.jar"))


def cached_kafka_jars_env() -> dict[str, str]:
    """`DEDUP_SPARK_JARS` naming the cached jars, as the image's ENV names its own; empty
    while the cache is not set up (a job then says the variable is missing)."""
    try:
        return {JARS_ENV: str(kafka_jars_dir())}
    except MissingArtifact:
        return {}


def use_cached_kafka_jars(environ: MutableMapping[str, str] = os.environ) -> None:
    """Point this process's `DEDUP_SPARK_JARS` (and so the jobs it starts) at the cached
    jars, unless it names a directory already."""
    for name, value in cached_kafka_jars_env().items():
        environ.setdefault(name, value)


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
