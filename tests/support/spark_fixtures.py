"""pytest fixtures for the real Spark part (see local/dedup_local/spark.py).

`spark`: one local SparkSession per test session (local[2], the jobs' own settings, Kafka
source on spark.jars), started on first use and stopped at the end. When the Kafka
source jars are missing the fixture fails with the setup command to run
(`make setup-spark`); it never skips.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Imported here so test sessions without Spark tests do not pay for pyspark.
    from dedup_spark.session import SessionError, SparkSettings, spark_session

    try:  # the jobs' own session settings (dedup_spark.session.JOB_CONF)
        session = spark_session("dedup-tests", SparkSettings("local[2]"))
    except SessionError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield session
    finally:
        session.stop()
        # py4j says goodbye at INFO from its connections' __del__ at interpreter exit,
        # when pytest has closed the streams the log handlers write to.
        logging.getLogger("py4j").setLevel(logging.WARNING)
