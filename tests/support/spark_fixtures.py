"""pytest fixtures for the real Spark part (see local/dedup_local/spark.py).

`spark`: one local SparkSession per test session (local[2], Kafka source on spark.jars),
started on first use and stopped at the end. When the Kafka source jars are missing the
fixture fails with the setup command to run (`make setup-spark`); it never skips.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from dedup_local.paths import MissingArtifact

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Imported here so test sessions without Spark tests do not pay for pyspark.
    from dedup_local.spark import local_spark_session

    try:
        session = local_spark_session("dedup-tests")
    except MissingArtifact as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield session
    finally:
        session.stop()
        # py4j says goodbye at INFO from its connections' __del__ at interpreter exit,
        # when pytest has closed the streams the log handlers write to.
        logging.getLogger("py4j").setLevel(logging.WARNING)
