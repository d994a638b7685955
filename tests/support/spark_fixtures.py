"""pytest fixtures for the real Spark part (see local/dedup_local/spark.py).

`spark`: one local SparkSession per test session (local[2], the jobs' own settings, Kafka
source on spark.jars), started on first use and stopped at the end. When the Kafka
source jars are missing the fixture fails with the setup command to run
(`make setup-spark`); it never skips.

Loading this plugin points `DEDUP_SPARK_JARS` at the cached jars (as the image's ENV
does), for the sessions the tests start and the jobs (`dedup-audit`,
`dedup-backfill`) they run as processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from dedup_local.paths import MissingArtifact
from dedup_local.spark import spark_kafka_jars, use_cached_kafka_jars
from support.session_parts import start_session_part

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


use_cached_kafka_jars()


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    # Imported here so test sessions without Spark tests do not pay for pyspark.
    from dedup_spark.session import SparkSettings, spark_session

    try:
        spark_kafka_jars()  # missing: the setup command to run
    except MissingArtifact as exc:
        pytest.fail(str(exc), pytrace=False)

    def start() -> SparkSession:  # the jobs' own session settings (dedup_spark.session.JOB_CONF)
        return spark_session("dedup-tests", SparkSettings("local[2]"))

    session = start_session_part(request, "the session's SparkSession", start)
    try:
        yield session
    finally:
        session.stop()
        # py4j says goodbye at INFO from its connections' __del__ at interpreter exit,
        # when pytest has closed the streams the log handlers write to.
        logging.getLogger("py4j").setLevel(logging.WARNING)
